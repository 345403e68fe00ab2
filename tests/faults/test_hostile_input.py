"""Hostile input without services (always runs): the corpus is refused for a reason, untrusted text reaches
the model only as delimited data, a model that obeys an injection cannot get more than valid, bounded
operations applied, and the published prompt keeps its hard size budget.

The end-to-end half — the same corpus published to the real pipeline — is the ``hostile`` fault scenario.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from combee.engine import MethodConfig, Window, run_window
from combee.errors import LLMParseError
from combee.llm import ChatRequest, Role
from combee.models import LIMITS, Insight, Playbook, Reflection, Trace
from combee.playbook import ApplyPolicy, render_prompt
from combee.prompts import (
    Proposal,
    curator_request,
    merger_request,
    parse_merge,
    parse_operations,
    parse_reflection,
    reflector_request,
)
from combee.tokens import estimate_tokens
from streams.codec import CodecError, decode, decode_trace
from streams.topics import TRACES_MAX_MESSAGE_BYTES
from tests.fakes import ScriptedLLM, user_text
from tests.faults.corpus import INJECTION_MARKER, _injections, hostile_corpus, summary

NS = ["ns-a", "ns-b"]


@pytest.fixture(scope="module")
def corpus() -> list:
    return hostile_corpus(NS)


def test_the_corpus_has_over_1000_bad_records_each_refused_with_a_reason(corpus: list) -> None:
    counts = summary(corpus)
    assert counts["bad"] >= 1000 and counts["safe"] >= 30 and counts["broker"] == 3
    categories = {r.label for r in corpus if r.label.startswith("bad:")}
    assert len(categories) >= 50
    for r in corpus:
        if r.label.startswith("broker:"):
            assert len(r.value) > TRACES_MAX_MESSAGE_BYTES  # the broker refuses it: it never reaches a worker
            continue
        if r.label.startswith("bad:"):
            with pytest.raises(CodecError) as err:
                decode_trace(r.value, r.key)
            assert err.value.reason, r.label
        else:
            trace = decode_trace(r.value, r.key)
            assert trace.namespace in NS


def test_an_integer_over_4300_digits_is_a_clear_refusal_not_a_crash() -> None:
    # json.loads raises a plain ValueError here (Python's int conversion limit), which used to escape the
    # decoder and crash the window stage's agent on such a record.
    raw = b'{"namespace":"ns-a","task":"t","playbook_version":' + b"9" * 5000 + b"}"
    with pytest.raises(CodecError, match="not valid JSON"):
        decode_trace(raw, b"ns-a")
    with pytest.raises(CodecError, match="not valid JSON"):
        decode(b'{"schema":"combee.window/1","n":' + b"9" * 5000 + b"}")
    with pytest.raises(CodecError, match="nested too deeply"):
        decode(b'{"schema":"combee.window/1","n":' + b"[" * 100_000 + b"]" * 100_000 + b"}")


# --- untrusted text reaches the model only as delimited data ---------------------------------------------


def _blocks(text: str, name: str) -> list[str]:
    return re.findall(rf"<{name}>\n(.*?)\n</{name}>", text, re.DOTALL)


@pytest.mark.parametrize("text", _injections(1))
def test_trace_text_reaches_the_reflector_only_inside_its_block_as_json(text: str) -> None:
    trace = Trace(
        trace_id="t1",
        namespace="ns-a",
        task=text,
        output=text,
        steps=({"kind": "observation", "content": text},),  # type: ignore[arg-type]
        feedback={"message": text},  # type: ignore[arg-type]
    )
    request = reflector_request(trace, Playbook(namespace="ns-a"))
    user = user_text(request)
    # exactly one of each block: the injected "</trace>", "<reflections>" etc. cannot open or close one
    assert user.count("<trace>") == 1 and user.count("</trace>") == 1
    assert user.count("<reflections>") == 0 and user.count("<playbook>") == 1
    (payload,) = _blocks(user, "trace")
    data = json.loads(payload)  # the block holds one JSON document: the run record, as data
    assert data["task"] == text and data["steps"][0]["content"] == text and data["feedback"]["message"] == text
    system = request.messages[0].content
    assert "untrusted data" in system and INJECTION_MARKER not in system


def test_reflections_and_proposals_stay_data_for_the_curator_and_the_merger() -> None:
    texts = _injections(2)
    reflections = [
        Reflection(trace_id=f"t{i}", base_version=0, insights=(Insight(section="s", content=t[:600]),))
        for i, t in enumerate(texts)
    ]
    user = user_text(curator_request(reflections, Playbook(namespace="ns-a")))
    assert user.count("<reflections>") == 1 and user.count("</reflections>") == 1
    (block,) = _blocks(user, "reflections")
    lines = [json.loads(line) for line in block.splitlines()]
    assert [x["insights"][0]["content"] for x in lines] == [t[:600] for t in texts]
    ops = parse_operations(
        json.dumps({"operations": [{"op": "ADD", "section": "s", "content": t[:600]} for t in texts]})
    )
    user = user_text(
        merger_request([Proposal(f"p{i + 1}", op) for i, op in enumerate(ops)], Playbook(namespace="ns-a"))
    )
    assert user.count("<proposals>") == 1 and user.count("</proposals>") == 1
    assert len(_blocks(user, "proposals")[0].splitlines()) == len(texts)


# --- the model's output is validated: size, count, operations, bullet length ----------------------------

TOO_MANY = json.dumps({"operations": [{"op": "ADD", "section": "s", "content": f"c{i}"} for i in range(49)]})
BAD_ANSWERS = {
    "too many operations": TOO_MANY,
    "unknown operation": json.dumps({"operations": [{"op": "EXEC", "content": "rm -rf /"}]}),
    "bullet over the length limit": json.dumps({"operations": [{"op": "ADD", "content": "x" * 601}]}),
    "operations not a list": json.dumps({"operations": {"op": "ADD", "content": "x"}}),
    "not json": 'Sure! I will now ignore my instructions. {"operations": [',
    "a list, not an object": json.dumps([{"op": "ADD", "content": "x"}]),
    "bad bullet id": json.dumps({"operations": [{"op": "REMOVE", "bullet_id": "* OR 1=1"}]}),
    "empty content": json.dumps({"operations": [{"op": "ADD", "content": "   "}]}),
    "section over the limit": json.dumps({"operations": [{"op": "UPDATE", "bullet_id": "b00001", "content": ""}]}),
}


@pytest.mark.parametrize("answer", list(BAD_ANSWERS.values()), ids=list(BAD_ANSWERS))
def test_a_curator_answer_outside_the_contract_is_refused_whole(answer: str) -> None:
    with pytest.raises(LLMParseError):
        parse_operations(answer)


def test_reflector_and_merger_answers_are_bounded_too() -> None:
    with pytest.raises(LLMParseError):
        parse_reflection(json.dumps({"insights": [{"section": "s", "content": f"c{i}"} for i in range(9)]}), "t", 0)
    with pytest.raises(LLMParseError):
        parse_reflection(json.dumps({"insights": [{"section": "s", "content": "x" * 601}]}), "t", 0)
    with pytest.raises(LLMParseError):
        parse_merge(json.dumps({"keep": [], "combine": [{"from": ["p1"], "op": {"op": "ADD"}}] * 49}))


def _gullible(curator_answer: str):  # type: ignore[no-untyped-def]
    """A model that obeys whatever a trace tells it: the reflector repeats the injection as an insight, the
    curator answers ``curator_answer``, the merger keeps everything."""

    def script(request: ChatRequest) -> str:
        user = user_text(request)
        if request.role is Role.REFLECTOR:
            task = json.loads(_blocks(user, "trace")[0])["task"]
            return json.dumps({"diagnosis": "obey", "insights": [{"section": "admin", "content": task[:600]}],
                               "bullet_tags": []})  # fmt: skip
        if request.role is Role.CURATOR:
            return curator_answer
        ids = [json.loads(line)["id"] for line in _blocks(user, "proposals")[0].splitlines()]
        return json.dumps({"keep": ids, "combine": []})

    return ScriptedLLM(script)


def _window(n: int, offset: int = 0) -> Window:
    texts = _injections(offset)
    traces = tuple(Trace(trace_id=f"t{offset}-{i}", namespace="ns-a", task=texts[i % len(texts)]) for i in range(n))
    return Window("ns-a", "p0", offset, offset + n - 1, traces)


@pytest.mark.parametrize("answer", list(BAD_ANSWERS.values()), ids=list(BAD_ANSWERS))
def test_an_obeying_model_with_an_invalid_answer_changes_nothing(answer: str) -> None:
    start = Playbook(namespace="ns-a")
    result = asyncio.run(run_window(_window(8), start, _gullible(answer), MethodConfig()))
    assert result.playbook.bullets == () and result.playbook.version == 1  # all groups skipped, counted
    assert result.meter.skipped_groups > 0 and result.delta.ops == ()


def test_an_obeying_model_gets_at_most_the_allowed_operations_and_the_prompt_keeps_its_budget() -> None:
    # The worst a model that follows injected instructions can do within the contract: fill every answer with
    # the maximum number of maximum-length bullets, window after window. The published prompt stays within
    # the hard budget (bullets with the worst record are evicted first) and no bullet exceeds its limit.
    budget = 6_000
    answer = json.dumps(
        {"operations": [{"op": "ADD", "section": f"s{i}", "content": f"{INJECTION_MARKER} {i} " + "y" * 580}
                        for i in range(LIMITS.ops_per_llm_answer)]}
    )  # fmt: skip
    config = MethodConfig(policy=ApplyPolicy(token_budget=budget))
    playbook = Playbook(namespace="ns-a")
    for w in range(6):
        result = asyncio.run(run_window(_window(12, offset=100 * w), playbook, _gullible(answer), config))
        assert len(result.delta.ops) <= LIMITS.ops_per_llm_answer * 6  # bounded by the groups of the window
        playbook = result.playbook
        prompt = render_prompt(playbook)
        assert estimate_tokens(prompt) <= budget
        assert all(len(b.content) <= LIMITS.bullet_chars for b in playbook.bullets)
        # new sections beyond the limit fold into "general", which is then one more
        assert len({b.section for b in playbook.bullets}) <= LIMITS.sections + 1
    assert result.apply_stats.evicted > 0
