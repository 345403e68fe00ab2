"""Worker tier: the window stage skips the traces a forget rule names — acknowledged, counted, never learned
(issue 26, item 3), with in-memory topics (tests/workers/test_stages.py)."""

from __future__ import annotations

import json
from typing import Any

from combee.forget import ForgetRule
from streams.forget import CachedRules
from tests.fakes import ScriptedLLM, echo_script
from tests.workers.test_metrics_stages import value, with_metrics
from tests.workers.test_stages import Event, MemoryKafka, Msg, Stream, deltas, learner, run_until_quiet
from workers.window import handle_trace


def traced(ns: str, i: int, producer: str) -> bytes:
    return json.dumps(
        {"namespace": ns, "trace_id": f"{ns}-{producer}-{i}", "task": f"task {i}", "metadata": {"producer": producer}}
    ).encode()


async def test_the_window_stage_learns_nothing_from_a_forgotten_producer() -> None:
    kafka, stream, seen = MemoryKafka(), Stream(), set[Any]()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    m = with_metrics(ctx)

    async def load() -> set[bytes]:
        return {ForgetRule(producer="mallory").encode().encode()}

    ctx.forget_rules = CachedRules(load, lambda: 0.0)
    part = ctx.home_partition("alpha")
    for i in range(12):
        producer = "mallory" if i % 3 == 0 else "alice"
        raw = traced("alpha", i, producer)
        offset = await kafka.send(ctx.topics.traces, b"alpha", raw, part)
        await handle_trace(ctx, stream, Event(Msg(ctx.topics.traces, part, offset, b"alpha", raw)))
    await run_until_quiet(ctx, kafka, stream, seen)

    learned = {tid for record in deltas(kafka, ctx.topics) for tid in record.trace_ids}
    assert learned and all("alice" in tid for tid in learned)
    assert value(m, "combee_traces_total", namespace="alpha", outcome="forgotten") == 4
    assert value(m, "combee_traces_total", namespace="alpha", outcome="accepted") == 8
