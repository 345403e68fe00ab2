"""Worker tier: the live-namespace cap, idle eviction and per-namespace backpressure of the window stage
(combee/namespaces.py decides; workers/tenancy.py and workers/holdback.py apply)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from combee.metrics_prometheus import PrometheusMetrics, sample_sum
from streams.codec import decode
from streams.envelopes import DeadLetter
from tests.fakes import ScriptedLLM, echo_script
from tests.workers.test_stages import (
    Event,
    MemoryKafka,
    Msg,
    Stream,
    deltas,
    feed_traces,
    learner,
    pump,
    trace,
)
from workers.context import StageContext
from workers.holdback import refill
from workers.tenancy import evict_idle
from workers.window import close_due_windows, handle_trace


def configure(ctx: StageContext, **changes: object) -> StageContext:
    ctx.config = dataclasses.replace(ctx.config, **changes)  # type: ignore[arg-type]
    return ctx


async def learn_all(ctx: StageContext, kafka: MemoryKafka, stream: Stream, seen: set) -> None:
    """Close windows, read back what was held, deliver every stage's records, until nothing moves."""
    for _ in range(400):
        await asyncio.sleep(0.01)
        moved = await close_due_windows(ctx) + await refill(ctx)
        if not moved and not await pump(ctx, kafka, stream, seen) and not ctx.tasks:
            return


def learned_offsets(kafka: MemoryKafka, ctx: StageContext, ns: str) -> list[int]:
    return [o for r in deltas(kafka, ctx.topics) if r.namespace == ns for o in r.offsets]


async def test_a_new_namespace_past_the_cap_is_dead_lettered_with_the_reason_and_acked() -> None:
    kafka, stream, seen = MemoryKafka(), Stream(), set()
    ctx = configure(learner(kafka, ScriptedLLM(echo_script)), max_namespaces=1)
    ctx.metrics = metrics = PrometheusMetrics()
    await feed_traces(ctx, kafka, stream, "alpha", 3)
    await feed_traces(ctx, kafka, stream, "beta", 2)
    await learn_all(ctx, kafka, stream, seen)

    letters = [decode(m.value or b"") for m in kafka.records(ctx.topics.deadletter)]
    assert [d.reason for d in letters if isinstance(d, DeadLetter)] == [
        "namespace limit: 'beta' is new and this worker already holds its cap of 1 live namespaces"
    ] * 2
    assert sorted(learned_offsets(kafka, ctx, "alpha")) == [0, 1, 2] and not learned_offsets(kafka, ctx, "beta")
    assert sample_sum(metrics.render().decode(), "combee_traces_total", reason="namespace_limit") == 2
    assert len([a for a in stream.acked if a[0] == ctx.topics.traces]) == 5  # dead letters acked too
    assert set(ctx.runtimes) == {"alpha"}


async def test_an_idle_namespace_is_evicted_and_its_place_goes_to_a_new_one() -> None:
    kafka, stream, seen = MemoryKafka(), Stream(), set()
    ctx = configure(learner(kafka, ScriptedLLM(echo_script)), max_namespaces=1, namespace_idle_s=0.05)
    ctx.metrics = metrics = PrometheusMetrics()
    await feed_traces(ctx, kafka, stream, "alpha", 3)
    await learn_all(ctx, kafka, stream, seen)
    await asyncio.sleep(0.1)  # alpha idle past its time (the eviction is checked when beta needs the place)
    await feed_traces(ctx, kafka, stream, "beta", 2)
    await learn_all(ctx, kafka, stream, seen)

    assert not kafka.records(ctx.topics.deadletter)
    assert len(learned_offsets(kafka, ctx, "beta")) == 2
    assert set(ctx.runtimes) == {"beta"}
    text = metrics.render().decode()
    assert sample_sum(text, "combee_namespaces_evicted_total") == 1
    assert sample_sum(text, "combee_namespaces_live") == 1


async def test_a_namespace_with_anything_in_hand_is_never_evicted() -> None:
    kafka, stream = MemoryKafka(), Stream()
    ctx = configure(learner(kafka, ScriptedLLM(echo_script)), namespace_idle_s=0.01)
    await feed_traces(ctx, kafka, stream, "alpha", 2)  # buffered, no window closed yet
    assert evict_idle(ctx, now=1e12) == [] and "alpha" in ctx.runtimes
    await close_due_windows(ctx, now=time.monotonic() + 1.0)  # a window in flight, nothing buffered
    assert ctx.runtime("alpha").buffered() == 0
    assert evict_idle(ctx, now=1e12) == [] and "alpha" in ctx.runtimes


