"""Applying a finished window: finish its operations against the playbook, apply the delta, and commit the
record (:mod:`workers.combiner.commit`); only then are the window's records acked and its latency counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from combee.corroborate import corroborate_tags
from combee.engine import finish_ops
from combee.evidence import explain_delta
from combee.meter import Meter
from combee.models import Delta, DeltaOp, Playbook
from combee.playbook import apply_delta
from combee.quarantine import quarantined
from streams.envelopes import DeltaRecord
from workers.combiner.commit import commit
from workers.combiner.pending import keep_pending, pending_pool
from workers.combiner.port import CombinerPort
from workers.runtime import NamespaceRuntime
from workers.tenure import OpenWindow

__all__ = ["apply_window"]

log = logging.getLogger("combee.worker.combine")


async def apply_window(ctx: CombinerPort, rt: NamespaceRuntime, w: OpenWindow, ops: tuple[DeltaOp, ...]) -> bool:
    """Apply a finished window that is next in sequence; False when it was not committed (fenced)."""
    plan, state = w.plan, rt.combining
    assert plan is not None and state is not None
    snap = state.snapshot
    current = snap.playbook if snap is not None else Playbook(namespace=rt.namespace)
    meter = Meter()
    # logged finished (copies folded, records refused, sections canonical, near duplicates folded): a replay
    # needs no vectors
    cfg = ctx.config.method
    finished = await finish_ops(
        ops, current, cfg, ctx.dedup, meter, pending=await pending_pool(ctx, state), producers=plan.producers,
        verified=plan.verified_producers, window_id=w.window_id, at=time.time(), graded=plan.feedback_producers,
        lessons=plan.lessons or None,  # a plan from before lessons were carried: not known
        runs=plan.run_facts or None,  # a plan from before run facts were carried: the rules that need no run
    )  # fmt: skip
    proposed, ops, corroborated = ops, finished.ops, finished.corroborated
    tags, held_tags = corroborate_tags(
        plan.tag_counts, current, cfg.corroboration_for(rt.namespace), taggers=plan.harmful_taggers,
        producers=plan.producers,
    )  # fmt: skip
    meter.hold({"harmful_tag": held_tags} if held_tags else {})
    delta = Delta(
        namespace=rt.namespace,
        window_id=w.window_id,
        base_version=plan.base_version,
        ops=ops,
        tag_counts=tags,
        trace_count=plan.trace_count,
        verified_producers=_producers(plan.verified_producers, corroborated.verified if corroborated else None),
        feedback_producers=_producers(plan.feedback_producers, corroborated.graded if corroborated else None),
    )
    playbook, stats = apply_delta(current, delta, ctx.config.method.policy)
    held = quarantined(rt.namespace, w.window_id, current.version, finished.quarantined, at=time.time())
    record = DeltaRecord(
        namespace=rt.namespace,
        version=playbook.version,
        window_id=w.window_id,
        seq=plan.seq,
        source=plan.source,
        last_offset=plan.last_offset,
        offsets=plan.offsets,
        seed_key=plan.seed_key or None,
        delta=delta,
        trace_count=plan.trace_count,
        entries=len(playbook.bullets),
        closed_at=plan.closed_at,
        applied_at=time.time(),
        critical_path_s=_critical_path(w),
        shape=plan.shape,
        epoch=state.tenure.epoch,
        trace_ids=plan.trace_ids,
        evidence=explain_delta(current, proposed, ops, playbook, plan.lessons),
        quarantined=held,
    )
    rt.applied_version(playbook.version, plan.closed_at)  # before the offer: Redis may take it at once
    if not await commit(ctx, rt, record, playbook, plan.seq + 1, plan.source):
        return False
    for e in w.events:
        await ctx.acks.done(e)
    for entry in held:
        ctx.metrics.bullet_quarantined(rt.namespace, entry.reason)
    for reason, n in sorted(meter.held.items()):
        ctx.metrics.lessons_held(rt.namespace, reason, n)
    await keep_pending(ctx, state, corroborated)
    del state.windows[w.window_id]
    state.by_seq.pop(plan.seq, None)
    rt.windows_applied += 1
    rt.last_applied_at = time.time()
    ctx.metrics.window_applied(rt.namespace, record.applied_at - plan.closed_at)
    closed = rt.closed_at.pop(w.window_id, None)
    if closed is not None:
        rt.controller.observe(plan.trace_count, time.monotonic() - closed)
    rt.latencies.append((record.applied_at - plan.closed_at, record.critical_path_s))
    log.info(
        "applied %s as v%d: +%d ~%d -%d, %d bullets (%d deduplicated, %d near duplicates folded in %.0f ms, "
        "%d evicted)",
        w.window_id, playbook.version, stats.added, stats.updated, stats.removed, len(playbook.bullets),
        stats.deduplicated, meter.folded_ops, meter.dedup_s * 1000, stats.evicted,
    )  # fmt: skip
    ctx.wake.set()
    return True


def _critical_path(w: OpenWindow) -> float:
    """Map time plus the longest chain of service times through the reduce (a tree, or a forest's longest)."""
    assert w.plan is not None and w.tracker is not None
    level_cost = [w.service.get((1, g), 0.0) for g in range(w.plan.groups)]
    longest = max(level_cost, default=0.0)
    for i, level in enumerate(w.plan.tree):
        level_cost = [
            w.service.get((i + 2, j), 0.0) + max((level_cost[c] for c in children), default=0.0)
            for j, children in enumerate(level)
        ]
        longest = max(longest, *level_cost) if level_cost else longest
    return w.plan.map_service_s + longest


def _producers(window: dict[str, str], went_live: Mapping[str, str] | None) -> dict[str, str]:
    """Trace -> producer for a delta: the window's own, and those of the pending lessons that went live in it
    (their traces came in earlier windows). Used for verified producers and for trusted feedback's."""
    return {**(went_live or {}), **window}
