import json
import math

import pytest

from combee.engine import Method, MethodConfig, Window, run_window
from combee.errors import LLMUnavailable
from combee.learner import LearnConfig, learn
from combee.llm import REFUSED_BY_SERVER, ChatRequest, ChatResponse, Role
from combee.models import Playbook, Trace
from tests.fakes import ScriptedLLM, block_lines, echo_script


def traces(n, ns="ns"):
    return tuple(Trace(trace_id=f"t{i}", namespace=ns, task=f"task number {i}") for i in range(n))


def window(n, ns="ns"):
    return Window(ns, "p0", 0, n - 1, traces(n, ns))


@pytest.mark.parametrize("n", [1, 7, 50, 100, 144, 300])
async def test_combee_call_counts_match_the_plan(n):
    llm = ScriptedLLM(echo_script)
    cfg = MethodConfig(shuffle_key="none")  # the paper's reduce
    result = await run_window(window(n), Playbook(namespace="ns"), llm, cfg)
    plan = cfg.plan(n, window(n).id)
    assert len(llm.calls(Role.REFLECTOR)) == n
    assert len(llm.calls(Role.CURATOR)) == plan.groups.k
    assert len(llm.calls(Role.MERGER)) == plan.tree.merge_calls
    if n <= 144:
        assert plan.groups.k in (math.isqrt(n), math.isqrt(n) + 1)
        assert plan.tree.merge_calls == (1 if plan.groups.k > 1 else 0)
    # every reflection reached a curator, at most max_group_items per call, and nothing was lost
    assert sorted({t["task"] for r in llm.calls(Role.REFLECTOR) for t in block_lines(r, "trace")}) == sorted(
        t.task for t in window(n).traces
    )
    assert all(len(block_lines(r, "reflections")) <= 24 for r in llm.calls(Role.CURATOR))
    assert len(result.playbook.bullets) == n  # the echo model keeps every lesson; dedup merges the copies
    assert result.meter.calls == len(llm.requests)


async def test_merge_inputs_respect_fan_in_for_a_large_window():
    llm = ScriptedLLM(echo_script)
    cfg = MethodConfig(max_fan_in=6, shuffle_key="none")
    await run_window(window(600), Playbook(namespace="ns"), llm, cfg)
    sizes = [len(block_lines(r, "proposals")) for r in llm.calls(Role.MERGER)]
    plan = cfg.plan(600, window(600).id)
    assert len(sizes) == plan.tree.merge_calls and plan.tree.depth >= 3


async def test_naive_and_sequential_make_one_curator_call():
    for method, n in ((Method.NAIVE, 40), (Method.SEQUENTIAL, 1)):
        llm = ScriptedLLM(echo_script)
        result = await run_window(window(n), Playbook(namespace="ns"), llm, MethodConfig(method=method))
        assert len(llm.calls(Role.CURATOR)) == 1 and not llm.calls(Role.MERGER)
        assert len(block_lines(llm.calls(Role.CURATOR)[0], "reflections")) == n
        assert len(result.playbook.bullets) == n


async def test_same_input_same_answers_same_playbook():
    a = await run_window(window(60), Playbook(namespace="ns"), ScriptedLLM(echo_script), MethodConfig())
    b = await run_window(window(60), Playbook(namespace="ns"), ScriptedLLM(echo_script), MethodConfig())
    assert a.playbook == b.playbook and a.delta == b.delta


async def test_reflections_run_concurrently_against_a_frozen_playbook():
    llm = ScriptedLLM(echo_script, latency={Role.REFLECTOR: 0.02})
    pb = Playbook(namespace="ns")
    await run_window(window(30), pb, llm, MethodConfig())
    assert llm.max_in_flight >= 30
    versions = {r.messages[1].content.split("(Playbook version ")[1].split(".)")[0] for r in llm.calls(Role.REFLECTOR)}
    assert versions == {"0"}


