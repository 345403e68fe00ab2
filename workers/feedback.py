"""Trusted feedback in the window stage: feedback records in, joined to waiting traces (combee/feedback.py).

A trace of a namespace whose feedback is trusted is not buffered when it comes: it waits in the join (counted in
its namespace's buffer, so backpressure bounds it) until its feedback record comes or ``wait_s`` passes, and
leaves in its arrival order, so windows keep their offsets in order. Exactly once, as the rest of the stream: a
trace's offset is acknowledged when its window is written, and the feedback record it was joined to with it; a
crash before that reads both again. A record that joins nothing (refused, ignored, a duplicate, late, expired)
is acknowledged at once, with a count and, when refused, a dead letter saying why.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from combee.errors import InvalidNamespace
from combee.feedback import (
    DUPLICATE,
    EARLY,
    EXPIRED,
    IGNORED,
    JOINED,
    LATE,
    REFUSED,
    REQUIRED,
    TIMED_OUT,
    TIMEOUT_KIND,
    verify_feedback,
    with_trusted_feedback,
)
from combee.models import validate_namespace
from combee.outcomes import observe
from streams.codec import CodecError, decode_feedback
from workers.context import StageContext
from workers.runtime import Buffered, NamespaceRuntime

__all__ = ["buffer_trace", "forget_feedback", "handle_feedback", "release_joined"]

log = logging.getLogger("combee.worker.feedback")


async def handle_feedback(ctx: StageContext, stream: Any, event: Any) -> None:
    """One record of the feedback topic: refuse it, ignore it, forward it to its namespace's partition, or offer
    it to the join (acknowledged when the trace it joins is in a window written)."""
    msg = event.message
    ctx.acks.add(stream, event)
    ctx.touch()
    try:
        record = decode_feedback(msg.value)
    except CodecError as exc:
        await ctx.dead_letter("feedback", exc.reason, msg)
        ctx.metrics.feedback(_label(msg.key), REFUSED, "invalid")
        await ctx.acks.done(event)
        return
    ns = record.namespace
    if not ctx.config.feedback.trusted(ns):
        ctx.metrics.feedback(ns, IGNORED)  # the namespace learns its agents' own feedback
        await ctx.acks.done(event)
        return
    verdict = verify_feedback(record, ctx.config.identity)
    if verdict.refused:
        await ctx.dead_letter("feedback", verdict.message, msg)
        ctx.metrics.feedback(ns, REFUSED, verdict.outcome)
        await ctx.acks.done(event)
        return
    home = ctx.home_partition(ns)
    if msg.partition != home:  # the join lives with the namespace's traces
        await ctx.io.send(ctx.topics.feedback, ns.encode(), msg.value, home)
        await ctx.acks.done(event)
        return
    offered = ctx.feedback_join.offer(record, event, time.monotonic())
    for dropped in offered.dropped:  # pushed out of the bounded early buffer
        ctx.metrics.feedback(_label(dropped.message.key), EXPIRED)
        await ctx.acks.done(dropped)
    if offered.outcome in (DUPLICATE, LATE, EARLY):
        ctx.metrics.feedback(ns, offered.outcome)
    if offered.outcome in (DUPLICATE, LATE):
        await ctx.acks.done(event)
    if offered.outcome == JOINED:
        ctx.wake.set()  # the closer releases it (release_joined)


async def buffer_trace(ctx: StageContext, rt: NamespaceRuntime, item: Buffered, partition: int) -> None:
    """Take an accepted trace: into its namespace's buffer, or, when the namespace's feedback is trusted, into
    the join to wait for its feedback."""
    if not ctx.config.feedback.trusted(rt.namespace):
        _buffer(ctx, rt, item, partition)
        return
    ctx.feedback_join.add_trace(rt.namespace, partition, item.trace.trace_id, item, time.monotonic())
    await release_joined(ctx)


async def release_joined(ctx: StageContext, now: float | None = None) -> int:
    """Buffer the traces done waiting (joined, or timed out: learned without feedback, or dead-lettered in a
    ``required`` namespace), and let expired early feedback go. Returns how many traces left the join."""
    now = time.monotonic() if now is None else now
    join = ctx.feedback_join
    for gone in join.expire(now):
        ctx.metrics.feedback(_label(gone.message.key), EXPIRED)
        await ctx.acks.done(gone)
    released = join.release(now)
    for r in released:
        item, ns = r.item, r.item.trace.namespace
        rt = ctx.runtimes.get(ns)
        if r.record is None:
            ctx.metrics.feedback(ns, TIMED_OUT)
            if ctx.config.feedback.mode(ns) == REQUIRED:
                msg = item.event.message
                reason = f"{TIMEOUT_KIND}: no trusted feedback for trace {item.trace.trace_id!r} of {ns!r} in time"
                await ctx.dead_letter("window", reason, msg)
                ctx.metrics.trace_dead_lettered(ns, TIMEOUT_KIND)
                await ctx.acks.done(item.event)
                continue
        else:
            ctx.metrics.feedback(ns, JOINED)
        item.trace = with_trusted_feedback(item.trace, r.record)
        if r.record is not None:
            item.feedback_by = r.record.producer
            item.feedback_events = (r.feedback_item,) if r.feedback_item is not None else ()
        if rt is None:  # let go meanwhile (cannot happen while it waits: it counts as buffered); never lose it
            log.warning("trace %s left the feedback join after its namespace %s was let go", item.trace.trace_id, ns)
            rt = ctx.runtime(ns)
        _buffer(ctx, rt, item, item.event.message.partition)
    if released:
        ctx.wake.set()
    return len(released)


def forget_feedback(ctx: StageContext, topic: str, partition: int) -> None:
    """A partition was revoked: drop what the join holds of it (its new owner reads it again)."""
    if topic == ctx.topics.traces:
        ctx.feedback_join.forget(partition)
    elif topic == ctx.topics.feedback:
        ctx.feedback_join.forget_early(lambda e: (e.message.topic, e.message.partition) != (topic, partition))


def _buffer(ctx: StageContext, rt: NamespaceRuntime, item: Buffered, partition: int) -> None:
    if ctx.outcomes is not None:
        ctx.outcomes.note(rt.namespace, partition, observe(item.offset, item.trace))
    rt.buffers.setdefault(partition, []).append(item)
    ctx.wake.set()


def _label(key: bytes | None) -> str:
    try:
        return validate_namespace(key.decode("utf-8")) if key else ""
    except (UnicodeDecodeError, InvalidNamespace):
        return ""
