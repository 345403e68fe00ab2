"""What a worker reports about each namespace it owns (``combee status``), when it is idle, and putting a
version Redis lost back."""

from __future__ import annotations

import statistics
import time
from typing import Any

from combee.playbook import render_prompt
from workers.context import StageContext
from workers.health import worker_id
from workers.runtime import NamespaceRuntime
from workers.window import in_flight

__all__ = ["idle", "republish_if_lost", "status_of"]


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


def status_of(ctx: StageContext, rt: NamespaceRuntime) -> dict[str, Any]:
    snap = ctx.snapshots.get(rt.namespace)
    decision = rt.decision
    trial = rt.controller.next_trial()
    lat = [a for a, _ in rt.latencies]
    return {
        "namespace": rt.namespace,
        "version": snap.playbook.version if snap is not None else 0,
        "bullets": len(snap.playbook.bullets) if snap is not None else 0,
        "windows_applied_total": snap.next_seq if snap is not None else 0,
        "traces_seen": rt.traces_seen,
        "buffered": ctx.buffered(rt),
        "windows_in_flight": in_flight(ctx, rt),
        "arrival_rate_per_s": round(rt.arrival_rate(), 3),
        "controller": {
            "profiling": trial is not None,
            "next_trial": trial,
            "trials_left": list(rt.controller.trials_left()),
            "batch_size": decision.batch_size if decision is not None else None,
            "why": rt.controller.profiling_note()
            or (decision.explain() if decision is not None else "profiling done: it decides at the next window"),
            "observations": [list(o) for o in rt.controller.observations[-8:]],
        },
        "latency_close_to_applied_s": {"p50": _quantile(lat, 0.5), "p95": _quantile(lat, 0.95), "n": len(lat)},
        "last_applied_at": rt.last_applied_at,
        "worker": worker_id(),
        "updated_at": time.time(),
    }


async def republish_if_lost(ctx: StageContext, rt: NamespaceRuntime) -> bool:
    """Offer the namespace's newest version again when Redis no longer holds it (restarted without its data).

    Otherwise a quiet namespace would have no prompt in Redis until it learns its next version. Returns True
    when it re-offered. Raises what the store raises (Redis down): the caller's loop tries again later.
    """
    snap = ctx.snapshots.get(rt.namespace)
    if snap is None or snap.playbook.version == 0 or ctx.publisher.pending_version(rt.namespace) is not None:
        return False
    current = await ctx.store.current(rt.namespace)
    if current is not None and current.version >= snap.playbook.version:
        return False
    pb = snap.playbook
    ctx.publisher.forget_published(rt.namespace)
    ctx.publisher.offer(rt.namespace, pb.version, render_prompt(pb), pb.model_dump_json(), window_id=None, meta={})
    return True


def idle(ctx: StageContext, quiet_s: float) -> bool:
    """Nothing buffered, queued, open or in flight, nothing to publish, and no record for ``quiet_s``."""
    if time.monotonic() - ctx.last_activity < quiet_s:
        return False
    if ctx.in_flight_tasks or any(not t.done() for t in ctx.tasks):
        return False
    if getattr(ctx.publisher, "pending", 0):
        return False
    if ctx.outcomes is not None and ctx.outcomes.busy():
        return False
    for rt in ctx.runtimes.values():
        if ctx.buffered(rt) or not rt.map_queue.empty() or rt.mapping or rt.open_windows or rt.closed_pending:
            return False
    return True
