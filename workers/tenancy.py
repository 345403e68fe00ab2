"""The live namespaces of a worker: a new one is taken on within the cap, an idle one is let go.

The decisions are :mod:`combee.namespaces`' (pure); this module gathers what a runtime holds and applies them.
A runtime is only evicted when nothing of its namespace is buffered, held back, queued, open or unapplied in this
process and its newest version is published: everything it learned is then in Kafka (snapshot and map-state
tables, the deltas log), and the runtime built for its next trace continues from there. What is lost is only
what the runtime kept for reporting (counters, arrival times) and the batch-size controller's observations
(the controller profiles again: trial windows are real learning steps).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from combee.namespaces import NAMESPACE_LIMIT_KIND, NamespaceUse, admits, idle_out, limit_reason
from workers.context import StageContext
from workers.runtime import NamespaceRuntime

__all__ = ["admit", "busy", "evict_idle", "in_flight"]

log = logging.getLogger("combee.worker.window")


def in_flight(ctx: StageContext, rt: NamespaceRuntime) -> int:
    """Windows of the namespace closed here or accepted by the map stage and not yet applied."""
    snap = ctx.snapshots.get(rt.namespace)
    applied = snap.next_seq if snap is not None else 0
    return rt.closed_pending + max(0, rt.accepted_seq + 1 - applied)


def busy(ctx: StageContext, rt: NamespaceRuntime) -> bool:
    """Anything of the namespace still in this process's hands (so evicting it now could lose or redo work)."""
    return bool(
        ctx.buffered(rt)
        or rt.held_back()
        or rt.closed_pending
        or in_flight(ctx, rt)
        or not rt.map_queue.empty()
        or rt.mapping
        or (rt.mapper is not None and not rt.mapper.done())
        or rt.open_windows
        or rt.lock.locked()
        or ctx.publisher.pending_version(rt.namespace) is not None
    )


def evict_idle(ctx: StageContext, now: float | None = None) -> list[str]:
    """Let go of every namespace idle for ``namespace_idle_s`` with nothing in hand; returns their names."""
    now = time.monotonic() if now is None else now
    uses = []
    for rt in ctx.runtimes.values():
        in_hand = busy(ctx, rt)
        if in_hand:
            rt.last_active = now  # the idle time counts from when nothing is in hand any more
        uses.append(NamespaceUse(rt.namespace, in_hand, rt.last_active))
    evicted = idle_out(uses, now, ctx.config.namespace_idle_s)
    for ns in evicted:
        tenure = ctx.runtimes.pop(ns).tenure
        if tenure is not None:
            tenure.release(ns)
        ctx.metrics.namespace_evicted(ns)
        log.info("namespace %s idle for %.0fs with nothing in flight: evicted", ns, ctx.config.namespace_idle_s)
    if evicted:
        ctx.metrics.namespaces_live(len(ctx.runtimes))
    return evicted


async def admit(ctx: StageContext, namespace: str, msg: Any) -> NamespaceRuntime | None:
    """The runtime of a trace's namespace, or None when it is new and the worker holds its cap of live namespaces
    even after letting the idle ones go: the record is then dead-lettered with the reason (counted)."""
    cap = ctx.config.max_namespaces
    if not admits(namespace, ctx.runtimes.keys(), cap):
        evict_idle(ctx)
    if not admits(namespace, ctx.runtimes.keys(), cap):
        await ctx.dead_letter("window", limit_reason(namespace, cap), msg)
        ctx.metrics.trace_dead_lettered(namespace, NAMESPACE_LIMIT_KIND)
        return None
    return ctx.runtime(namespace)
