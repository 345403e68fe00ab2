"""What one worker process knows about each namespace it owns, and the shared context of its stages.

The window stage, the map stage and the combiner of a namespace run in the same process (their topics are
co-partitioned by namespace), so they share this in-memory view; anything that must survive a crash lives
in Kafka (tables, the deltas log). Nothing here decides anything: the policies are in :mod:`combee`.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from combee.controller import BatchSizeController, ControllerDecision
from combee.corroborate import PendingLesson
from combee.fanout import ReflectionGather
from combee.models import Playbook, Trace
from combee.scan import ReduceTracker
from streams.envelopes import Reflected, WindowPlan
from workers.tenure import Tenure

__all__ = ["Awaited", "Buffered", "Gathers", "NamespaceRuntime", "OpenWindow"]


@dataclass
class Buffered:
    offset: int
    trace: Trace
    event: Any
    size: int
    received_at: float
    producer: str | None = None  # verified producer (combee.identity), None when the trace is not signed
    # trusted feedback (combee.feedback): the producer whose record the trace was joined to, and that record's
    # event, acknowledged with the trace's once its window is written
    feedback_by: str | None = None
    feedback_events: tuple[Any, ...] = ()


@dataclass
class Awaited:
    """A window whose reflection tasks are out: the answers so far, and an event set when one arrives."""

    gather: ReflectionGather
    arrived: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Gathers:
    """Reflection answers the map stage of this process awaits, by window id.

    An answer nobody awaits yet (a window this process took over and has not mapped again; a duplicate) is
    kept, at most ``early_limit`` of them, oldest dropped first: mapped again, the window uses it instead of
    reflecting that slice twice. Dropping one only costs the slice's reflector calls again.
    """

    awaited: dict[str, Awaited] = field(default_factory=dict)
    early: OrderedDict[tuple[str, int, int], Reflected] = field(default_factory=OrderedDict)
    early_limit: int = 4096

    def expect(self, window_id: str, gather: ReflectionGather) -> Awaited:
        """Await ``gather``'s answers for ``window_id``, taking those that arrived before."""
        waiting = self.awaited[window_id] = Awaited(gather)
        for index in range(len(gather.slices)):
            env = self.early.pop((window_id, index, gather.base_version), None)
            if env is not None:
                gather.add(env.index, env.base_version, env.reflections, env.service_s)
        return waiting

    def offer(self, env: Reflected) -> bool:
        """An answer arrived; True when an awaited window kept it."""
        waiting = self.awaited.get(env.window_id)
        if waiting is not None:
            kept = waiting.gather.add(env.index, env.base_version, env.reflections, env.service_s)
            if kept:
                waiting.arrived.set()
            return kept
        key = (env.window_id, env.index, env.base_version)
        if key not in self.early:
            self.early[key] = env
            while len(self.early) > self.early_limit:
                self.early.popitem(last=False)
        return False

    def done(self, window_id: str) -> None:
        self.awaited.pop(window_id, None)


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
class NamespaceRuntime:
    namespace: str
    partition: int
    controller: BatchSizeController
    # window stage (per source partition buffers: traces may arrive on any partition)
    buffers: dict[int, list[Buffered]] = field(default_factory=dict)
    # offsets held back per source partition while the buffer was full, oldest first (workers/holdback.py)
    held: dict[int, deque[int]] = field(default_factory=dict)
    last_active: float = field(default_factory=time.monotonic)  # last trace taken or window applied
    # ids of windows closed by this process that the map stage has not yet seen (accepted or dropped as a
    # duplicate): a set, not a counter, so that a window closed by an earlier process and redelivered here
    # cannot release a slot it never took, and every path through the map stage releases the one it did
    unseen_windows: set[str] = field(default_factory=set)
    arrivals: deque[float] = field(default_factory=lambda: deque(maxlen=512))
    decision: ControllerDecision | None = None
    # map stage
    map_queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    mapper: asyncio.Task[None] | None = None
    accepted_seq: int = -1
    mapping: bool = False
    # combiner (its state belongs to one tenure of the partition: work of an ended tenure never mixes in)
    tenure: Tenure | None = None
    windows: dict[str, OpenWindow] = field(default_factory=dict)
    by_seq: dict[int, str] = field(default_factory=dict)
    playbooks: dict[int, Playbook] = field(default_factory=dict)  # recent versions, for stale merges
    applied: asyncio.Condition = field(default_factory=asyncio.Condition)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed_at: dict[str, float] = field(default_factory=dict)
    # versions applied here and not yet seen in Redis -> their window's closing time (wall clock), for the
    # closed-to-published latency
    unpublished: dict[int, float] = field(default_factory=dict)
    # lessons waiting for corroboration (None: not loaded from Redis in this tenure) and the pool ids whose
    # change is not yet written there (workers/pending.py)
    pending: tuple[PendingLesson, ...] | None = None
    pending_unsaved: set[str] = field(default_factory=set)
    # counters (status)
    traces_seen: int = 0
    dead_lettered: int = 0
    windows_closed: int = 0
    windows_applied: int = 0
    last_applied_at: float | None = None
    latencies: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=256))

    @property
    def closed_pending(self) -> int:
        """Windows closed here and not yet seen by the map stage."""
        return len(self.unseen_windows)

    def window_seen(self, offered_id: str, kept_id: str | None) -> None:
        """The map stage saw window ``offered_id``: release its slot; its closing time follows the kept cut
        (``kept_id``, which differs when traces were stripped) or is dropped with it (``None``: a duplicate)."""
        self.unseen_windows.discard(offered_id)
        closed = self.closed_at.pop(offered_id, None)
        if closed is not None and kept_id is not None:
            self.closed_at[kept_id] = closed

    def applied_version(self, version: int, closed_at: float, keep: int = 64) -> None:
        """Version ``version`` was applied from a window closed at ``closed_at`` (wall clock)."""
        self.unpublished[version] = closed_at
        for old in sorted(self.unpublished)[:-keep]:
            del self.unpublished[old]

    def published(self, version: int) -> float | None:
        """Redis holds ``version``: forget it and every older version; returns its window's closing time when
        it was applied here (None for a version applied elsewhere, or superseded before it was published)."""
        closed = self.unpublished.get(version)
        for v in [v for v in self.unpublished if v <= version]:
            del self.unpublished[v]
        return closed

    def buffered(self) -> int:
        """Traces in the window buffers (:meth:`workers.context.StageContext.buffered` adds those waiting for
        their trusted feedback)."""
        return sum(len(b) for b in self.buffers.values())

    def held_back(self) -> int:
        return sum(len(h) for h in self.held.values())

    def arrival_rate(self, now: float | None = None, horizon_s: float = 60.0) -> float:
        """Traces per second over the last ``horizon_s`` seconds (0 when idle)."""
        now = time.monotonic() if now is None else now
        recent = [t for t in self.arrivals if now - t <= horizon_s]
        if len(recent) < 2:
            return 0.0
        span = max(now - recent[0], 1e-3)
        return len(recent) / span
