"""Combiner: the incremental scan merge and the one writer of each namespace's playbook.

Window plans and partial deltas arrive on the partials topic (keyed by namespace). Merge calls start as
soon as a node's own children are present (:class:`combee.scan.ReduceTracker`); windows are applied strictly
in sequence order. Applying a window is: append the delta record to the deltas log (the commit point), write
the snapshot table, checkpoint, offer the version to Redis (compare-and-set, retried in the background), and
only then ack the window's records (:mod:`workers.combiner.commit`). After a crash, :func:`ensure_ready` replays the
log's tail onto the recovered snapshots, so no window is applied twice and none is lost.

Ownership of a partition is decided by the deltas log itself: :func:`ensure_ready` first appends a claim
(:class:`~workers.combiner.tenure.Tenure`), every record carries the claim's offset as its epoch, and a record that
lands after someone else's claim is fenced — not snapshotted, not published, not acked (docs/reliability.md,
"Fencing zombie combiners").
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

from combee.corroborate import corroborate_tags
from combee.engine import Finished, finish_ops
from combee.evidence import explain_delta
from combee.llm import Role
from combee.meter import Meter
from combee.models import Delta, DeltaOp, Playbook
from combee.playbook import apply_delta
from combee.quarantine import quarantined
from combee.roles import merge
from combee.scan import ReadyNode, ReduceTracker
from streams.control_auth import refusal
from streams.envelopes import Control, DeltaRecord, Partial, WindowPlan
from workers.combiner.bullets import operate
from workers.combiner.claim import bind, ensure_ready
from workers.combiner.commit import commit, commit_control, is_current, snapshot_of
from workers.combiner.pending import keep_pending, pending_pool
from workers.context import StageContext
from workers.promotion import handle_promotion, serve_rollback
from workers.runtime import NamespaceRuntime, OpenWindow

__all__ = ["ensure_ready", "handle_partial"]

log = logging.getLogger("combee.worker.combine")


async def handle_partial(ctx: StageContext, stream: Any, event: Any) -> None:
    kinds = (WindowPlan, Partial, Control)
    env = cast(
        "WindowPlan | Partial | Control | None",
        await ctx.receive(stream, event, kinds, "combine", "a record of the partials topic"),
    )
    if env is None:
        return
    msg = event.message
    refused = refusal(env, ctx.config.control_key) if isinstance(env, Control) else None
    if refused is not None:  # a control record not signed with this worker's key: never applied
        ctx.metrics.control_refused(refused[0])
        await ctx.dead_letter("combine", refused[1], msg)
        await ctx.acks.done(event)
        return
    tenure = await ensure_ready(ctx, msg.partition)
    if not is_current(ctx, tenure):
        return  # another tenure owns the partition now (maybe ours, after a rebalance): it redoes this record
    rt = bind(ctx, tenure, env.namespace)
    async with rt.lock:
        if isinstance(env, Control):
            if env.kind == "rollback":
                await _rollback(ctx, rt, env)
            elif env.kind in ("promote", "reject"):
                await handle_promotion(ctx, rt, env)
            else:
                await operate(ctx, rt, env)
            await ctx.acks.done(event)
            return
        snap = tenure.snapshots.get(env.namespace)
        if snap is not None and env.window_id in snap.applied:
            await ctx.acks.done(event)  # a redelivery of a window already applied
            return
        w = rt.windows.setdefault(env.window_id, OpenWindow(env.window_id))
        w.events.append(event)
        if isinstance(env, WindowPlan):
            if snap is not None and env.seq < snap.next_seq:  # applied long ago (older than the ledger)
                for e in rt.windows.pop(env.window_id).events:
                    await ctx.acks.done(e)
                return
            if w.plan is None:
                w.plan = env
                w.tracker = ReduceTracker(env.groups, env.tree, env.roots, env.unite)
                rt.by_seq[env.seq] = env.window_id
                for level, index, ops in w.early:
                    w.tracker.add(level, index, ops)
                w.early.clear()
        elif w.tracker is not None:
            if w.tracker.add(env.level, env.index, env.ops):
                w.service[(env.level, env.index)] = env.service_s
        else:
            w.early.append((env.level, env.index, env.ops))
            w.service[(env.level, env.index)] = env.service_s
        await _progress(ctx, rt)


async def _progress(ctx: StageContext, rt: NamespaceRuntime) -> None:
    """Start every ready merge; apply every finished window that is next in sequence. Caller holds rt.lock."""
    if rt.tenure is None or rt.tenure.fenced:
        return
    for w in rt.windows.values():
        if w.tracker is not None:
            for node in w.tracker.ready():
                ctx.spawn(_merge(ctx, rt, w, node))
    while True:
        snap = snapshot_of(rt)
        wid = rt.by_seq.get(snap.next_seq if snap is not None else 0)
        ready = rt.windows.get(wid) if wid is not None else None
        if ready is None or ready.tracker is None or (ops := ready.tracker.result()) is None:
            return
        if not await _apply(ctx, rt, ready, ops):
            return


def _base_playbook(ctx: StageContext, rt: NamespaceRuntime, version: int) -> Playbook:
    snap = snapshot_of(rt)
    current = snap.playbook if snap is not None else Playbook(namespace=rt.namespace)
    return rt.playbooks.get(version, current)


async def _merge(ctx: StageContext, rt: NamespaceRuntime, w: OpenWindow, node: ReadyNode) -> None:
    assert w.plan is not None
    base = _base_playbook(ctx, rt, w.plan.base_version)
    meter = Meter()
    attempts = ctx.config.method.parse_attempts
    ctx.in_flight_tasks += 1
    roots = w.tracker.roots if w.tracker is not None else ()
    final = ", the window's last" if (node.level, node.index) in roots else ""  # a root: nothing merges it further
    log.info("merge %s/%d.%d started (%d inputs%s)", w.window_id, node.level, node.index, len(node.inputs), final)
    try:
        outcome = await ctx.retrying(
            f"merge {w.window_id}/{node.level}.{node.index}",
            lambda: merge(
                node.inputs,
                base,
                ctx.llm,
                meter=meter,
                attempts=attempts,
                dedup=ctx.dedup,
                sections=ctx.config.method.sections,
            ),
            Role.MERGER,
        )
        ctx.metrics.llm_usage(meter)
        ops = outcome.value or ()
        log.info("merge %s/%d.%d done", w.window_id, node.level, node.index)
        role = meter.roles.get("merger")
        partial = Partial(
            window_id=w.window_id,
            namespace=rt.namespace,
            level=node.level,
            index=node.index,
            ops=ops,
            ok=meter.merge_fallbacks == 0,
            service_s=outcome.service_s,
            calls=role.calls if role else 0,
            prompt_tokens=role.prompt_tokens if role else 0,
            completion_tokens=role.completion_tokens if role else 0,
        )
        await ctx.send(ctx.topics.partials, rt.namespace, partial, rt.partition)  # durable; returns as a no-op
        async with rt.lock:
            if (
                rt.windows.get(w.window_id) is w
                and w.tracker is not None
                and w.tracker.add(node.level, node.index, ops)
            ):
                w.service[(node.level, node.index)] = outcome.service_s
                await _progress(ctx, rt)
    except Exception:
        # Not an LLM outage (that waits inside `retrying`): e.g. Kafka refused the partial. Offer the node
        # again after a pause; waiting for the namespace's next record instead would stall a window whose
        # partials are all in already.
        log.exception("merge %s/%d.%d failed; offering it again", w.window_id, node.level, node.index)
        if w.tracker is not None:
            w.tracker.forget_started(node.level, node.index)
        ctx.spawn(_offer_again(ctx, rt, delay_s=ctx.rng.uniform(1.0, 3.0)))
    finally:
        ctx.in_flight_tasks -= 1
        ctx.touch()


async def _offer_again(ctx: StageContext, rt: NamespaceRuntime, delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    async with rt.lock:
        await _progress(ctx, rt)


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


async def _apply(ctx: StageContext, rt: NamespaceRuntime, w: OpenWindow, ops: tuple[DeltaOp, ...]) -> bool:
    """Apply a finished window that is next in sequence; False when it was not committed (fenced)."""
    plan = w.plan
    assert plan is not None and rt.tenure is not None
    snap = snapshot_of(rt)
    current = snap.playbook if snap is not None else Playbook(namespace=rt.namespace)
    meter = Meter()
    # logged finished (copies folded, records refused, sections canonical, near duplicates folded): a replay
    # needs no vectors
    cfg = ctx.config.method
    finished = await finish_ops(
        ops, current, cfg, ctx.dedup, meter, pending=await pending_pool(ctx, rt), producers=plan.producers,
        verified=plan.verified_producers, window_id=w.window_id, at=time.time(),
    )  # fmt: skip
    proposed, ops = ops, finished.ops
    tags, held_tags = corroborate_tags(plan.tag_counts, current, cfg.corroboration_for(rt.namespace))
    meter.hold({"harmful_tag": held_tags} if held_tags else {})
    delta = Delta(
        namespace=rt.namespace,
        window_id=w.window_id,
        base_version=plan.base_version,
        ops=ops,
        tag_counts=tags,
        trace_count=plan.trace_count,
        verified_producers=_verified(plan, finished),
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
        epoch=rt.tenure.epoch,
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
    await keep_pending(ctx, rt, finished.corroborated)
    del rt.windows[w.window_id]
    rt.by_seq.pop(plan.seq, None)
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
    async with rt.applied:
        rt.applied.notify_all()
    ctx.wake.set()
    return True


def _verified(plan: WindowPlan, finished: Finished) -> dict[str, str]:
    """The window's verified producers, and those of the pending lessons that went live in it (their traces
    came in earlier windows)."""
    went_live = finished.corroborated.verified if finished.corroborated is not None else {}
    return {**went_live, **plan.verified_producers}


async def _rollback(ctx: StageContext, rt: NamespaceRuntime, ctrl: Control) -> None:
    """Make the content of version ``to_version`` the next version (versions never go backwards)."""
    assert rt.tenure is not None
    snap = snapshot_of(rt)
    current = snap.playbook if snap is not None else Playbook(namespace=rt.namespace)
    try:
        target = await ctx.store.get_version(rt.namespace, ctrl.to_version)
    except Exception as exc:
        log.error("rollback of %s to v%d: cannot read it from Redis: %s", rt.namespace, ctrl.to_version, exc)
        return
    if target is None:
        log.error("rollback of %s: version %d is not in the store", rt.namespace, ctrl.to_version)
        return
    old = Playbook.model_validate_json(target.playbook_json)
    await serve_rollback(ctx, rt, ctrl, current.version)  # under a policy other than direct: serve it at once
    playbook = Playbook(
        namespace=rt.namespace,
        version=current.version + 1,
        bullets=old.bullets,
        next_id=max(current.next_id, old.next_id),
    )
    wid = f"{rt.namespace}/rollback/v{ctrl.to_version}@v{playbook.version}"
    note = f"rollback to the content of v{ctrl.to_version}"
    if not await commit_control(ctx, rt, playbook, wid, note, rollback_to=ctrl.to_version):
        return
    log.info("rolled %s back to the content of v%d as v%d", rt.namespace, ctrl.to_version, playbook.version)