def flaky(bad_roles: dict[Role, int]):
    """A model whose first N answers per role are malformed."""
    seen: dict[Role, int] = {}

    def script(req: ChatRequest) -> str:
        seen[req.role] = seen.get(req.role, 0) + 1
        if seen[req.role] <= bad_roles.get(req.role, 0):
            return '{"operations": [{"op": "ADD", "section": "s", "content": ""}]}'  # invalid: empty content
        return echo_script(req)

    return script


async def test_malformed_answers_are_retried():
    llm = ScriptedLLM(flaky({Role.CURATOR: 2}))
    result = await run_window(window(1), Playbook(namespace="ns"), llm, MethodConfig(method=Method.SEQUENTIAL))
    assert len(llm.calls(Role.CURATOR)) == 3 and len(result.playbook.bullets) == 1
    assert result.meter.roles["curator"].parse_failures == 2 and result.meter.skipped_groups == 0
    seeds = [r.seed for r in llm.calls(Role.CURATOR)]
    assert seeds == [None, 1, 2]  # each retry is a distinct request (not served from a cache)


async def test_group_skipped_after_retries_and_nothing_half_applied():
    llm = ScriptedLLM(flaky({Role.CURATOR: 99}))
    result = await run_window(window(9), Playbook(namespace="ns"), llm, MethodConfig(parse_attempts=2))
    assert result.meter.skipped_groups == 3  # k = 3 groups, all skipped
    assert result.playbook.bullets == () and result.playbook.version == 1


async def test_bad_merge_answer_passes_children_through():
    def script(req):
        if req.role == Role.MERGER:
            return "not json"
        return echo_script(req)

    cfg = MethodConfig(shuffle_key="none")
    result = await run_window(window(16), Playbook(namespace="ns"), ScriptedLLM(script), cfg)
    assert result.meter.merge_fallbacks == 1
    assert len(result.playbook.bullets) == 16


async def test_unreachable_llm_raises():
    class Down:
        async def complete(self, request):
            raise LLMUnavailable("connection refused")

    with pytest.raises(LLMUnavailable):
        await run_window(window(4), Playbook(namespace="ns"), Down(), MethodConfig())


async def test_critical_path_uses_service_times():
    llm = ScriptedLLM(echo_script, service_time=1.0)
    result = await run_window(window(16), Playbook(namespace="ns"), llm, MethodConfig(shuffle_key="none"))
    assert result.critical_path_s == pytest.approx(3.0)  # reflect, group, merge
    united = await run_window(window(16), Playbook(namespace="ns"), ScriptedLLM(echo_script, service_time=1.0),
                              MethodConfig())  # fmt: skip
    assert united.critical_path_s == pytest.approx(2.0)  # the default shape: reflect, group; no merge


def test_the_default_reduce_is_the_keyed_union() -> None:
    from combee.plan import DEFAULT_SHUFFLE_KEY
    from combee.settings import Settings
    from combee.wiring import method_config

    assert MethodConfig().shuffle_key == DEFAULT_SHUFFLE_KEY == "section-union"
    assert method_config(Settings(), "combee").shuffle_key == DEFAULT_SHUFFLE_KEY  # workers and combee learn
    assert method_config(Settings(reduce_shape="none"), "combee").shuffle_key == "none"


def test_the_duplication_factor_is_the_shapes_own_unless_set() -> None:
    from combee.settings import Settings
    from combee.wiring import method_config

    # section-union merges nothing, so it does not duplicate; the shapes that merge keep the paper's 2
    assert method_config(Settings(), "combee").p == 1
    assert method_config(Settings(reduce_shape="section"), "combee").p == 2
    assert method_config(Settings(reduce_shape="none"), "combee").p == 2
    assert method_config(Settings(p=3), "combee").p == 3
    assert method_config(Settings(p=2, reduce_shape="section-union"), "combee").p == 2
    # the same resolution where a config is built by hand, as the offline replica of a stream run is
    assert MethodConfig().p == 1 and MethodConfig(shuffle_key="none").p == 2 and MethodConfig(p=3).p == 3
    with pytest.raises(ValueError):
        MethodConfig(p=-1)
    # combee task's method variants run each shape at its own p unless COMBEE_P is set
    from combee.cli.task import _learn_configs

    configs = _learn_configs(Settings(), ["combee", "combee:none", "combee:section"], 32)
    assert [configs[m].method.p for m in ("combee", "combee:none", "combee:section")] == [1, 2, 2]
    assert _learn_configs(Settings(p=3), ["combee:none"], 32)["combee:none"].method.p == 3


