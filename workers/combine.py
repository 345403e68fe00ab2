"""Combiner: the incremental scan merge and the one writer of each namespace's playbook.

Window plans and partial deltas arrive on the partials topic (keyed by namespace). Merge calls start as
soon as a node's own children are present (:class:`combee.scan.ReduceTracker`); windows are applied strictly
in sequence order. Applying a window is: append the delta record to the deltas log (the commit point), write
the snapshot table, checkpoint, offer the version to Redis (compare-and-set, retried in the background), and
only then ack the window's records. After a crash, :func:`ensure_ready` replays the log's tail onto the
recovered snapshots, so no window is applied twice and none is lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from combee.engine import Meter, merge
from combee.models import Delta, DeltaOp, Playbook
from combee.playbook import apply_delta, render_prompt
from combee.scan import ReadyNode, ReduceTracker
from streams.codec import CodecError, decode
from streams.envelopes import Control, DeltaRecord, Partial, Snapshot, WindowPlan
from workers.context import Learner
from workers.runtime import NamespaceRuntime, OpenWindow

__all__ = ["ensure_ready", "handle_partial"]

log = logging.getLogger("combee.worker.combine")
LEDGER = 4096
KEEP_VERSIONS = 8


async def handle_partial(ctx: Learner, stream: Any, event: Any) -> None:
    msg = event.message
    ctx.acks.add(stream, event)
    ctx.touch()
    try:
        env = decode(msg.value or b"")
        if not isinstance(env, WindowPlan | Partial | Control):
            raise CodecError(f"unexpected {env.schema_} on the partials topic")
    except CodecError as exc:
        await ctx.dead_letter("combine", exc.reason, msg)
        await ctx.acks.done(event)
        return
    await ensure_ready(ctx, msg.partition)
    rt = ctx.runtime(env.namespace)
    async with rt.lock:
        if isinstance(env, Control):
            await _rollback(ctx, rt, env)
            await ctx.acks.done(event)
            return
        snap = ctx.snapshots.get(env.namespace)
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
                w.tracker = ReduceTracker(env.groups, env.tree)
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


async def _progress(ctx: Learner, rt: NamespaceRuntime) -> None:
    """Start every ready merge; apply every finished window that is next in sequence. Caller holds rt.lock."""
    for w in rt.windows.values():
        if w.tracker is not None:
            for node in w.tracker.ready():
                ctx.spawn(_merge(ctx, rt, w, node))
    while True:
        snap = ctx.snapshots.get(rt.namespace)
        wid = rt.by_seq.get(snap.next_seq if snap is not None else 0)
        ready = rt.windows.get(wid) if wid is not None else None
        if ready is None or ready.tracker is None or (ops := ready.tracker.result()) is None:
            return
        await _apply(ctx, rt, ready, ops)


def _base_playbook(ctx: Learner, rt: NamespaceRuntime, version: int) -> Playbook:
    snap = ctx.snapshots.get(rt.namespace)
    current = snap.playbook if snap is not None else Playbook(namespace=rt.namespace)
    return rt.playbooks.get(version, current)


async def _merge(ctx: Learner, rt: NamespaceRuntime, w: OpenWindow, node: ReadyNode) -> None:
    assert w.plan is not None
    base = _base_playbook(ctx, rt, w.plan.base_version)
    meter = Meter()
    attempts = ctx.config.method.parse_attempts
    ctx.in_flight_tasks += 1
    try:
        outcome = await ctx.retrying(
            f"merge {w.window_id}/{node.level}.{node.index}",
            lambda: merge(node.inputs, base, ctx.llm, meter=meter, attempts=attempts),
        )
        ops = outcome.value or ()
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


async def _offer_again(ctx: Learner, rt: NamespaceRuntime, delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    async with rt.lock:
        await _progress(ctx, rt)


def _critical_path(w: OpenWindow) -> float:
    """Map time plus the longest chain of service times through the reduce tree."""
    assert w.plan is not None and w.tracker is not None
    level_cost = [w.service.get((1, g), 0.0) for g in range(w.plan.groups)]
    for i, level in enumerate(w.plan.tree):
        level_cost = [
            w.service.get((i + 2, j), 0.0) + max((level_cost[c] for c in children), default=0.0)
            for j, children in enumerate(level)
        ]
    return w.plan.map_service_s + (max(level_cost) if level_cost else 0.0)


async def _commit(
    ctx: Learner, rt: NamespaceRuntime, record: DeltaRecord, playbook: Playbook, next_seq: int, source: str | None
) -> None:
    """Log the record (the commit point), then snapshot, checkpoint and offer the version to Redis."""
    snap = ctx.snapshots.get(rt.namespace)
    offset = await ctx.send(ctx.topics.deltas, rt.namespace, record, rt.partition)
    await _remember(ctx, rt, snap, record, playbook, next_seq, source, offset)


async def _remember(
    ctx: Learner,
    rt: NamespaceRuntime,
    snap: Snapshot | None,
    record: DeltaRecord,
    playbook: Playbook,
    next_seq: int,
    source: str | None,
    offset: int,
) -> None:
    marks = dict(snap.watermarks) if snap is not None else {}
    if source is not None and record.last_offset is not None:
        marks[source] = max(marks.get(source, -1), record.last_offset)
    applied = ((snap.applied if snap is not None else ()) + (record.window_id,))[-LEDGER:]
    new = Snapshot(
        playbook=playbook,
        applied=applied,
        watermarks=tuple(sorted(marks.items())),
        next_seq=next_seq,
        delta_offset=offset,
        updated_at=time.time(),
    )
    await ctx.snapshots.put(rt.namespace, new)
    await ctx.snapshots.put_raw(rt.partition, "__checkpoint__", str(offset).encode())
    rt.playbooks[playbook.version] = playbook
    for v in sorted(rt.playbooks)[:-KEEP_VERSIONS]:
        del rt.playbooks[v]
    ctx.publisher.offer(
        rt.namespace,
        playbook.version,
        render_prompt(playbook),
        playbook.model_dump_json(),
        window_id=record.window_id,
        meta={"bullets": len(playbook.bullets), "traces": record.trace_count, "note": record.note},
    )


async def _apply(ctx: Learner, rt: NamespaceRuntime, w: OpenWindow, ops: tuple[DeltaOp, ...]) -> None:
    plan = w.plan
    assert plan is not None
    snap = ctx.snapshots.get(rt.namespace)
    current = snap.playbook if snap is not None else Playbook(namespace=rt.namespace)
    delta = Delta(
        namespace=rt.namespace,
        window_id=w.window_id,
        base_version=plan.base_version,
        ops=ops,
        tag_counts=plan.tag_counts,
        trace_count=plan.trace_count,
    )
    playbook, stats = apply_delta(current, delta, ctx.config.method.policy)
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
    )
    await _commit(ctx, rt, record, playbook, plan.seq + 1, plan.source)
    for e in w.events:
        await ctx.acks.done(e)
    del rt.windows[w.window_id]
    rt.by_seq.pop(plan.seq, None)
    rt.windows_applied += 1
    rt.last_applied_at = time.time()
    closed = rt.closed_at.pop(w.window_id, None)
    if closed is not None:
        rt.controller.observe(plan.trace_count, time.monotonic() - closed)
    rt.latencies.append((record.applied_at - plan.closed_at, record.critical_path_s))
    log.info(
        "applied %s as v%d: +%d ~%d -%d, %d bullets (%d deduplicated, %d evicted)",
        w.window_id, playbook.version, stats.added, stats.updated, stats.removed, len(playbook.bullets),
        stats.deduplicated, stats.evicted,
    )  # fmt: skip
    async with rt.applied:
        rt.applied.notify_all()
    ctx.wake.set()


async def _rollback(ctx: Learner, rt: NamespaceRuntime, ctrl: Control) -> None:
    """Make the content of version ``to_version`` the next version (versions never go backwards)."""
    snap = ctx.snapshots.get(rt.namespace)
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
    playbook = Playbook(
        namespace=rt.namespace,
        version=current.version + 1,
        bullets=old.bullets,
        next_id=max(current.next_id, old.next_id),
    )
    wid = f"{rt.namespace}/rollback/v{ctrl.to_version}@v{playbook.version}"
    record = DeltaRecord(
        namespace=rt.namespace,
        version=playbook.version,
        window_id=wid,
        seq=-1,
        delta=Delta(namespace=rt.namespace, window_id=wid, base_version=current.version),
        trace_count=0,
        entries=len(playbook.bullets),
        applied_at=time.time(),
        note=f"rollback to the content of v{ctrl.to_version}",
        rollback_to=ctrl.to_version,
        playbook=playbook,
    )
    await _commit(ctx, rt, record, playbook, snap.next_seq if snap is not None else 0, None)
    log.info("rolled %s back to the content of v%d as v%d", rt.namespace, ctrl.to_version, playbook.version)


async def ensure_ready(ctx: Learner, partition: int) -> None:
    """Recover the snapshot table of ``partition`` and replay the deltas log after its checkpoint."""
    if partition in ctx.ready_partitions:
        return
    lock = ctx.partition_locks.setdefault(partition, asyncio.Lock())
    async with lock:
        if partition in ctx.ready_partitions:
            return
        await ctx.snapshots.recover(partition)
        raw = ctx.snapshots.raw.get((partition, "__checkpoint__"))
        start = int(raw) + 1 if raw else 0
        replayed = 0
        async for rec in ctx.io.read(ctx.topics.deltas, partition, start):
            try:
                record = decode(rec.value or b"")
            except CodecError:
                continue
            if not isinstance(record, DeltaRecord):
                continue
            rt = ctx.runtime(record.namespace)
            snap = ctx.snapshots.get(record.namespace)
            current = snap.playbook if snap is not None else Playbook(namespace=record.namespace)
            if record.version != current.version + 1:
                continue  # already part of the snapshot
            playbook = record.playbook or apply_delta(current, record.delta, ctx.config.method.policy)[0]
            next_seq = record.seq + 1 if record.seq >= 0 else (snap.next_seq if snap is not None else 0)
            await _remember(ctx, rt, snap, record, playbook, next_seq, record.source, rec.offset)
            replayed += 1
        for ns in ctx.snapshots.keys(partition):  # make sure Redis has the newest version (CAS: no-op if so)
            snap = ctx.snapshots.get(ns)
            if snap is not None and snap.playbook.version > 0:
                pb = snap.playbook
                ctx.publisher.offer(ns, pb.version, render_prompt(pb), pb.model_dump_json(), window_id=None, meta={})
        ctx.ready_partitions.add(partition)
        if replayed:
            log.info("partition %d: replayed %d logged deltas onto the recovered snapshots", partition, replayed)
