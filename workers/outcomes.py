"""Outcome counting in the window stage: note each trace's observation, count it in Redis, then let it be acked.

Exactly once, the same way the rest of the stream gets it: a trace's offset is committed to Kafka only after
its window is written *and* its observation is counted (:class:`OutcomeRecorder` holds the window's acks until
the batch holding them is in Redis), so a crash never skips a count; and the Redis script counts only offsets
above the partition's mark, so a redelivered trace (a restart re-reads from the committed offset, which lags
the mark) is never counted twice. Redis down: windows still go out and learning goes on; only the acks wait,
and the flush loop tries again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from combee.outcomes import Observation, OutcomeCounts, fold_versions
from streams.redis_outcomes import RecordResult

__all__ = [
    "DEFAULT_LABELLED_VERSIONS",
    "OutcomeRecorder",
    "OutcomeStore",
    "flush_loop",
    "outcome_totals",
]

log = logging.getLogger("combee.worker.outcomes")
DEFAULT_LABELLED_VERSIONS = 5
"""Versions per namespace with a Prometheus label of their own; older ones are summed as ``older``."""


class OutcomeStore(Protocol):
    """What :class:`streams.redis_outcomes.RedisOutcomes` offers the recorder."""

    async def record(self, namespace: str, partition: int, observations: Sequence[Observation]) -> RecordResult: ...
    async def counts(self, namespace: str) -> dict[str, OutcomeCounts]: ...


@dataclass
class _Lane:
    """One (namespace, traces partition): observations not yet counted and events whose ack waits for them."""

    pending: list[Observation] = field(default_factory=list)
    held: list[Any] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class OutcomeRecorder:
    store: OutcomeStore
    ack: Callable[[Any], Awaitable[None]]
    lanes: dict[tuple[str, int], _Lane] = field(default_factory=dict)
    counted: int = 0  # observations this process counted (not counted before by anyone)
    skipped: int = 0  # observations offered again and found counted (redeliveries)

    def note(self, namespace: str, partition: int, observation: Observation | None) -> None:
        """A trace of ``namespace`` arrived at its partition (in offset order); None: it names no version."""
        if observation is not None:
            self.lanes.setdefault((namespace, partition), _Lane()).pending.append(observation)

    def release(self, namespace: str, partition: int, events: Sequence[Any]) -> None:
        """``events`` are done (their window is written): ack them once their observations are counted."""
        self.lanes.setdefault((namespace, partition), _Lane()).held.extend(events)

    def busy(self) -> bool:
        return any(lane.pending or lane.held for lane in self.lanes.values())

    def forget(self, partition: int) -> None:
        """The traces partition was revoked: its new owner re-reads it from the committed offset."""
        for key in [k for k in self.lanes if k[1] == partition]:
            del self.lanes[key]

    async def flush(self) -> None:
        """Count every lane's pending observations, then ack the events held before the count began. Raises
        what the store raises (Redis down); the lane keeps its observations and its held events."""
        for key, lane in list(self.lanes.items()):
            async with lane.lock:
                if self.lanes.get(key) is not lane:
                    continue  # revoked meanwhile
                held, batch = list(lane.held), list(lane.pending)
                if batch:
                    result = await self.store.record(key[0], key[1], batch)
                    self.counted += result.counted
                    self.skipped += result.skipped
                    del lane.pending[: len(batch)]
                del lane.held[: len(held)]
                for event in held:
                    await self.ack(event)
                if not lane.pending and not lane.held:
                    self.lanes.pop(key, None)


async def flush_loop(recorder: OutcomeRecorder, tick_s: float = 0.2) -> None:
    """Background task: flush every ``tick_s``; a Redis failure is logged and tried again."""
    failures = 0
    while True:
        await asyncio.sleep(tick_s if failures == 0 else min(5.0, tick_s * 2**failures))
        try:
            await recorder.flush()
            failures = 0
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis down: the acks wait, learning does not
            failures += 1
            level = logging.WARNING if failures % 20 == 1 else logging.DEBUG
            log.log(level, "outcomes not counted yet (%s); trying again", exc)


async def outcome_totals(
    store: OutcomeStore, namespaces: Sequence[str], live: Callable[[str], int | None], keep: int
) -> dict[str, dict[str, OutcomeCounts]]:
    """Per namespace, its counts with at most ``keep`` numbered versions (:func:`combee.outcomes.fold_versions`)."""
    return {ns: fold_versions(await store.counts(ns), live(ns), keep) for ns in namespaces}