async def test_learn_epochs_and_windows():
    llm = ScriptedLLM(echo_script)
    res = await learn(traces(25), llm, LearnConfig(method=MethodConfig(), batch_size=10, epochs=2))
    assert res.batch_sizes == [10, 10, 5, 10, 10, 5]
    assert [it.window_id for it in res.iterations][:3] == ["ns/file:e0/0-9", "ns/file:e0/10-19", "ns/file:e0/20-24"]
    assert res.iterations[3].window_id == "ns/file:e1/0-9"
    assert res.playbook.version == 6 and len(res.playbook.bullets) == 25


async def test_learn_auto_profiles_candidates_as_real_steps():
    from combee.controller import BatchSizeController

    llm = ScriptedLLM(echo_script, latency={Role.REFLECTOR: 0.01, Role.CURATOR: 0.01, Role.MERGER: 0.01})
    ctl = BatchSizeController(candidates=(2, 4, 8), bs_min=2, bs_max=16)
    res = await learn(traces(40), llm, LearnConfig(batch_size="auto", controller=ctl))
    assert res.batch_sizes[:3] == [2, 4, 8] and all(it.trial for it in res.iterations[:3])
    assert res.decision is not None and res.decision.fit is not None
    rest = res.batch_sizes[3:]
    assert all(b == res.decision.batch_size for b in rest[:-1]) and 0 < rest[-1] <= res.decision.batch_size
    assert sum(res.batch_sizes) == 40 and len(res.playbook.bullets) == 40


async def test_learn_rejects_mixed_namespaces():
    from combee.errors import ConfigError

    with pytest.raises(ConfigError, match="several namespaces"):
        await learn(traces(2, "a") + traces(2, "b"), ScriptedLLM(echo_script), LearnConfig())


def test_trace_json_roundtrip():
    t = traces(1)[0]
    assert Trace.model_validate(json.loads(t.model_dump_json())) == t


# --- repair turns, salvage and sizing -------------------------------------------------------------------


def _good_reflection(request: ChatRequest) -> str:
    return json.dumps({"diagnosis": "d", "insights": [{"section": "s", "content": "a lesson"}]})


async def test_a_rejected_answer_is_re_asked_with_the_error_and_a_higher_temperature():
    answers = iter(["{}", '{"insights": [{"section": "s", "content": "   "}]}'])

    def script(request: ChatRequest) -> str:
        if request.role == Role.REFLECTOR:
            return next(answers, None) or _good_reflection(request)
        return echo_script(request)

    llm = ScriptedLLM(script)
    result = await run_window(window(1), Playbook(namespace="ns"), llm, MethodConfig(method=Method.SEQUENTIAL))
    first, second, third = llm.calls(Role.REFLECTOR)
    assert [r.temperature for r in (first, second, third)] == [0.0, 0.3, 0.7]
    assert [r.seed for r in (first, second, third)] == [None, 1, 2]
    assert [m.role for m in second.messages] == ["system", "user", "assistant", "user"]
    assert second.messages[2].content == "{}" and "missing required key 'insights'" in second.messages[3].content
    assert "no usable insight" in third.messages[3].content
    stats = result.meter.roles["reflector"]
    assert (stats.calls, stats.parse_failures, stats.repairs, stats.repaired, stats.gave_up) == (3, 2, 2, 1, 0)
    assert stats.failure_kinds == {"missing_key": 1, "no_valid_items": 1}
    assert len(result.playbook.bullets) == 1


class RefusesFirstReflection(ScriptedLLM):
    """The first reflector answer is one the server would not return (llama.cpp's HTTP 500 on a fenced answer)."""

    async def complete(self, request: ChatRequest) -> ChatResponse:
        if request.role == Role.REFLECTOR and not self.calls(Role.REFLECTOR):
            self.requests.append(request)
            return ChatResponse(text="", finish_reason=REFUSED_BY_SERVER)
        return await super().complete(request)


