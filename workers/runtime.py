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
from combee.fanout import ReflectionGather
from combee.models import Trace
from streams.envelopes import Reflected
from workers.tenure import Combining, Tenure

__all__ = ["Awaited", "Buffered", "Gathers", "NamespaceRuntime"]


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
    # combiner: its state of this namespace, owned by the tenure it is bound to (workers/tenure.py: the state
    # ends with its tenure, so work of an ended tenure never mixes in); None until a record binds it
    combining: Combining | None = None
    applied: asyncio.Condition = field(default_factory=asyncio.Condition)  # the map stage waits for its turn here
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed_at: dict[str, float] = field(default_factory=dict)
    # versions applied here and not yet seen in Redis -> their window's closing time (wall clock), for the
    # closed-to-published latency
    unpublished: dict[int, float] = field(default_factory=dict)
    # counters (status)
    traces_seen: int = 0
    dead_lettered: int = 0
    windows_closed: int = 0
    windows_applied: int = 0
    last_applied_at: float | None = None
    latencies: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=256))

    @property
    def tenure(self) -> Tenure | None:
        """The tenure the combiner's state of this namespace is bound to (None: not bound)."""
        return self.combining.tenure if self.combining is not None else None

    @property
    def open_windows(self) -> int:
        """Windows the combiner holds open for this namespace (planned or partly merged, not applied)."""
        return len(self.combining.windows) if self.combining is not None else 0

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
