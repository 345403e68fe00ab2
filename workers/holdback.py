"""Backpressure per namespace: a full window buffer holds its namespace's later traces back, not its partition.

A namespace's window buffer takes at most ``buffer_limit`` traces. Past it, each later trace of that namespace on
that partition is *held back*: its offset is kept (oldest first) and its payload let go, the record stays
unfinished in :class:`workers.delivery.acks.OrderedAcks` (so no commit passes it), and the stage goes on with the next
record: the other namespaces of the partition are not stopped. When windows have made room, :func:`refill` reads
the held records again from Kafka, in offset order, into the buffer. While a namespace has records held back on
a partition, its new records there are held back too, so its windows keep their offsets in order (the map stage
strips a trace at or below its namespace's mark: one overtaken by a later window would be lost).

The memory of a held record is its place (an offset and Faust's event without its value). Only when a partition
holds back ``held_limit`` records does its intake wait for room, as the whole partition did before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

from combee.identity import verify_trace
from streams.codec import CodecError, decode_trace
from workers.context import StageContext
from workers.delivery.acks import SyntheticEvent, SyntheticMessage
from workers.feedback import buffer_trace
from workers.runtime import Buffered, NamespaceRuntime

__all__ = ["held_on", "hold", "must_hold", "refill", "wait_for_room"]

log = logging.getLogger("combee.worker.window")


def must_hold(ctx: StageContext, rt: NamespaceRuntime, partition: int) -> bool:
    """A new record of ``rt``'s namespace on ``partition`` goes behind the ones held back, or the buffer is full."""
    return bool(rt.held.get(partition)) or ctx.buffered(rt) >= ctx.config.buffer_limit


def hold(ctx: StageContext, rt: NamespaceRuntime, event: Any) -> None:
    """Hold ``event``'s record back: keep its offset, let its payload go; it stays unfinished until refilled."""
    msg = event.message
    rt.held.setdefault(msg.partition, deque()).append(msg.offset)
    for holder in (event, msg):  # read again from Kafka when there is room; Faust needs only its coordinates
        with contextlib.suppress(AttributeError):
            holder.value = None
    ctx.metrics.trace_held(rt.namespace)


def held_on(ctx: StageContext, partition: int) -> int:
    return sum(len(rt.held.get(partition, ())) for rt in ctx.runtimes.values())


async def wait_for_room(ctx: StageContext, partition: int) -> None:
    """The last resort: while the partition holds ``held_limit`` records back, stop pulling it."""
    while held_on(ctx, partition) >= ctx.config.held_limit:  # noqa: ASYNC110
        await asyncio.sleep(0.05)


async def refill(ctx: StageContext) -> int:
    """Read held-back records into the buffers that have room again; returns how many were buffered."""
    moved = 0
    for rt in list(ctx.runtimes.values()):
        for partition in sorted(rt.held):
            room = ctx.config.buffer_limit - ctx.buffered(rt)
            if room > 0 and rt.held[partition]:
                moved += await _refill_one(ctx, rt, partition, room)
        for partition in [p for p, q in rt.held.items() if not q]:
            del rt.held[partition]
    return moved


async def _refill_one(ctx: StageContext, rt: NamespaceRuntime, partition: int, room: int) -> int:
    queue = rt.held[partition]
    topic, moved = ctx.topics.traces, 0
    async with contextlib.aclosing(ctx.io.read(topic, partition, queue[0])) as records:  # its consumer stops
        async for rec in records:
            if ctx.runtimes.get(rt.namespace) is not rt or rt.held.get(partition) is not queue:
                return moved  # the partition was revoked meanwhile: its new owner reads it again
            while queue and queue[0] < rec.offset:  # gone from the log (retention): nothing to learn
                gone = queue.popleft()
                log.warning("%s[%d]@%d held back and no longer in the log", topic, partition, gone)
                await ctx.acks.done(SyntheticEvent(SyntheticMessage(topic, partition, gone, None, None)))
            if not queue or moved >= room:
                return moved
            if rec.offset == queue[0]:  # else another namespace's record
                queue.popleft()
                moved += await _buffer(ctx, rt, SyntheticMessage(topic, partition, rec.offset, rec.key, rec.value))
    return moved


async def _buffer(ctx: StageContext, rt: NamespaceRuntime, msg: SyntheticMessage) -> int:
    """Buffer a record read back; 1 when buffered."""
    event = SyntheticEvent(msg)
    try:
        trace = decode_trace(msg.value, msg.key)
    except CodecError as exc:  # it decoded when it came; a record cannot change, but never lose one silently
        await ctx.dead_letter("window", exc.reason, msg)
        await ctx.acks.done(event)
        return 0
    producer = verify_trace(trace, ctx.config.identity).producer  # accepted when it came: only who signed it
    item = Buffered(msg.offset, trace, event, len(msg.value or b""), time.monotonic(), producer)
    await buffer_trace(ctx, rt, item, msg.partition)
    return 1
