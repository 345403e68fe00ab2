"""A combiner's tenure over one partition of the deltas log: its claim, its view of the snapshots, its fence.

A combiner that becomes ready for a partition appends a :class:`~streams.envelopes.Claim` there; the claim's
offset is the tenure's *epoch* and every delta record of the tenure carries it. After appending a record, and
before anything else depends on it (snapshot, checkpoint, Redis, acks), the combiner reads the partition up to
that record (:meth:`Tenure.check`): a claim by anyone else in between means the partition has a new owner and
the record is fenced — invalid for every reader (:mod:`streams.deltalog`). The tenure then stands down.

The tenure keeps its own view of the partition's snapshots, so that work still in flight when the partition
is revoked (the revocation wipes the shared snapshot table) is judged and finished against the state it
started from: the log, not the local view of the assignment, decides whether it counts. It also owns the
combiner's state of each namespace it combines (:class:`Combining`: open windows, recent versions, the pending
pool), so that state starts empty with each tenure and ends with it.

:class:`Tenures` is the one registry of this process's tenures: which one is current for each partition,
which are ready, how often each partition was revoked, and the writes that were fenced.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from combee.corroborate import PendingLesson
from combee.models import Playbook
from combee.scan import ReduceTracker
from streams.deltalog import ClaimTracker, Position, decode_log_record
from streams.envelopes import Claim, DeltaRecord, Snapshot, WindowPlan
from workers.delivery.kafka_io import KafkaIO

__all__ = ["Combining", "OpenWindow", "Tenure", "Tenures"]

log = logging.getLogger("combee.worker.combine")


@dataclass
class OpenWindow:
    """A window the combiner knows of but has not applied: its plan (once arrived), partials and held events."""

    window_id: str
    plan: WindowPlan | None = None
    tracker: ReduceTracker | None = None
    early: list[tuple[int, int, tuple[Any, ...]]] = field(default_factory=list)  # partials before the plan
    events: list[Any] = field(default_factory=list)
    service: dict[tuple[int, int], float] = field(default_factory=dict)  # node -> service seconds


@dataclass
class Combining:
    """The combiner's state of one namespace under one tenure (:meth:`Tenure.combining`)."""

    namespace: str
    tenure: Tenure
    windows: dict[str, OpenWindow] = field(default_factory=dict)
    by_seq: dict[int, str] = field(default_factory=dict)  # sequence number -> window id, for windows planned
    playbooks: dict[int, Playbook] = field(default_factory=dict)  # recent versions, for stale merges
    # lessons waiting for corroboration (None: not loaded from Redis yet) and the pool ids whose change is not
    # yet written there (workers/combiner/pending.py)
    pending: tuple[PendingLesson, ...] | None = None
    pending_unsaved: set[str] = field(default_factory=set)

    @property
    def snapshot(self) -> Snapshot | None:
        """The namespace's snapshot as this tenure sees it."""
        return self.tenure.snapshots.get(self.namespace)

    def drop_windows(self) -> None:
        """Forget the open windows (the tenure stood down: their records are the partition's new owner's)."""
        self.windows.clear()
        self.by_seq.clear()


