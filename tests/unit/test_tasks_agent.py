"""Finance data rows, answering with a playbook, and the traces `combee learn` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from combee.errors import ConfigError
from combee.llm import ChatRequest, Role
from combee.models import LIMITS, Playbook
from combee.tasks.agent import answer_all, clip, to_trace
from combee.tasks.data import Question, load_questions, pick
from combee.tracefile import parse_trace
from tests.fakes import ScriptedLLM
from tests.support import REAL_MODEL_TRACES, real_model_questions

ROWS = [
    {"context": 'Use formula ROI. Question: "Gain 150, cost 100?". Answer:', "target": "50.0"},
    {"context": 'Use formula Margin. Question: "Income 45, revenue 300?". Answer:', "target": "15.0"},
    {"context": 'Use formula DDM. Question: "D1 4, r 13%, g 3%?". Answer:', "target": "40.0"},
]


def reply(answer: str, reasoning: str = "worked it out") -> str:
    return json.dumps({"reasoning": reasoning, "final_answer": answer})


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "formula_tiny.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    return path


def test_load_questions_names_rows_by_file_and_line(data_file: Path) -> None:
    qs = load_questions(data_file)
    assert [q.id for q in qs] == ["formula_tiny:1", "formula_tiny:2", "formula_tiny:3"]
    assert qs[1].target == "15.0"


def test_load_questions_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found") as missing:
        load_questions(tmp_path / "missing.jsonl")
    assert "github.com/ace-agent/ace" in str(missing.value) and "\n" not in str(missing.value)  # where to get it
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"context": "x"}\n')
    with pytest.raises(ConfigError, match=r"bad\.jsonl:1"):
        load_questions(bad)


def test_the_rows_the_real_model_tests_answer_are_carried_with_the_tests() -> None:
    qs = real_model_questions()  # what their fixture loads before it starts a model, from tests/data/finance
    assert len({q.id for q in qs}) == REAL_MODEL_TRACES
    assert all(q.context.startswith("Use formula") and float(q.target) == float(q.target) for q in qs)


def test_pick_is_seeded_distinct_and_bounded(data_file: Path) -> None:
    qs = load_questions(data_file)
    assert pick(qs, 2, 7, "train") == pick(qs, 2, 7, "train")
    assert len({q.id for q in pick(qs, 3, 7, "train")}) == 3
    with pytest.raises(ConfigError, match="holds 3"):
        pick(qs, 4, 0, "train")


async def test_answers_use_the_playbook_as_system_prompt_and_become_learnable_traces(data_file: Path) -> None:
    qs = load_questions(data_file)
    answers = {"50.0": reply("50"), "15.0": reply("15%"), "40.0": "no json here"}

    def script(request: ChatRequest) -> str:
        user = "\n".join(m.content for m in request.messages if m.role == "user")
        q = next(q for q in qs if json.dumps(q.context)[1:20] in user)
        return answers[q.target]

    llm = ScriptedLLM(script)
    playbook = Playbook(namespace="formula")
    seen: list[tuple[int, int]] = []
    attempts = await answer_all(llm, "formula", qs, playbook, concurrency=2, progress=lambda d, t: seen.append((d, t)))
    assert [a.question.id for a in attempts] == [q.id for q in qs]
    assert seen[-1] == (3, 3)
    assert all(r.role is Role.GENERATOR for r in llm.requests)
    assert llm.max_in_flight <= 2
    assert [a.grade.success for a in attempts] == [True, True, False]
    assert attempts[2].extracted.how == "none"

    traces = [to_trace(a, namespace="formula") for a in attempts]
    for trace in traces:  # exactly what `combee learn --traces` reads
        assert parse_trace(trace.model_dump_json(exclude_none=True)) == trace
    ok, wrong = traces[1], traces[2]
    assert ok.task == qs[1].context
    assert ok.feedback.success is True and ok.feedback.ground_truth == "15.0"
    assert "Correct" in (ok.feedback.message or "") and "'15%'" in (ok.feedback.message or "")
    assert ok.output == "Reasoning: worked it out\nFinal answer: 15%"  # what the reflector reads
    assert wrong.feedback.success is False
    assert "no final answer" in (wrong.feedback.message or "") and "'40.0'" in (wrong.feedback.message or "")
    assert wrong.output == "no json here"
    assert ok.metadata["question_id"] == "formula_tiny:2"


def test_long_contexts_are_clipped_to_the_trace_limit_keeping_head_and_tail() -> None:
    text = "HEAD" + "x" * 20_000 + "TAIL"
    out = clip(text, LIMITS.task_chars)
    assert len(out) <= LIMITS.task_chars
    assert out.startswith("HEAD") and out.endswith("TAIL") and "characters omitted" in out
    assert clip("short", 100) == "short"


def test_a_finer_sized_question_still_makes_a_valid_trace() -> None:
    from combee.answers import extract_answer
    from combee.llm import ChatResponse
    from combee.tasks.agent import Attempt, grade

    q = Question("finer_x:1", "options: " + ",".join(["Tag"] * 3000) + " 1. What is the tag?", "a,b,c,d")
    raw = reply("a,b,x,d")
    found = extract_answer(raw)
    attempt = Attempt(q, raw, found, grade("finer", found.answer, q.target), ChatResponse(text=raw))
    trace = to_trace(attempt, namespace="finer")
    assert len(trace.task) <= LIMITS.task_chars and trace.task.endswith("What is the tag?")
    assert trace.feedback.score == 0.75 and trace.feedback.success is False
    assert "3 of 4 labels right" in (trace.feedback.message or "")


async def test_requests_are_sized_to_the_context_and_a_question_that_cannot_fit_is_not_sent() -> None:
    class Small(ScriptedLLM):
        async def context_tokens(self, role: Role) -> int | None:
            return 2048

    llm = Small(lambda request: reply("1"))
    qs = [Question("q:1", "short question", "1.0"), Question("q:2", "long " * 4000, "1.0")]
    attempts = await answer_all(llm, "formula", qs, Playbook(namespace="formula"), concurrency=2)
    assert [a.extracted.how for a in attempts] == ["parsed", "too_long"]
    assert len(llm.requests) == 1
    assert attempts[1].grade.success is False
    assert to_trace(attempts[1], namespace="formula").feedback.success is False
