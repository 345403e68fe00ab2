"""Worker tier: the window stage applies the rate limits (combee/quotas.py) and dead-letters the excess."""

from __future__ import annotations

import json
from dataclasses import dataclass

from combee.metrics_prometheus import PrometheusMetrics, sample_sum
from combee.quotas import QuotaLedger, Quotas, RateLimit
from streams.codec import decode
from streams.envelopes import DeadLetter
from tests.fakes import ScriptedLLM, echo_script
from tests.workers.test_stages import Event, MemoryKafka, Msg, Stream, deltas, learner, run_until_quiet
from workers.window import handle_trace

#: Far in the past, so the stage's "never later than now" leaves the record timestamps as they are.
T0 = 1_000_000.0


@dataclass
class StampedMsg(Msg):
    timestamp: float = 0.0


def producer_trace(ns: str, producer: str, i: int) -> bytes:
    return json.dumps(
        {"namespace": ns, "trace_id": f"{producer}-{i}", "task": f"task {i}", "metadata": {"producer": producer}}
    ).encode()


async def test_a_producer_over_its_quota_is_dead_lettered_with_the_reason_and_the_rest_is_learned() -> None:
    kafka, stream = MemoryKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    ctx.quotas = QuotaLedger(Quotas(namespace=RateLimit(100.0, 100), producer=RateLimit(per_s=1.0, burst=3)))
    ctx.metrics = metrics = PrometheusMetrics()
    part = ctx.home_partition("alpha")
    # "noisy" sends 10 traces within a second (3 fit its burst of 3, the 0.9 token earned meanwhile does not
    # make a fourth), then one more 2 s after its first (a token came back); "quiet" sends 3, all within its own
    sends = [("noisy", i, T0 + i * 0.1) for i in range(10)] + [("noisy", 10, T0 + 2.0)]
    sends += [("quiet", i, T0 + i * 0.1) for i in range(3)]
    for producer, i, at in sorted(sends, key=lambda s: s[2]):
        raw = producer_trace("alpha", producer, i)
        offset = await kafka.send(ctx.topics.traces, b"alpha", raw, part)
        await handle_trace(ctx, stream, Event(StampedMsg(ctx.topics.traces, part, offset, b"alpha", raw, at)))
    await run_until_quiet(ctx, kafka, stream, set())

    letters = [decode(m.value or b"") for m in kafka.records(ctx.topics.deadletter)]
    assert len(letters) == 7 and all(isinstance(d, DeadLetter) for d in letters)
    assert {d.reason for d in letters if isinstance(d, DeadLetter)} == {
        "rate limit: producer 'noisy' in 'alpha' is over its quota of 1 traces/s, burst 3"
    }
    learned = sum(r.trace_count for r in deltas(kafka, ctx.topics))
    assert learned == 4 + 3  # noisy: its burst of 3 and the token earned by T0 + 2; quiet: all
    assert sample_sum(metrics.render().decode(), "combee_traces_total", reason="rate_limited") == 7
    traces_acked = [a for a in stream.acked if a[0] == ctx.topics.traces]
    assert len(traces_acked) == 14  # 11 + 3  # every record acknowledged: learned or dead-lettered, never left behind


async def test_without_quotas_nothing_is_refused() -> None:
    kafka, stream = MemoryKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    part = ctx.home_partition("alpha")
    for i in range(10):
        raw = producer_trace("alpha", "noisy", i)
        offset = await kafka.send(ctx.topics.traces, b"alpha", raw, part)
        await handle_trace(ctx, stream, Event(StampedMsg(ctx.topics.traces, part, offset, b"alpha", raw, T0)))
    await run_until_quiet(ctx, kafka, stream, set())
    assert not kafka.records(ctx.topics.deadletter)
    assert sum(r.trace_count for r in deltas(kafka, ctx.topics)) == 10
