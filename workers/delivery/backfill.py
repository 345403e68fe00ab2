"""Intake of a stage's events: each record once, and none skipped.

Library behaviour answered (faust-streaming 0.15, docs/reliability.md): a stream can hand an agent offsets 85
then 87 and commit past 86; after a rebalance it can resume a partition with no committed offset past records
it handed over in the previous generation (and that this worker dropped unfinished on revocation); and after a
seek back (:mod:`workers.delivery.resume`) it hands over again records the stage already has. So every event
goes through :func:`with_backfill` before its stage sees it: a record seen since the assignment is dropped,
and a gap before the event is read directly from Kafka and handed over first.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from workers.delivery.acks import OrderedAcks, SyntheticEvent, SyntheticMessage
from workers.delivery.kafka_io import KafkaIO

__all__ = ["with_backfill"]

log = logging.getLogger("combee.worker")


async def with_backfill(acks: OrderedAcks, io: KafkaIO, event: Any) -> list[Any]:
    """``event`` preceded by any records of its partition the stream skipped, read directly from Kafka."""
    msg = event.message
    if acks.seen(event):
        # Handed over again (the stall guard sought the partition back, or Faust re-read it): the stage has
        # it already, and doing it twice would learn a trace twice.
        acks.redelivered += 1
        log.info("%s[%d]@%d came again since the assignment; dropped", msg.topic, msg.partition, msg.offset)
        return []
    if msg.offset > 0 and acks.first_since_assignment(event):
        # After a rebalance, faust-streaming can resume a partition with no committed offset past records it
        # handed over in the previous generation (and that this worker dropped unfinished on revocation):
        # the first event must follow the group's committed offset (the log's start when there is none).
        for attempt in range(3):
            try:
                committed = await io.committed(msg.topic, msg.partition)
            except Exception as exc:  # the broker may be restarting: try again, then go on without
                log.warning("committed offset of %s[%d] unknown (%s)", msg.topic, msg.partition, exc)
                await asyncio.sleep(1.0 + attempt)
                continue
            acks.expect(msg.topic, msg.partition, committed if committed is not None else 0)
            break
    gap = acks.gap(event)
    if gap is None:
        return [event]
    first, last = gap
    log.warning("stream skipped %s[%d] offsets %d..%d; reading them directly", msg.topic, msg.partition, first, last)
    events: list[Any] = []
    async for rec in io.read(msg.topic, msg.partition, first):
        if rec.offset > last:
            break
        events.append(SyntheticEvent(SyntheticMessage(msg.topic, msg.partition, rec.offset, rec.key, rec.value)))
    acks.backfilled += len(events)
    return [*events, event]
