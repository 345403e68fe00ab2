"""A partition reassigned to the same worker after a rebalance: nothing it dropped on revocation is lost.

faust-streaming 0.15 may resume a partition that has no committed offset past the records it handed over in
the previous generation. The combiner holds a window's plan unacked until the window is applied and drops it
on revocation, so without a check the window would wait for its plan forever (seen in the fault suite: the
pipeline stalled after a curate worker joined). The first event after an assignment is compared with the
group's committed offset, and what lies between is read directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
)
from workers.app import _forget
from workers.combine import handle_partial
from workers.curate import handle_group
from workers.mapper import handle_window


@dataclass
class GroupKafka(MemoryKafka):
    """MemoryKafka with the group's committed offsets (nothing committed unless set)."""

    commits: dict[tuple[str, int], int] = field(default_factory=dict)
    asked: list[tuple[str, int]] = field(default_factory=list)

    async def committed(self, topic: str, partition: int) -> int | None:
        self.asked.append((topic, partition))
        return self.commits.get((topic, partition))


@dataclass
class TP:
    topic: str
    partition: int


async def _settle(ctx, n: int = 50) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    for _ in range(n):
        await asyncio.sleep(0)
    await asyncio.gather(*list(ctx.tasks))


async def test_a_plan_dropped_on_revocation_is_read_back_when_the_stream_resumes_past_it() -> None:
    kafka, stream = GroupKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    await feed_traces(ctx, kafka, stream, "alpha", 6)
    await close_due_windows(ctx)
    (window,) = kafka.records(ctx.topics.windows)
    await handle_window(ctx, stream, Event(window))
    await reflect_through_the_pool(ctx, kafka, stream)
    await _settle(ctx)
    (plan,) = kafka.records(ctx.topics.partials)  # generation 1: the plan reaches the combiner...
    for e in await ctx.with_backfill(Event(plan)):
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
    for msg in partials:
        for e in await ctx.with_backfill(Event(Msg(msg.topic, msg.partition, msg.offset, msg.key, msg.value))):
            await handle_partial(ctx, stream, e)
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
    assert await fresh.with_backfill(Event(msg)) == [Event(msg)]
    assert fresh.acks.backfilled == 0
