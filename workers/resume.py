"""Stall guard: a partition whose fetch position passed records its stage never received is sought back.

faust-streaming 0.15 can resume a newly assigned partition past records it fetched but never handed to the
agent (a fetch cut short by the generation change of a rebalance; docs/infrastructure.md). When a later
record arrives, :meth:`workers.context.StageContext.with_backfill` sees the gap and reads it directly. When
none does, nothing would: in the fault suite a combiner took over a partition whose window plan and partials
were all it held, its stream resumed past them, the window's map stage waited for that window to be applied
before sending anything more, and the namespace stalled for good.

So every ``period_s`` the guard looks at each assigned partition of the stage topics that has delivered no
record since it was assigned. A fetch position past the group's committed offset (the log's start when none)
there means records were fetched and lost on the way; when the same position is seen at two checks in a row
(not merely records on their way through a busy agent) the consumer is sought back to the committed offset,
and Faust delivers them again. A record that does reach the stage twice is dropped at intake
(:meth:`~workers.acks.OrderedAcks.seen`), so a seek is safe even when the guard was wrong.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from workers.context import StageContext

__all__ = ["check_stalls", "stall_guard"]

log = logging.getLogger("combee.worker")

Suspects = dict[tuple[str, int], int]  # (topic, partition) -> fetch position at the last check


async def check_stalls(ctx: StageContext, consumer: Any, suspects: Suspects) -> Suspects:
    """One look at every assigned partition of the stage topics; seek back the ones found stalled twice.

    ``consumer`` is Faust's consumer (``assignment``, ``position``, ``earliest_offsets``, ``seek``). Returns
    the partitions suspected now, for the next call.
    """
    topics = ctx.topics
    consumed = {topics.traces, topics.windows, topics.reflect, topics.reflections, topics.groups, topics.partials}
    now: Suspects = {}
    for tp in sorted(consumer.assignment()):
        if tp.topic not in consumed or not ctx.acks.untouched(tp.topic, tp.partition):
            continue  # a record came since the assignment: gaps after it are with_backfill's
        position = await consumer.position(tp)
        if not position:
            continue
        if suspects.get((tp.topic, tp.partition)) != position:
            now[(tp.topic, tp.partition)] = position  # maybe records on their way: look again next time
            continue
        committed = await ctx.io.committed(tp.topic, tp.partition)
        start = committed if committed is not None else (await consumer.earliest_offsets(tp)).get(tp, 0)
        if position <= start or not ctx.acks.untouched(tp.topic, tp.partition) or tp not in consumer.assignment():
            continue
        log.warning(
            "%s[%d]: the fetch position is %d but no record since the assignment reached the stage (committed: "
            "%s); seeking back to %d",
            tp.topic, tp.partition, position, committed, start,
        )  # fmt: skip
        await consumer.seek(tp, start)
        ctx.acks.resumed += 1
    return now


async def stall_guard(ctx: StageContext, consumer: Callable[[], Any], period_s: float = 5.0) -> None:
    """Background task: :func:`check_stalls` every ``period_s`` seconds (``consumer()`` gives Faust's consumer)."""
    suspects: Suspects = {}
    while True:
        await asyncio.sleep(period_s)
        try:
            suspects = await check_stalls(ctx, consumer(), suspects)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a rebalance in progress, the broker away: look again next time
            log.debug("stall check skipped: %s", exc)
            suspects = {}
