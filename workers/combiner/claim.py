"""The start of a combiner's tenure: claim a partition of the deltas log, recover its snapshots, replay the log.

:func:`ensure_ready` starts a tenure: claim, recover the snapshots, replay the log up to the claim
(docs/reliability.md, "Fencing zombie combiners"). :func:`bind` gives a namespace's runtime to the tenure.
"""

from __future__ import annotations

import logging
import time
from contextlib import aclosing

from combee.models import Playbook
from combee.playbook import apply_delta, render_prompt
from streams.deltalog import (
    ClaimTracker,
    Position,
    decode_checkpoint,
    decode_log_record,
    encode_checkpoint,
    replay_start,
)
from streams.envelopes import Claim, DeltaRecord
from workers.combiner.commit import CHECKPOINT, remember
from workers.combiner.port import CombinerPort
from workers.runtime import NamespaceRuntime
from workers.tenure import Tenure

__all__ = ["bind", "ensure_ready"]

log = logging.getLogger("combee.worker.combine")
CLAIM_KEY = "__claim__"


def bind(ctx: CombinerPort, tenure: Tenure, namespace: str) -> NamespaceRuntime:
    """The namespace's runtime, bound to the combiner's state of it under ``tenure`` (the runtime object stays
    across tenures: the map stage may be waiting on its ``applied`` condition)."""
    rt = ctx.runtime(namespace)
    if rt.tenure is not tenure:
        rt.combining = tenure.combining(namespace)
    return rt


async def ensure_ready(ctx: CombinerPort, partition: int) -> Tenure:
    """Claim ``partition`` of the deltas log, recover its snapshots and replay the log up to the claim.

    The claim comes first: from its offset on, a record of any earlier owner is fenced, so the replay — from
    the earliest point the checkpoint and the snapshots vouch for, through the claim, judging every record
    with the log's rule — sees every record that will ever count before the claim. Records after the claim are
    not this tenure's to replay: only its own (checked one by one) or fenced ones can lie there.
    """
    tenure = ctx.tenures.ready(partition)
    if tenure is not None:
        return tenure
    async with ctx.tenures.lock(partition):
        tenure = ctx.tenures.ready(partition)
        if tenure is not None:
            return tenure
        revocations = ctx.tenures.revocations(partition)
        claim = Claim(partition=partition, owner=ctx.owner, claimed_at=time.time())
        epoch = await ctx.send(ctx.topics.deltas, CLAIM_KEY, claim, partition)
        tenure = Tenure(partition=partition, epoch=epoch, owner=ctx.owner)
        ctx.tenures.claimed(tenure)
        await ctx.snapshots.recover(partition)
        for ns in ctx.snapshots.keys(partition):
            snap = ctx.snapshots.get(ns)
            if snap is not None:
                tenure.snapshots[ns] = snap
        raw = ctx.snapshots.raw.get((partition, CHECKPOINT))
        start = replay_start(decode_checkpoint(raw) if raw else None, tenure.snapshots.values())
        replayed, fenced = await _replay(ctx, tenure, start)
        if ctx.tenures.revocations(partition) != revocations:
            return _void(ctx, tenure)
        await ctx.snapshots.put_raw(partition, CHECKPOINT, encode_checkpoint(Position(epoch, epoch)))
        for snap in tenure.snapshots.values():  # make sure Redis has the newest version (CAS: no-op if so)
            pb = snap.playbook
            ctx.metrics.playbook_size(pb.namespace, len(pb.bullets))
            if pb.version > 0:
                ctx.publisher.offer(
                    pb.namespace, pb.version, render_prompt(pb), pb.model_dump_json(), window_id=None, meta={}
                )
        if ctx.tenures.revocations(partition) != revocations:
            return _void(ctx, tenure)
        ctx.tenures.made_ready(tenure)
        log.info(
            "partition %d: claimed at %s[%d]@%d as %s; replayed %d logged deltas from offset %d onto the recovered "
            "snapshots (%d fenced records skipped)",
            partition, ctx.topics.deltas, partition, epoch, ctx.owner, replayed, start.offset + 1, fenced,
        )  # fmt: skip
        return tenure


def _void(ctx: CombinerPort, tenure: Tenure) -> Tenure:
    """A claim revoked while it was being readied (a rebalance got in at one of the awaits): never made ready
    nor left bound, so the caller sees it is not current and leaves its record to the partition's owner."""
    log.info("partition %d: revoked while its claim at %d was being readied", tenure.partition, tenure.epoch)
    ctx.tenures.void(tenure)
    for rt in ctx.runtimes.values():
        if rt.tenure is tenure:
            rt.combining = None
    return tenure


async def _replay(ctx: CombinerPort, tenure: Tenure, start: Position) -> tuple[int, int]:
    """Apply the valid records after ``start`` up to the tenure's claim; returns (replayed, fenced)."""
    tracker = ClaimTracker(start.epoch)
    replayed = fenced = 0
    async with aclosing(ctx.io.read(ctx.topics.deltas, tenure.partition, start.offset + 1)) as records:
        async for rec in records:
            if rec.offset > tenure.epoch:
                break
            record = decode_log_record(rec.value)
            if record is None:
                continue
            verdict = tracker.judge(rec.offset, record)
            fenced += verdict == "fenced"
            if verdict != "valid" or not isinstance(record, DeltaRecord):
                continue
            rt = bind(ctx, tenure, record.namespace)
            snap = tenure.snapshots.get(record.namespace)
            current = snap.playbook if snap is not None else Playbook(namespace=record.namespace)
            if record.version != current.version + 1:
                if record.version > current.version + 1:
                    log.error(
                        "%s: logged v%d follows v%d in the snapshot; not replayed",
                        rt.namespace,
                        record.version,
                        current.version,
                    )
                continue  # already part of the snapshot
            playbook = record.playbook or apply_delta(current, record.delta, ctx.config.method.policy)[0]
            next_seq = record.seq + 1 if record.seq >= 0 else (snap.next_seq if snap is not None else 0)
            await remember(ctx, rt, snap, record, playbook, next_seq, record.source, rec.offset, checkpoint=False)
            replayed += 1
    return replayed, fenced
