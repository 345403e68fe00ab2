"""A partition reassigned to the same worker after a rebalance: nothing it dropped on revocation is lost.

faust-streaming 0.15 may resume a partition that has no committed offset past the records it handed over in
the previous generation. The combiner holds a window's plan unacked until the window is applied and drops it
on revocation, so without a check the window would wait for its plan forever (seen in the fault suite: the
pipeline stalled after a curate worker joined). The first event after an assignment is compared with the
group's committed offset, and what lies between is read directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytest

from streams.codec import decode
from streams.envelopes import WindowPlan
from tests.fakes import ScriptedLLM, echo_script
from tests.workers.test_stages import (
    Event,
    MemoryKafka,
    Msg,
    Stream,
    close_due_windows,
    deltas,
    feed_traces,
    learner,
    reflect_through_the_pool,
    run_until_quiet,
    trace,
)
from workers import mapper
from workers.app import _forget
from workers.combine import handle_partial
from workers.combiner.claim import ensure_ready
from workers.context import StageContext
from workers.curate import handle_group
from workers.delivery.backfill import with_backfill
from workers.delivery.resume import Look, check_stalls
from workers.mapper import handle_window
from workers.window import handle_trace


@dataclass
class GroupKafka(MemoryKafka):
    """MemoryKafka with the group's committed offsets (nothing committed unless set)."""

    commits: dict[tuple[str, int], int] = field(default_factory=dict)
    asked: list[tuple[str, int]] = field(default_factory=list)

    async def committed(self, topic: str, partition: int) -> int | None:
        self.asked.append((topic, partition))
        return self.commits.get((topic, partition))

    async def committed_offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        self.asked.extend(partitions)
        return {tp: self.commits.get(tp) for tp in partitions}


@dataclass
class TP:
    topic: str
    partition: int


async def _settle(ctx, n: int = 50) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    for _ in range(n):
        await asyncio.sleep(0)
    await asyncio.gather(*list(ctx.tasks))


async def _window_mapped(ctx, kafka, stream, ns: str, n: int) -> None:  # type: ignore[no-untyped-def]
    """``n`` traces of ``ns`` windowed, the window mapped and reflected: its plan is on the partials topic."""
    await feed_traces(ctx, kafka, stream, ns, n)
    await close_due_windows(ctx)
    (window,) = kafka.records(ctx.topics.windows)
    await handle_window(ctx, stream, Event(window))
    await reflect_through_the_pool(ctx, kafka, stream)
    await _settle(ctx)


async def test_a_plan_dropped_on_revocation_is_read_back_when_the_stream_resumes_past_it() -> None:
    kafka, stream = GroupKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    await _window_mapped(ctx, kafka, stream, "alpha", 6)
    (plan,) = kafka.records(ctx.topics.partials)  # generation 1: the plan reaches the combiner...
    for e in await with_backfill(ctx.acks, ctx.io, Event(plan)):
        await handle_partial(ctx, stream, e)
    # ...then a rebalance revokes everything; this worker gets the same partitions back
    _forget(ctx, [TP(plan.topic, p) for p in range(ctx.topics.partitions)])
    gate = __import__("asyncio").Semaphore(4)
    for task in kafka.records(ctx.topics.groups):  # a curate worker answers the window's groups
        await handle_group(ctx, stream, Event(task), gate)
    await _settle(ctx)
    partials = [m for m in kafka.records(ctx.topics.partials) if m.offset > plan.offset]
    assert partials
    # generation 2: the stream resumes AFTER the plan (offset 0 has no committed offset to seek to)
    await _deliver(ctx, stream, partials)
    await _settle(ctx)
    assert (plan.topic, plan.partition) in kafka.asked
    assert ctx.acks.backfilled == 1
    records = deltas(kafka, ctx.topics)
    assert [(r.window_id, r.version) for r in records] == [(f"alpha/p{plan.partition}/0-5", 1)]


async def test_a_first_event_at_the_committed_offset_reads_nothing_extra() -> None:
    kafka, stream = GroupKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    part = ctx.home_partition("alpha")
    await feed_traces(ctx, kafka, stream, "alpha", 3)
    kafka.commits[(ctx.topics.traces, part)] = 2
    fresh = learner(kafka, ScriptedLLM(echo_script))
    (msg,) = [m for m in kafka.records(ctx.topics.traces) if m.offset == 2]
    assert await with_backfill(fresh.acks, fresh.io, Event(msg)) == [Event(msg)]
    assert fresh.acks.backfilled == 0


