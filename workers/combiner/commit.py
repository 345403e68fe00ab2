"""The combiner's commit point: the deltas log, the snapshot table, checkpoints.

A window is committed by appending its delta record to the partition's deltas log; only if no other claim
lies before it there (:meth:`workers.tenure.Tenure.check`) does the combiner write the snapshot, a
checkpoint, offer the version to Redis — and the caller ack the window's records. Otherwise the record is
fenced and the tenure stands down (docs/reliability.md, "Fencing zombie combiners"). A tenure starts in
:mod:`workers.combiner.claim`, which replays the log through :func:`remember` as a commit would.
"""

from __future__ import annotations

import logging
import time

from combee.evidence import EVIDENCE_KEY, evidence_entry
from combee.models import Delta, Playbook
from combee.playbook import render_prompt
from combee.promptdiff import PROVENANCE_KEY, provenance_entry
from streams.deltalog import encode_checkpoint
from streams.envelopes import DeltaRecord, Snapshot
from workers.combiner.port import CombinerPort
from workers.combiner.quarantine import remember_quarantine
from workers.runtime import NamespaceRuntime
from workers.tenure import Tenure

__all__ = ["CHECKPOINT", "commit", "commit_control", "is_current", "remember", "snapshot_of"]

log = logging.getLogger("combee.worker.combine")
LEDGER = 4096
KEEP_VERSIONS = 8
CHECKPOINT = "__checkpoint__"  # the key of a partition's checkpoint in the snapshot table


def snapshot_of(rt: NamespaceRuntime) -> Snapshot | None:
    return rt.combining.snapshot if rt.combining is not None else None


async def commit(
    ctx: CombinerPort, rt: NamespaceRuntime, record: DeltaRecord, playbook: Playbook, next_seq: int, source: str | None
) -> bool:
    """Log the record (the commit point); if no other claim came before it, snapshot, checkpoint and offer the
    version to Redis. False when it was not logged (the tenure is over) or was fenced (nothing else written)."""
    tenure = rt.tenure
    if tenure is None or tenure.fenced:
        return False
    assert record.epoch == tenure.epoch
    snap = tenure.snapshots.get(rt.namespace)
    offset = await ctx.send(ctx.topics.deltas, rt.namespace, record, tenure.partition)
    tenure.logged(offset, rt.namespace)
    if not await tenure.check(ctx.io, ctx.topics.deltas, offset):
        ctx.tenures.fenced_writes += 1
        ctx.metrics.fenced_write(rt.namespace)
        log.warning(
            "fenced: %s v%d logged at %s[%d]@%d under epoch %d, after the claim at %d by %s; not snapshotted, "
            "not published, not acked (fenced writes: %d)",
            record.window_id, record.version, ctx.topics.deltas, tenure.partition, offset, tenure.epoch,
            tenure.fenced_at, tenure.fenced_by, ctx.tenures.fenced_writes,
        )  # fmt: skip
        _stand_down(ctx, tenure)
        return False
    await remember(ctx, rt, snap, record, playbook, next_seq, source, offset)
    return True


async def commit_control(
    ctx: CombinerPort, rt: NamespaceRuntime, playbook: Playbook, wid: str, note: str, **extra: object
) -> bool:
    """Commit an operator's ``playbook`` (a rollback, an action on a bullet) as the namespace's next version:
    a delta record with no trace and the resulting playbook (a replay needs nothing else), committed like a
    window's. ``extra``: more fields of the record. False when it was not committed."""
    assert rt.tenure is not None
    snap = snapshot_of(rt)
    base = snap.playbook.version if snap is not None else 0
    record = DeltaRecord(
        namespace=rt.namespace,
        version=playbook.version,
        window_id=wid,
        seq=-1,
        delta=Delta(namespace=rt.namespace, window_id=wid, base_version=base),
        trace_count=0,
        entries=len(playbook.bullets),
        applied_at=time.time(),
        note=note,
        playbook=playbook,
        epoch=rt.tenure.epoch,
        **extra,
    )
    return await commit(ctx, rt, record, playbook, snap.next_seq if snap is not None else 0, None)


def _stand_down(ctx: CombinerPort, tenure: Tenure) -> None:
    """Another process owns the partition: drop the combiner's state of it, ack nothing of it, and do not claim
    it again until it is revoked (a revocation makes it claimable; the new owner redoes the open windows)."""
    tenure.stand_down()
    if ctx.tenures.holds(tenure):
        ctx.snapshots.forget(tenure.partition)  # the map stage re-reads it; the partition stays "ready" (fenced)


def is_current(ctx: CombinerPort, tenure: Tenure) -> bool:
    return ctx.tenures.is_current(tenure)


async def remember(
    ctx: CombinerPort,
    rt: NamespaceRuntime,
    snap: Snapshot | None,
    record: DeltaRecord,
    playbook: Playbook,
    next_seq: int,
    source: str | None,
    offset: int,
    *,
    checkpoint: bool = True,
) -> None:
    """Write the snapshot the valid record at ``offset`` produced, offer its version, then write a checkpoint."""
    assert rt.combining is not None
    combining, tenure = rt.combining, rt.combining.tenure
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
        epoch=record.epoch,
        updated_at=time.time(),
    )
    await ctx.snapshots.put(rt.namespace, new, cache=False)
    tenure.snapshots[rt.namespace] = new
    tenure.snapshotted(rt.namespace, offset)
    current = is_current(ctx, tenure)  # a tenure that ended meanwhile (revoked, fenced) wrote to the changelog only
    if current:
        ctx.snapshots.cache(rt.namespace, new)
    combining.playbooks[playbook.version] = playbook
    ctx.metrics.playbook_size(rt.namespace, len(playbook.bullets))
    for v in sorted(combining.playbooks)[:-KEEP_VERSIONS]:
        del combining.playbooks[v]
    # No await between caching the snapshot and offering its version: the status loop (republish_if_lost) reads
    # both, and in between it would offer this version without its window and provenance, and the real offer
    # would then be refused as not newer.
    ctx.publisher.offer(
        rt.namespace,
        playbook.version,
        render_prompt(playbook),
        playbook.model_dump_json(),
        window_id=record.window_id,
        meta={
            "bullets": len(playbook.bullets),
            "traces": record.trace_count,
            "note": record.note,
            **({"rollback_to": record.rollback_to} if record.rollback_to is not None else {}),
            PROVENANCE_KEY: [provenance_entry(record.version, record.window_id, record.trace_ids)],
            **({EVIDENCE_KEY: evidence_entry(record.evidence)} if record.evidence is not None else {}),
        },
    )
    remember_quarantine(ctx, record)
    if current:
        await _announce_applied(ctx, rt.namespace)
        position = tenure.checkpoint()
        if checkpoint and position is not None:
            await ctx.snapshots.put_raw(tenure.partition, CHECKPOINT, encode_checkpoint(position))


async def _announce_applied(ctx: CombinerPort, namespace: str) -> None:
    """Wake the map stage's waiters of ``namespace``: the snapshot it reads moved on.

    The waiters are on the runtime the namespace has *now* (``ctx.runtimes``), not necessarily the one the
    writer holds: a rebalance replaces the runtime while an earlier tenure's apply or a claim's replay is still
    running, and a wake-up sent to the replaced object would reach nobody (a window then waits for its turn
    forever; seen in the fault suite's zombie scenario).
    """
    rt = ctx.runtimes.get(namespace)
    if rt is None:
        return
    async with rt.applied:
        rt.applied.notify_all()
