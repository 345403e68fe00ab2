"""Stall guard: a partition whose fetch position passed records its stage never received is sought back.

Library behaviour answered: faust-streaming 0.15 can resume a newly assigned partition past records it fetched but
never handed to the agent. Our reading of its consumer: a fetch that returns after a rebalance changed the
generation is dropped unseen, the fetch position stays past it, and no seek follows. When a later record arrives,
:func:`workers.delivery.backfill.with_backfill` sees the gap and reads it directly. When none does, nothing would:
in the fault suite a combiner took over a partition whose window plan and partials were all it held, its stream
resumed past them, the window's map stage waited for that window to be applied before sending anything more, and
the namespace stalled for good.

So every ``period_s`` the guard looks at each assigned partition of the stage topics that has delivered no
record since it was assigned. A fetch position past the group's committed offset (the log's start when none)
there means records were fetched and lost on the way; when the same position is seen at two looks in a row
(not merely records on their way through a busy agent) the consumer is sought back to the committed offset,
and Faust delivers them again. A record that does reach the stage twice is dropped at intake
(:meth:`~workers.delivery.acks.OrderedAcks.seen`), so a seek is safe even when the guard was wrong. The committed
offsets are asked for in one request per look, and only for partitions seen at the same position twice; a
partition found at its committed offset (an idle one) is not asked about again until its position moves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from workers.delivery.acks import OrderedAcks
from workers.delivery.kafka_io import KafkaIO

__all__ = ["Look", "check_stalls", "stall_guard"]

log = logging.getLogger("combee.worker")


@dataclass(frozen=True)
class Look:
    """What the guard saw of a partition that has delivered nothing since its assignment."""

    position: int  # the fetch position
    cleared: bool = False  # found at (or before) the committed offset at this position: nothing was skipped


Looks = dict[tuple[str, int], Look]


async def check_stalls(
    consumer: Any, looks: Looks, *, topics: Collection[str], acks: OrderedAcks, io: KafkaIO
) -> Looks:
    """One look at every assigned partition of the stage topics (``topics``); seek back the ones found stalled.

    ``consumer`` is Faust's consumer (``assignment``, ``position``, ``earliest_offsets``, ``seek``); ``looks``
    is what the previous call returned; ``acks`` knows which partitions delivered a record since their
    assignment; ``io`` asks for the group's committed offsets. Returns what this look saw, for the next call.
    """
    now: Looks = {}
    due: list[Any] = []
    for tp in sorted(consumer.assignment()):
        key = (tp.topic, tp.partition)
        if tp.topic not in topics or not acks.untouched(*key):
            continue  # a record came since the assignment: gaps after it are with_backfill's
        position = await consumer.position(tp)
        if not position:
            continue
        last = looks.get(key)
        if last is None or last.position != position:
            now[key] = Look(position)  # a first look, or it moved: records may be on their way
            continue
        now[key] = last
        if not last.cleared:
            due.append(tp)
    if not due:
        return now
    committed = await io.committed_offsets([(tp.topic, tp.partition) for tp in due])
    unset = [tp for tp in due if committed[(tp.topic, tp.partition)] is None]
    earliest = await consumer.earliest_offsets(*unset) if unset else {}
    assigned = consumer.assignment()
    for tp in due:
        key = (tp.topic, tp.partition)
        position = now[key].position
        start = committed[key]
        if start is None:
            start = earliest.get(tp, 0)
        if position <= start:
            now[key] = Look(position, cleared=True)
            continue
        if tp not in assigned or not acks.untouched(*key):
            continue  # revoked meanwhile, or a record came after all
        log.warning(
            "%s[%d]: the fetch position is %d but no record since the assignment reached the stage (committed: "
            "%s); seeking back to %d",
            tp.topic, tp.partition, position, committed[key], start,
        )  # fmt: skip
        await consumer.seek(tp, start)
        acks.resumed += 1
        del now[key]
    return now


async def stall_guard(
    consumer: Callable[[], Any], *, topics: Collection[str], acks: OrderedAcks, io: KafkaIO, period_s: float = 5.0
) -> None:
    """Background task: :func:`check_stalls` every ``period_s`` seconds (``consumer()`` gives Faust's consumer)."""
    looks: Looks = {}
    while True:
        await asyncio.sleep(period_s)
        try:
            looks = await check_stalls(consumer(), looks, topics=topics, acks=acks, io=io)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a rebalance in progress, the broker away: look again next time
            log.debug("stall check skipped: %s", exc)
            looks = {}