class FTP(NamedTuple):
    """Faust's TP: a (topic, partition) named tuple."""

    topic: str
    partition: int


@dataclass
class FaustConsumer:
    """What the stall guard asks of Faust's consumer: the assignment, fetch positions, earliest offsets, seek."""

    positions: dict[FTP, int]
    seeks: list[tuple[FTP, int]] = field(default_factory=list)

    def assignment(self) -> set[FTP]:
        return set(self.positions)

    async def position(self, tp: FTP) -> int:
        return self.positions[tp]

    async def earliest_offsets(self, *tps: FTP) -> dict[FTP, int]:
        return dict.fromkeys(tps, 0)

    async def seek(self, tp: FTP, offset: int) -> None:
        self.seeks.append((tp, offset))
        self.positions[tp] = offset


def _guarded(ctx: StageContext) -> dict[str, Any]:
    """What the stall guard is given of a worker: its stage topics, its acks and its Kafka I/O."""
    return {"topics": ctx.topics.stage_inputs, "acks": ctx.acks, "io": ctx.io}


async def _deliver(ctx, stream, msgs) -> None:  # type: ignore[no-untyped-def]
    for msg in msgs:
        for e in await with_backfill(
            ctx.acks, ctx.io, Event(Msg(msg.topic, msg.partition, msg.offset, msg.key, msg.value))
        ):
            await handle_partial(ctx, stream, e)


async def test_a_partition_resumed_past_everything_it_held_is_sought_back_and_its_window_applied() -> None:
    """The fault suite's stall: after the rebalance no record of the partials partition reaches the combiner —
    the stream resumed past the plan and every partial, and nothing more will come — so no later event can
    reveal the gap. The stall guard sees the fetch position past the committed offset with nothing delivered
    since the assignment, twice in a row, and seeks back; the records come again and the window is applied."""
    kafka, stream = GroupKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    await _window_mapped(ctx, kafka, stream, "alpha", 6)
    gate = __import__("asyncio").Semaphore(4)
    for task in kafka.records(ctx.topics.groups):
        await handle_group(ctx, stream, Event(task), gate)
    await _settle(ctx)
    held = kafka.records(ctx.topics.partials)  # the plan and the partials, none applied nor acked
    assert len(held) >= 2
    _forget(ctx, [TP(t, p) for t in (ctx.topics.partials, ctx.topics.traces) for p in range(ctx.topics.partitions)])
    tp = FTP(held[0].topic, held[0].partition)
    consumer = FaustConsumer({tp: len(held), FTP(ctx.topics.traces, tp.partition): 6})
    kafka.commits[(ctx.topics.traces, tp.partition)] = 6  # the traces were windowed and committed

    looks = await check_stalls(consumer, {}, **_guarded(ctx))
    assert consumer.seeks == [] and kafka.asked == []  # maybe records on their way: look again
    looks = await check_stalls(consumer, looks, **_guarded(ctx))
    assert consumer.seeks == [(tp, 0)] and ctx.acks.resumed == 1  # the traces partition is at its commit
    assert looks == {(ctx.topics.traces, tp.partition): Look(6, cleared=True)}
    assert deltas(kafka, ctx.topics) == []

    await _deliver(ctx, stream, held)  # Faust delivers them again from the position sought
    await _settle(ctx)
    records = deltas(kafka, ctx.topics)
    assert [(r.window_id, r.version) for r in records] == [(f"alpha/p{tp.partition}/0-5", 1)]


async def test_the_stall_guard_leaves_alone_a_partition_that_delivered_or_moved() -> None:
    kafka, stream = GroupKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    part = ctx.home_partition("alpha")
    await _feed_through_intake(ctx, kafka, stream, "alpha", 3)  # events came since the assignment
    busy = FTP(ctx.topics.traces, part)
    moving = FTP(ctx.topics.windows, part)
    consumer = FaustConsumer({busy: 3, moving: 4})
    key = (moving.topic, moving.partition)
    looks = await check_stalls(consumer, {}, **_guarded(ctx))
    assert looks == {key: Look(4)}  # the traces partition delivered: not looked at
    consumer.positions[moving] = 7  # the position moved: records are flowing, look again later
    looks = await check_stalls(consumer, looks, **_guarded(ctx))
    assert looks == {key: Look(7)} and consumer.seeks == [] and kafka.asked == []
    kafka.commits[key] = 7  # at its committed offset (an idle partition): nothing was skipped
    looks = await check_stalls(consumer, looks, **_guarded(ctx))
    assert looks == {key: Look(7, cleared=True)} and kafka.asked == [key]
    looks = await check_stalls(consumer, looks, **_guarded(ctx))  # not asked again while it stays there
    assert looks == {key: Look(7, cleared=True)} and kafka.asked == [key] and consumer.seeks == []


