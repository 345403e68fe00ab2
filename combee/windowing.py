"""Streaming windows, decided by pure functions: when a window closes, and how a window is accepted.

**Closing** (:func:`close_size`): a namespace's window may close only while fewer than ``max_inflight``
of its windows are unapplied (1 = the paper's synchronous iteration). Then it closes when the buffer holds the
controller's target, or when the oldest buffered trace has waited ``max_wait_s`` (a trickle is still learned).
When the buffer has grown past the target — the pipeline fell behind the arrival rate — the window takes the
whole backlog up to ``bs_max``, so lag cannot grow without bound while the controller catches up.

**Accepting** (:func:`accept_window`): Kafka delivers at least once, so after a crash the same traces can be
offered again, possibly cut into different windows. The map stage keeps, per namespace, the highest offset
already windowed per source and the ids of recently accepted windows. A window seen before keeps its sequence
number; traces at or below the watermark are stripped (they belong to an earlier window); what remains becomes
a new window with the next sequence number. Sequence numbers fix the order windows are applied in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from combee.models import Trace
from combee.plan import window_id

__all__ = ["Acceptance", "MapState", "WindowPolicy", "accept_window", "close_size"]


@dataclass(frozen=True)
class WindowPolicy:
    max_inflight: int = 1
    max_wait_s: float = 30.0
    bs_min: int = 1
    bs_max: int = 256

    def __post_init__(self) -> None:
        if self.max_inflight < 1 or self.max_wait_s <= 0 or not 1 <= self.bs_min <= self.bs_max:
            raise ValueError("need max_inflight >= 1, max_wait_s > 0 and 1 <= bs_min <= bs_max")


def close_size(
    policy: WindowPolicy, *, buffered: int, oldest_age_s: float, in_flight: int, target: int
) -> tuple[int, str] | None:
    """How many buffered traces to close into a window now, and why — or None to keep waiting."""
    if buffered <= 0 or in_flight >= policy.max_inflight:
        return None
    target = max(policy.bs_min, min(policy.bs_max, target))
    if buffered > target:
        return min(buffered, policy.bs_max), "backlog"
    if buffered == target:
        return target, "size"
    if oldest_age_s >= policy.max_wait_s:
        return buffered, "max_wait"
    return None


@dataclass(frozen=True)
class MapState:
    """Per-namespace acceptance state of the map stage (kept in a changelog-backed table)."""

    next_seq: int = 0
    marks: tuple[tuple[str, int], ...] = ()  # (source, highest offset windowed)
    # (offered window id, seq, first offset kept) of recently accepted windows
    recent: tuple[tuple[str, int, int], ...] = ()
    recent_size: int = 256

    def mark(self, source: str) -> int:
        return dict(self.marks).get(source, -1)

    def accepted(self, offered_id: str) -> tuple[int, int] | None:
        for wid, seq, first in self.recent:
            if wid == offered_id:
                return seq, first
        return None


@dataclass(frozen=True)
class Acceptance:
    """What to do with an offered window: ``traces``/``offsets`` to map under ``window_id`` and ``seq``,
    or nothing (``duplicate`` is then True)."""

    duplicate: bool
    window_id: str = ""
    seq: int = -1
    first_offset: int = -1
    last_offset: int = -1
    traces: tuple[Trace, ...] = ()
    offsets: tuple[int, ...] = ()
    stripped: int = 0
    replayed: bool = False
    state: MapState = field(default_factory=MapState)


def accept_window(
    state: MapState, namespace: str, source: str, offsets: Sequence[int], traces: Sequence[Trace]
) -> Acceptance:
    """Accept an offered window (offsets ascending, one per trace) against ``state``; pure."""
    if len(offsets) != len(traces) or not offsets:
        raise ValueError("a window needs one offset per trace and at least one trace")
    if list(offsets) != sorted(set(offsets)):
        raise ValueError("window offsets must be strictly increasing")
    offered_id = window_id(namespace, source, offsets[0], offsets[-1])
    known = state.accepted(offered_id)
    if known is not None:  # redelivery of a window accepted before: same cut, same seq; map it again
        seq, first_kept = known
        keep = [(o, t) for o, t in zip(offsets, traces, strict=True) if o >= first_kept]
        replayed = True
    else:
        mark = state.mark(source)
        keep = [(o, t) for o, t in zip(offsets, traces, strict=True) if o > mark]
        if not keep:
            return Acceptance(duplicate=True, stripped=len(offsets), state=state)
        seq = state.next_seq
        marks = dict(state.marks)
        marks[source] = keep[-1][0]
        recent = (*state.recent, (offered_id, seq, keep[0][0]))[-state.recent_size :]
        state = MapState(
            next_seq=seq + 1, marks=tuple(sorted(marks.items())), recent=recent, recent_size=state.recent_size
        )
        replayed = False
    kept_offsets = tuple(o for o, _ in keep)
    wid = window_id(namespace, source, kept_offsets[0], kept_offsets[-1])
    return Acceptance(
        duplicate=False,
        window_id=wid,
        seq=seq,
        first_offset=kept_offsets[0],
        last_offset=kept_offsets[-1],
        traces=tuple(t for _, t in keep),
        offsets=kept_offsets,
        stripped=len(offsets) - len(keep),
        replayed=replayed,
        state=state,
    )