@dataclass
class Tenure:
    """One claim of one partition by this process (see the module docstring)."""

    partition: int
    epoch: int  # offset of our claim in the partition
    owner: str
    snapshots: dict[str, Snapshot] = field(default_factory=dict)  # the combiner's view (namespace -> snapshot)
    fenced_at: int | None = None  # offset of the first claim after ours
    fenced_by: str | None = None  # its owner
    checked_to: int = -1  # every offset up to here was read: no other claim among them unless fenced_at says so
    # our records that are logged but not yet in a snapshot (offset -> namespace): a checkpoint stays below them
    pending: dict[int, str] = field(default_factory=dict)
    _tracker: ClaimTracker = field(default_factory=ClaimTracker)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _combining: dict[str, Combining] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.checked_to = max(self.checked_to, self.epoch)
        self._tracker = ClaimTracker(self.epoch)

    @property
    def fenced(self) -> bool:
        return self.fenced_at is not None

    def combining(self, namespace: str) -> Combining:
        """The combiner's state of ``namespace`` under this tenure (empty the first time)."""
        state = self._combining.get(namespace)
        if state is None:
            state = self._combining[namespace] = Combining(namespace, self)
        return state

    def release(self, namespace: str) -> None:
        """``namespace`` was evicted from this process (nothing of it in hand): let go of its combiner state, as
        of the runtime that held it; if it comes back, it starts from its snapshot and reloads its pool."""
        self._combining.pop(namespace, None)

    def stand_down(self) -> None:
        """Another process owns the partition: forget the snapshots and every namespace's open windows."""
        for state in self._combining.values():
            state.drop_windows()
        self.snapshots.clear()

    def logged(self, offset: int, namespace: str) -> None:
        """Our record at ``offset`` is in the log; its snapshot is not written yet."""
        self.pending.setdefault(offset, namespace)

    def snapshotted(self, namespace: str, offset: int) -> None:
        """``namespace``'s snapshot now holds the log up to ``offset`` (and so every earlier record of it)."""
        for o in [o for o, ns in self.pending.items() if ns == namespace and o <= offset]:
            del self.pending[o]

    def checkpoint(self) -> Position | None:
        """A position every record up to which is in the snapshots, with the epoch in force there (ours): the
        offset before our oldest record not yet snapshotted, and never past what was read. None once fenced
        (the epoch in force past the fence is not ours)."""
        if self.fenced:
            return None
        low = min(self.pending) - 1 if self.pending else self.checked_to
        return Position(min(low, self.checked_to), self.epoch)

    async def check(self, io: KafkaIO, topic: str, offset: int, retry_s: float = 1.0) -> bool:
        """Whether our record at ``offset`` is valid: no other claim lies between our claim and it.

        Reads the partition from where the last check stopped up to ``offset``. The record was acknowledged
        (acks=all), so it is readable; a read that fails or stops short (a broker restarting) is retried until
        it gets there — the record's fate must be known before anything depends on it.
        """
        async with self._lock:
            attempt = 0
            while self.fenced_at is None and self.checked_to < offset:
                try:
                    async with aclosing(io.read(topic, self.partition, self.checked_to + 1)) as records:
                        async for rec in records:
                            if rec.offset > offset:
                                break
                            record = decode_log_record(rec.value)
                            if record is not None and self._judge(rec.offset, record):
                                break
                            self.checked_to = rec.offset
                except Exception as exc:  # the broker may be restarting: the answer is still needed
                    log.warning("deltas[%d]: reading up to %d failed (%s); retrying", self.partition, offset, exc)
                if self.fenced_at is None and self.checked_to < offset:
                    attempt += 1
                    await asyncio.sleep(min(30.0, retry_s * attempt))
            return self.fenced_at is None or offset < self.fenced_at

    def _judge(self, offset: int, record: Claim | DeltaRecord) -> bool:
        """Account for one record read; True when it fences us."""
        verdict = self._tracker.judge(offset, record)
        if isinstance(record, Claim) and offset != self.epoch:
            self.fenced_at, self.fenced_by = offset, record.owner
            return True
        if verdict == "valid" and isinstance(record, DeltaRecord):
            self.logged(offset, record.namespace)  # ours, maybe not yet registered by its writer
        return False


@dataclass
class Tenures:
    """This process's tenures of the deltas log's partitions, one per partition at most (the combiner's state).

    A tenure is *held* from its claim until its partition is revoked (or its readying is voided), *current*
    while held and not fenced, and *ready* once the snapshots are recovered and the log replayed up to its
    claim. Revocations are counted per partition: a claim readied across one is void.
    """

    fenced_writes: int = 0  # delta records this process logged after another owner's claim (refused)
    _held: dict[int, Tenure] = field(default_factory=dict)
    _ready: set[int] = field(default_factory=set)
    _revocations: dict[int, int] = field(default_factory=dict)
    _locks: dict[int, asyncio.Lock] = field(default_factory=dict)

    def get(self, partition: int) -> Tenure | None:
        """The tenure held for ``partition`` (ready or not, fenced or not), if any."""
        return self._held.get(partition)

    def ready(self, partition: int) -> Tenure | None:
        """The tenure held for ``partition`` once it is ready; None while there is none, or it is being readied."""
        tenure = self._held.get(partition)
        return tenure if partition in self._ready else None

    def held(self) -> list[Tenure]:
        return list(self._held.values())

    def holds(self, tenure: Tenure) -> bool:
        return self._held.get(tenure.partition) is tenure

    def is_current(self, tenure: Tenure) -> bool:
        return self.holds(tenure) and not tenure.fenced

    def lock(self, partition: int) -> asyncio.Lock:
        """Held while a tenure of ``partition`` is being readied (one claim at a time)."""
        return self._locks.setdefault(partition, asyncio.Lock())

    def revocations(self, partition: int) -> int:
        return self._revocations.get(partition, 0)

    def claimed(self, tenure: Tenure) -> None:
        """``tenure`` claimed its partition: it is held (not yet ready)."""
        self._held[tenure.partition] = tenure

    def made_ready(self, tenure: Tenure) -> None:
        self._ready.add(tenure.partition)

    def void(self, tenure: Tenure) -> None:
        """A claim revoked while it was being readied: no longer held (if it still was)."""
        if self.holds(tenure):
            del self._held[tenure.partition]

    def revoke(self, partition: int) -> None:
        """``partition`` was revoked: its tenure is no longer held (work still in flight finishes under it, or is
        fenced) and a claim being readied is void; the next record claims it anew."""
        self._ready.discard(partition)
        self._revocations[partition] = self._revocations.get(partition, 0) + 1
        self._held.pop(partition, None)