async def test_a_record_handed_over_again_since_the_assignment_is_dropped_at_intake() -> None:
    kafka, stream = GroupKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    await _feed_through_intake(ctx, kafka, stream, "alpha", 3)
    again = Event(kafka.records(ctx.topics.traces)[1])
    assert await with_backfill(ctx.acks, ctx.io, again) == []
    assert ctx.acks.redelivered == 1 and ctx.acks.backfilled == 0
    _forget(ctx, [TP(again.message.topic, again.message.partition)])  # after a revocation: new to this worker
    kafka.commits[(again.message.topic, again.message.partition)] = 1
    assert await with_backfill(ctx.acks, ctx.io, again) == [again]


async def _feed_through_intake(ctx, kafka, stream, ns: str, n: int) -> None:  # type: ignore[no-untyped-def]
    """``n`` traces of ``ns`` handed to the window stage the way the agent does: through ``with_backfill``."""
    part = ctx.home_partition(ns)
    for i in range(n):
        offset = await kafka.send(ctx.topics.traces, ns.encode(), trace(ns, i), part)
        for e in await with_backfill(
            ctx.acks, ctx.io, Event(Msg(ctx.topics.traces, part, offset, ns.encode(), trace(ns, i)))
        ):
            await handle_trace(ctx, stream, e)


def _plans(kafka: MemoryKafka, topic: str) -> list[WindowPlan]:
    return [env for m in kafka.records(topic) if isinstance(env := decode(m.value or b""), WindowPlan)]


async def test_a_window_waiting_for_its_turn_is_woken_when_a_new_claim_replays_the_window_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fault suite's zombie stall: a rebalance replaced the namespace's runtime while the window before was
    logged but not yet snapshotted; the next window, delivered again, waited for its turn on the new runtime, and
    the new claim's replay, which made that turn come, woke nobody. The namespace never learned again."""
    monkeypatch.setattr(mapper, "RECHECK_S", 3600.0)  # the wake-up must do it, not the periodic re-check
    await _stalled_window_is_mapped()


async def test_a_lost_wake_up_costs_one_re_check_not_the_namespace(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Should a path that moves the snapshot on ever forget to wake the map stage, the turn is looked at again."""
    from workers.combiner import commit

    async def forgotten(*args: object) -> None:
        return None

    monkeypatch.setattr(mapper, "RECHECK_S", 0.05)
    monkeypatch.setattr(commit, "_announce_applied", forgotten)
    await _stalled_window_is_mapped(pause_s=0.3)
    assert "found its turn without a wake-up" in caplog.text


async def _stalled_window_is_mapped(pause_s: float = 0.0) -> None:
    import asyncio

    kafka, stream = GroupKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    part = ctx.home_partition("alpha")
    await feed_traces(ctx, kafka, stream, "alpha", 6)
    await run_until_quiet(ctx, kafka, stream, set())
    learned = ctx.snapshots.get("alpha")
    assert learned is not None and learned.next_seq >= 1
    # the owner logged the last window's delta, then lost the partition before its snapshot was written
    del kafka.logs[(ctx.topics.playbooks, part)][-2:]
    for i in range(100, 106):  # the next window closes, as the rebalance comes
        offset = await kafka.send(ctx.topics.traces, b"alpha", trace("alpha", i), part)
        await handle_trace(ctx, stream, Event(Msg(ctx.topics.traces, part, offset, b"alpha", trace("alpha", i))))
    await close_due_windows(ctx)
    windows = kafka.records(ctx.topics.windows)
    _forget(ctx, [TP(t, p) for t in ctx.topics.stage_inputs for p in range(ctx.topics.partitions)])

    await handle_window(ctx, stream, Event(windows[-1]))  # delivered again: it waits for the window before it
    await _settle_mappers(ctx)
    assert [p.seq for p in _plans(kafka, ctx.topics.partials)] == list(range(learned.next_seq))

    await ensure_ready(ctx, part)  # the new claim replays the logged delta: the turn has come
    await asyncio.sleep(pause_s)
    await _settle_mappers(ctx)
    await reflect_through_the_pool(ctx, kafka, stream)
    assert [p.seq for p in _plans(kafka, ctx.topics.partials)] == list(range(learned.next_seq + 1))


async def _settle_mappers(ctx) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    for _ in range(100):
        await asyncio.sleep(0)
