"""Live namespaces of one worker: which ones it may take on, and which idle ones it lets go (pure).

Namespaces are chosen by producers, and a worker keeps in-memory state for each one it has seen (its window
buffers, its controller, its combiner's open windows). :func:`admits` bounds how many it holds at once:
a namespace already live always is admitted, a new one only while fewer than ``cap`` are live. :func:`idle_out`
names the namespaces to evict: nothing buffered, held back or in flight (``busy`` False) and no activity for
``idle_s`` seconds. Evicting one loses nothing: everything it learned is in Kafka (the snapshot and map-state
tables, the deltas log) and the runtime is built again from there when its next trace comes.

Deterministic: the caller passes the time; the same uses give the same answer, in the same order.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

__all__ = ["NAMESPACE_LIMIT_KIND", "NamespaceUse", "admits", "idle_out", "limit_reason"]

NAMESPACE_LIMIT_KIND = "namespace_limit"
"""The dead-letter kind (the metrics' ``reason`` label) of a trace of a new namespace past the cap."""


@dataclass(frozen=True)
class NamespaceUse:
    """What the worker holds for a namespace: ``busy`` when any trace or window of it is buffered, held back,
    queued or unapplied (or its prompt not yet published); ``last_active`` when it last did anything."""

    namespace: str
    busy: bool
    last_active: float


def admits(namespace: str, live: Collection[str], cap: int) -> bool:
    """Whether a trace of ``namespace`` may be taken on by a worker holding the ``live`` namespaces."""
    return namespace in live or len(live) < cap


def limit_reason(namespace: str, cap: int) -> str:
    """The dead letter's reason for a trace that :func:`admits` refused."""
    return f"namespace limit: {namespace!r} is new and this worker already holds its cap of {cap} live namespaces"


def idle_out(uses: Iterable[NamespaceUse], now: float, idle_s: float) -> list[str]:
    """The namespaces to evict at ``now``: not busy and inactive for at least ``idle_s`` seconds, the longest
    idle first (ties by name). A busy namespace is never named, however long its last activity is ago."""
    idle = [u for u in uses if not u.busy and now - u.last_active >= idle_s]
    return [u.namespace for u in sorted(idle, key=lambda u: (u.last_active, u.namespace))]