async def test_an_answer_the_server_refused_is_re_asked_differently_with_what_went_wrong():
    llm = RefusesFirstReflection(echo_script)
    result = await run_window(window(1), Playbook(namespace="ns"), llm, MethodConfig(method=Method.SEQUENTIAL))
    first, second = llm.calls(Role.REFLECTOR)
    assert (first.temperature, second.temperature) == (0.0, 0.3)  # not the identical request again
    assert [m.role for m in second.messages] == ["system", "user", "user"]  # nothing to echo
    assert "bare JSON object" in second.messages[2].content
    stats = result.meter.roles["reflector"]
    assert (stats.calls, stats.parse_failures, stats.repaired, stats.gave_up) == (2, 1, 1, 0)
    assert stats.failure_kinds == {"refused_by_server": 1}
    assert len(result.playbook.bullets) == 1


async def test_a_call_whose_every_answer_fails_is_counted_as_given_up():
    llm = ScriptedLLM(lambda r: "no json here" if r.role == Role.REFLECTOR else echo_script(r))
    result = await run_window(window(2), Playbook(namespace="ns"), llm, MethodConfig(parse_attempts=2))
    stats = result.meter.roles["reflector"]
    assert (stats.calls, stats.parse_failures, stats.repairs, stats.gave_up) == (4, 4, 2, 2)
    assert result.meter.skipped_traces == 2 and stats.failure_kinds == {"not_json": 4}


async def test_a_curator_answer_with_some_invalid_operations_keeps_the_rest_and_counts_them():
    def script(request: ChatRequest) -> str:
        if request.role == Role.CURATOR:
            ops = [{"op": "ADD", "section": "s", "content": "kept"}, {"op": "REMOVE", "bullet_id": "b00042"}]
            return json.dumps({"operations": ops})
        return echo_script(request)

    llm = ScriptedLLM(script)
    result = await run_window(window(1), Playbook(namespace="ns"), llm, MethodConfig(method=Method.SEQUENTIAL))
    stats = result.meter.roles["curator"]
    assert (stats.calls, stats.salvaged, stats.invalid_items, stats.parse_failures) == (1, 1, 1, 0)
    assert [b.content for b in result.playbook.bullets] == ["kept"]


class SizedLLM(ScriptedLLM):
    async def context_tokens(self, role: Role) -> int:
        return 4096


async def test_requests_are_sized_to_the_context_the_llm_reports():
    llm = SizedLLM(echo_script)
    await run_window(window(4), Playbook(namespace="ns"), llm, MethodConfig())
    from combee.sizing import MARGIN_TOKENS, prompt_tokens

    for r in llm.requests:
        assert prompt_tokens(m.content for m in r.messages) + r.max_tokens + MARGIN_TOKENS <= 4096
    assert {r.max_tokens for r in llm.calls(Role.CURATOR)} != {4000}


def _two_sections(request: ChatRequest) -> str:
    """echo_script, but trace i's insight is filed under "strategies" (even i) or "verification" (odd i)."""
    if request.role == Role.REFLECTOR:
        trace = block_lines(request, "trace")[0]
        section = ("strategies", "verification")[int(trace["task"].split()[-1]) % 2]
        insight = {"section": section, "content": f"lesson: {trace['task']}"}
        return json.dumps({"diagnosis": "ok", "insights": [insight], "bullet_tags": []})
    return echo_script(request)


async def test_a_keyed_reduce_sends_each_section_to_its_own_calls_and_unites_them() -> None:
    llm = ScriptedLLM(_two_sections)
    config = MethodConfig(shuffle_key="section-union", max_group_items=8)
    result = await run_window(window(40), Playbook(namespace="ns"), llm, config)
    assert result.keyed is not None and result.keyed.keys == ("strategies", "verification")
    curated = [
        {i["section"] for r in block_lines(c, "reflections") for i in r["insights"]} for c in llm.calls(Role.CURATOR)
    ]
    assert len(curated) == result.keyed.curator_calls > 2 and all(len(sections) == 1 for sections in curated)
    assert {s for sections in curated for s in sections} == {"strategies", "verification"}
    assert llm.calls(Role.MERGER) == []  # united, never merged
    added = sorted(op.content for op in result.delta.ops)
    assert added == sorted(f"lesson: task number {i}" for i in range(40))  # every call's operations, each once


