"""Worker tier: the combiner screens a curator's operations against the runs they name as sources, which the
window plan carries from the mapper (streams.envelopes.WindowPlan.run_facts); the offline engine does the same
with the window's traces. A curator's worked example with a run's numbers goes; the rule before it stays."""

from __future__ import annotations

import json

from combee.engine import MethodConfig, Window, run_window
from combee.llm import ChatRequest, Role
from combee.models import Feedback, Playbook, Trace
from combee.screen import RunFacts
from streams.codec import decode
from streams.envelopes import WindowPlan
from tests.fakes import ScriptedLLM, block_lines
from tests.workers.test_stages import Event, MemoryKafka, Msg, Stream, learner, run_until_quiet
from workers.window import handle_trace

RULE = "Simple interest is principal × rate × years."
EXAMPLE = "For a loan of $3,500 over 7 years at 6 % it comes to $1,470."


def worked_example(request: ChatRequest) -> str:
    """A reflector that states RULE; a curator that adds it with a worked example of the run, citing every
    reflection (as the local model's curator did in redteam-real-7)."""
    if request.role == Role.REFLECTOR:
        insights = [{"section": "formulas", "content": RULE}]
        return json.dumps({"diagnosis": "ok", "insights": insights, "bullet_tags": []})
    if request.role == Role.CURATOR:
        refs = [r["ref"] for r in block_lines(request, "reflections")]
        op = {"op": "ADD", "section": "formulas", "content": f"{RULE} {EXAMPLE}", "bullet_id": None, "from": refs}
        return json.dumps({"operations": [op]})
    return json.dumps({"answer": "0"})


def loan(i: int) -> Trace:
    return Trace(
        trace_id=f"alpha-{i}", namespace="alpha", task="A loan of $3,500 at 6% for 7 years: the simple interest?",
        output="1400.00", feedback=Feedback(success=False, ground_truth="1470"),
    )  # fmt: skip


async def test_the_combiner_trims_a_curators_worked_example_by_the_runs_in_the_plan() -> None:
    kafka, stream = MemoryKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(worked_example), method=MethodConfig(shuffle_key="none"))
    part = ctx.home_partition("alpha")
    for i in range(4):
        raw = loan(i).model_dump_json().encode()
        offset = await kafka.send(ctx.topics.traces, b"alpha", raw, part)
        await handle_trace(ctx, stream, Event(Msg(ctx.topics.traces, part, offset, b"alpha", raw)))
    await run_until_quiet(ctx, kafka, stream, set())

    plans = [p for m in kafka.records(ctx.topics.partials) if isinstance(p := decode(m.value or b""), WindowPlan)]
    assert plans and all(p.run_facts[t] == RunFacts.of(loan(int(t[-1]))) for p in plans for t in p.trace_ids)
    snap = ctx.snapshots.get("alpha")
    assert snap is not None and [b.content for b in snap.playbook.bullets] == [RULE]


async def test_the_engine_trims_it_by_the_windows_traces() -> None:
    window = Window("alpha", "p0", 0, 3, tuple(loan(i) for i in range(4)), "")
    result = await run_window(window, Playbook(namespace="alpha"), ScriptedLLM(worked_example), MethodConfig())
    assert [b.content for b in result.playbook.bullets] == [RULE]