async def test_an_evicted_namespace_comes_back_and_learns_on_from_its_last_version() -> None:
    kafka, stream, seen = MemoryKafka(), Stream(), set()
    ctx = configure(learner(kafka, ScriptedLLM(echo_script)), namespace_idle_s=0.01)
    ns, part = "alpha", ctx.home_partition("alpha")
    await feed_traces(ctx, kafka, stream, ns, 5)
    await learn_all(ctx, kafka, stream, seen)
    before = [r for r in deltas(kafka, ctx.topics) if r.namespace == ns]
    tenure = ctx.runtime(ns).tenure
    assert tenure is not None and tenure.combining(ns) is ctx.runtime(ns).combining
    assert evict_idle(ctx, now=1e12) == [ns] and ns not in ctx.runtimes
    assert tenure.combining(ns).playbooks == {}  # its state was let go: a new one, with no recent versions

    for i in range(5, 9):
        offset = await kafka.send(ctx.topics.traces, ns.encode(), trace(ns, i), part)
        await handle_trace(ctx, stream, Event(Msg(ctx.topics.traces, part, offset, ns.encode(), trace(ns, i))))
    await learn_all(ctx, kafka, stream, seen)
    records = [r for r in deltas(kafka, ctx.topics) if r.namespace == ns]
    after = records[len(before) :]
    assert after and after[0].delta.base_version == before[-1].version  # from its last version, not from 0
    assert [r.version for r in records] == list(range(1, len(records) + 1))
    assert [r.seq for r in records] == list(range(len(records)))
    offsets = [o for r in records for o in r.offsets]
    assert offsets == list(range(9))  # every trace learned once, in order


async def test_a_full_buffer_holds_its_namespace_back_and_not_the_others_on_its_partition() -> None:
    kafka, stream, seen = MemoryKafka(), Stream(), set()
    ctx = configure(learner(kafka, ScriptedLLM(echo_script), partitions=1), buffer_limit=3)
    ctx.metrics = metrics = PrometheusMetrics()
    sent: list[tuple[str, int]] = [("alpha", i) for i in range(8)] + [("beta", i) for i in range(3)]
    sent += [("alpha", i) for i in range(8, 10)]
    for ns, i in sent:
        offset = await kafka.send(ctx.topics.traces, ns.encode(), trace(ns, i), 0)
        event = Event(Msg(ctx.topics.traces, 0, offset, ns.encode(), trace(ns, i)))
        # the old stage stopped here at alpha's fourth trace until a window drained alpha's buffer
        await asyncio.wait_for(handle_trace(ctx, stream, event), timeout=5.0)
    assert ctx.runtime("beta").buffered() == 3  # beta went on although alpha's buffer is full
    assert ctx.runtime("alpha").buffered() == 3 and ctx.runtime("alpha").held_back() == 7
    assert not [a for a in stream.acked if a[0] == ctx.topics.traces]  # nothing acked past alpha's buffer yet

    await learn_all(ctx, kafka, stream, seen)
    alpha = [o for r in deltas(kafka, ctx.topics) if r.namespace == "alpha" for o in r.offsets]
    beta = [o for r in deltas(kafka, ctx.topics) if r.namespace == "beta" for o in r.offsets]
    assert alpha == [*range(8), 11, 12] and beta == [8, 9, 10]  # each once, alpha's in order
    acked = [o for t, _, o in stream.acked if t == ctx.topics.traces]
    assert acked == list(range(len(sent)))  # every record acked, in order
    assert sample_sum(metrics.render().decode(), "combee_traces_held_total", namespace="alpha") == 7


async def test_a_partition_waits_only_when_it_holds_back_its_limit() -> None:
    kafka, stream = MemoryKafka(), Stream()
    ctx = configure(learner(kafka, ScriptedLLM(echo_script), partitions=1), buffer_limit=1, held_limit=2)
    for i in range(2):  # one buffered, one held back
        offset = await kafka.send(ctx.topics.traces, b"alpha", trace("alpha", i), 0)
        await handle_trace(ctx, stream, Event(Msg(ctx.topics.traces, 0, offset, b"alpha", trace("alpha", i))))
    offset = await kafka.send(ctx.topics.traces, b"alpha", trace("alpha", 2), 0)
    waiting = asyncio.ensure_future(
        handle_trace(ctx, stream, Event(Msg(ctx.topics.traces, 0, offset, b"alpha", trace("alpha", 2))))
    )
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiting.done()  # two held back: the partition's limit, so its intake waits
    assert await close_due_windows(ctx, now=time.monotonic() + 1.0) == 1
    assert await refill(ctx) == 1  # the window made room for one: one held back less, below the limit
    await asyncio.wait_for(waiting, timeout=5.0)