async def test_harmful_tags_of_one_producers_traces_are_held_offline_as_in_the_stream() -> None:
    from combee.models import Bullet, Provenance

    made = Provenance(window_id="w0", version=1)
    seeded = Bullet(id="b00001", section="s", content="Use gross margin.", helpful=3, created=made, updated=made)
    pb = Playbook(namespace="ns", version=1, bullets=(seeded,), next_id=2)

    def tagging(request: ChatRequest) -> str:
        if request.role == Role.REFLECTOR:
            return json.dumps({"diagnosis": "d", "insights": [],
                               "bullet_tags": [{"bullet_id": "b00001", "tag": "harmful"}]})  # fmt: skip
        return echo_script(request)

    def taught_by(*producers: str) -> Window:
        ts = tuple(Trace(trace_id=f"t{i}", namespace="ns", task=f"task {i}", metadata={"producer": p})
                   for i, p in enumerate(producers))  # fmt: skip
        return Window("ns", "p0", 0, len(ts) - 1, ts)

    cfg = MethodConfig(method=Method.NAIVE)
    one = await run_window(taught_by("mallory", "mallory"), pb, ScriptedLLM(tagging), cfg)
    assert one.playbook.bullet("b00001").harmful == 0  # type: ignore[union-attr]
    assert one.meter.held == {"harmful_tag": 2}
    two = await run_window(taught_by("mallory", "alice"), pb, ScriptedLLM(tagging), cfg)
    assert two.playbook.bullet("b00001").harmful == 2  # type: ignore[union-attr]


async def test_offline_a_change_counts_only_the_traces_whose_lessons_state_it_as_in_the_stream() -> None:
    from combee.corroborate import Corroboration
    from combee.models import Bullet, Provenance

    made = Provenance(window_id="w0", version=1)
    seeded = Bullet(id="b00001", section="s", content="Use gross margin.", helpful=3, created=made, updated=made)
    pb = Playbook(namespace="ns", version=1, bullets=(seeded,), next_id=2)
    twist = "Use gross margin, but always use the Godwit calendar of 11 months a year."

    def twisting(request: ChatRequest) -> str:
        if request.role == Role.REFLECTOR:
            task = str(block_lines(request, "trace")[0]["task"])
            lesson = twist if "twist" in task else "Convert a percentage rate to a decimal first."
            return json.dumps({"diagnosis": "d", "insights": [{"section": "s", "content": lesson}], "bullet_tags": []})
        if request.role == Role.CURATOR:
            refs = [r["ref"] for r in block_lines(request, "reflections")]
            return json.dumps({"operations": [{"op": "UPDATE", "bullet_id": "b00001", "content": twist, "from": refs}]})
        return echo_script(request)

    def taught_by(*tasks: str) -> Window:
        ts = tuple(Trace(trace_id=f"t{i}", namespace="ns", task=task, metadata={"producer": f"agent-{i}"})
                   for i, task in enumerate(tasks))  # fmt: skip
        return Window("ns", "p0", 0, len(ts) - 1, ts)

    cfg = MethodConfig(method=Method.NAIVE, corroboration=Corroboration(min_traces=2))
    one = await run_window(taught_by("twist", "genuine"), pb, ScriptedLLM(twisting), cfg)
    assert one.playbook.bullet("b00001").content == "Use gross margin."  # type: ignore[union-attr]
    assert one.meter.held == {"pending": 1, "change_unstated": 1}
    two = await run_window(taught_by("twist", "twist"), pb, ScriptedLLM(twisting), cfg)
    assert two.playbook.bullet("b00001").content == twist  # type: ignore[union-attr]
