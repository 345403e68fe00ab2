"""In-order acknowledgement of Faust events whose processing finishes out of order.

Library behaviour answered: Faust commits the highest *contiguous* acked offset of a partition, but on a partition
with no committed offset yet it would commit past un-acked earlier events. Stages here finish events out of order
(a window holds its traces until it is delivered; a curate call can overtake another), so every event is
registered on arrival and acked to Faust only when it and every earlier event of its partition are done: a commit
never skips an unfinished record, whatever Faust does with gaps.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OrderedAcks", "SyntheticEvent", "SyntheticMessage"]


@dataclass(frozen=True)
class SyntheticMessage:
    """A record read directly from Kafka to fill a gap the stream skipped (same fields stages use)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True)
class SyntheticEvent:
    message: SyntheticMessage


@dataclass
class _Pending:
    offset: int
    stream: Any
    event: Any
    done: bool = False


@dataclass
class OrderedAcks:
    _queues: dict[tuple[str, int], deque[_Pending]] = field(default_factory=dict)
    _by_key: dict[tuple[str, int, int], _Pending] = field(default_factory=dict)
    _last_seen: dict[tuple[str, int], int] = field(default_factory=dict)
    acked: int = 0
    backfilled: int = 0  # records read directly to fill a gap the stream skipped (workers.delivery.backfill)
    redelivered: int = 0  # records the stream handed over again since the assignment, dropped at intake
    resumed: int = 0  # partitions sought back by the stall guard (workers.delivery.resume)

    def gap(self, event: Any) -> tuple[int, int] | None:
        """The offsets skipped between the previous event of this partition and ``event``, if any.

        faust-streaming 0.15 can hand an agent offsets 85 then 87 and commit past 86 (docs/infrastructure.md);
        callers read such a gap directly and process it first, so a skipped record is never a lost one.
        """
        msg = event.message
        key = (msg.topic, msg.partition)
        last = self._last_seen.get(key)
        if last is None or msg.offset > last:
            self._last_seen[key] = msg.offset
        if last is None or msg.offset <= last + 1:
            return None
        return last + 1, msg.offset - 1

    def first_since_assignment(self, event: Any) -> bool:
        """True for the first event of its partition since the partition was (re)assigned to this worker."""
        msg = event.message
        return self.untouched(msg.topic, msg.partition)

    def untouched(self, topic: str, partition: int) -> bool:
        """True while no event of the partition has come since it was (re)assigned to this worker."""
        return (topic, partition) not in self._last_seen

    def seen(self, event: Any) -> bool:
        """True for an event at or before the last offset of its partition seen since the assignment (or before
        the committed offset :meth:`expect` was told): the stream handed it over again, after a seek back."""
        msg = event.message
        last = self._last_seen.get((msg.topic, msg.partition))
        return last is not None and msg.offset <= last

    def expect(self, topic: str, partition: int, next_offset: int) -> None:
        """The first offset still to process in a partition just assigned: a first event beyond it is a gap
        that :meth:`gap` reports like any other."""
        self._last_seen[(topic, partition)] = next_offset - 1

    def add(self, stream: Any, event: Any) -> None:
        msg = event.message
        key = (msg.topic, msg.partition, msg.offset)
        if key in self._by_key:
            return
        entry = _Pending(msg.offset, None if isinstance(event, SyntheticEvent) else stream, event)
        self._queues.setdefault((msg.topic, msg.partition), deque()).append(entry)
        self._by_key[key] = entry

    async def done(self, event: Any) -> None:
        """Mark ``event`` processed; ack it and every finished event before it in its partition."""
        msg = event.message
        entry = self._by_key.get((msg.topic, msg.partition, msg.offset))
        if entry is None:
            return
        entry.done = True
        queue = self._queues[(msg.topic, msg.partition)]
        while queue and queue[0].done:
            head = queue.popleft()
            del self._by_key[(msg.topic, msg.partition, head.offset)]
            if head.stream is not None:  # a backfilled record: Faust never handed it over, nothing to ack
                await head.stream.ack(head.event)
            self.acked += 1

    def pending(self) -> int:
        return len(self._by_key)

    def next_unfinished(self, topic: str, partition: int) -> int | None:
        """The first offset of the partition not yet done (None: no event of it seen since its assignment)."""
        queue = self._queues.get((topic, partition))
        if queue:
            return queue[0].offset
        last = self._last_seen.get((topic, partition))
        return None if last is None else last + 1

    def forget(self, topic: str, partition: int) -> None:
        """Drop everything of a revoked partition (its new owner re-reads it from the last commit)."""
        self._last_seen.pop((topic, partition), None)
        queue = self._queues.pop((topic, partition), deque())
        for entry in queue:
            self._by_key.pop((topic, partition, entry.offset), None)
