"""Window stage: traces in, windows out. Decode → buffer per namespace → close by policy → send.

A trace's offset is acknowledged only after the window holding it has been written to the windows topic
(acks=all) and the outcome it reports for its playbook version is counted (workers/outcomes.py), so a crash
loses no trace and no count; re-formed overlapping windows are resolved by the map stage. Namespaces: within a
cap, idle ones let go (workers/tenancy.py); a full buffer holds back its namespace, not its partition (holdback).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from combee.errors import InvalidNamespace
from combee.forget import forgotten
from combee.identity import Verification, counted_producer, verify_trace
from combee.models import Trace, validate_namespace
from combee.plan import window_id
from combee.quotas import QUOTA_KIND
from combee.windowing import close_size
from streams.codec import CodecError, decode_trace
from streams.envelopes import WindowEnvelope
from workers.context import StageContext
from workers.feedback import buffer_trace, release_joined
from workers.holdback import hold, must_hold, refill, wait_for_room
from workers.runtime import Buffered, NamespaceRuntime
from workers.tenancy import admit, evict_idle, in_flight

__all__ = ["close_due_windows", "closer_loop", "handle_trace", "in_flight", "namespace_label"]

log = logging.getLogger("combee.worker.window")


async def handle_trace(ctx: StageContext, stream: Any, event: Any) -> None:
    """One record of the traces topic: dead-letter it, forward it to its namespace's partition, or buffer it."""
    msg = event.message
    ctx.acks.add(stream, event)
    ctx.touch()
    try:
        trace = decode_trace(msg.value, msg.key)
    except CodecError as exc:
        await ctx.dead_letter("window", exc.reason, msg)
        ctx.metrics.trace_dead_lettered(namespace_label(msg.key), exc.kind)
        await ctx.acks.done(event)
        return
    verdict = await _identify(ctx, trace, msg)
    if verdict is None:
        await ctx.acks.done(event)
        return
    if ctx.forget_rules is not None and forgotten(trace, await ctx.forget_rules.rules()):
        ctx.metrics.trace_forgotten(trace.namespace)  # acknowledged, never learned
        await ctx.acks.done(event)
        return
    home = ctx.home_partition(trace.namespace)
    if msg.partition != home:
        # Keyed by something other than the namespace: move it to the namespace's partition, where the
        # namespace's window, map and combine stages live (one owner per namespace).
        await ctx.io.send(ctx.topics.traces, trace.namespace.encode(), msg.value, home)
        ctx.metrics.trace_moved(trace.namespace)
        await ctx.acks.done(event)
        return
    rt = await admit(ctx, trace.namespace, msg)
    if rt is None or not await _within_quota(ctx, trace, verdict, msg):
        await ctx.acks.done(event)
        return
    rt.traces_seen += 1
    rt.last_active = time.monotonic()
    rt.arrivals.append(rt.last_active)
    if must_hold(ctx, rt, msg.partition):
        # Backpressure per namespace (workers/holdback.py): the namespace waits, its partition goes on.
        hold(ctx, rt, event)
        await wait_for_room(ctx, msg.partition)
        return
    item = Buffered(msg.offset, trace, event, len(msg.value or b""), rt.last_active, verdict.producer)
    await buffer_trace(ctx, rt, item, msg.partition)  # or, trusted feedback, wait for it (workers/feedback.py)


async def _identify(ctx: StageContext, trace: Trace, msg: Any) -> Verification | None:
    """Who signed ``trace`` (combee.identity); None, once it is dead-lettered with the reason, when refused."""
    verdict = verify_trace(trace, ctx.config.identity)
    if not verdict.refused:
        return verdict
    await ctx.dead_letter("window", verdict.message, msg)
    ctx.metrics.trace_dead_lettered(trace.namespace, verdict.outcome)
    return None


async def _within_quota(ctx: StageContext, trace: Trace, verdict: Verification, msg: Any) -> bool:
    """Ask the rate limits about ``trace`` at its record's timestamp (the producer's pace, so a backlog read
    after a pause is judged by when it was sent; never later than now, so a timestamp in the future earns
    nothing); dead-letter it with the reason when it is over. Its producer is the one it counts as
    (combee.identity.counted_producer): a name it claims cannot spend a verified producer's budget."""
    if ctx.quotas is None:
        return True
    now = time.time()
    stamp = getattr(msg, "timestamp", None)
    at = min(float(stamp), now) if isinstance(stamp, int | float) and stamp > 0 else now
    quota = ctx.quotas.admit(trace.namespace, counted_producer(trace, verdict.producer, ctx.config.identity), at)
    if quota.admitted:
        return True
    await ctx.dead_letter("window", quota.reason, msg)
    ctx.metrics.trace_dead_lettered(trace.namespace, QUOTA_KIND)
    return False


def _target(ctx: StageContext, rt: NamespaceRuntime) -> int:
    trial = rt.controller.next_trial()
    if trial is not None:
        ctx.metrics.batch_size(rt.namespace, trial)
        return trial  # profiling: the first windows are trial iterations at the candidate sizes (real steps)
    rt.decision = rt.controller.decide(arrival_rate=rt.arrival_rate())
    ctx.metrics.batch_size(rt.namespace, rt.decision.batch_size)
    return rt.decision.batch_size


def namespace_label(key: bytes | None) -> str:
    """The namespace a dead-lettered record's key names, or "" when it names none (a metrics label)."""
    try:
        return validate_namespace(key.decode("utf-8")) if key else ""
    except (UnicodeDecodeError, InvalidNamespace):
        return ""


async def close_due_windows(ctx: StageContext, now: float | None = None) -> int:
    """Close every window that the policy says is due; returns how many were closed."""
    now = time.monotonic() if now is None else now
    closed = 0
    for rt in list(ctx.runtimes.values()):
        for source_partition, buf in list(rt.buffers.items()):
            if not buf:
                continue
            decision = close_size(
                ctx.config.policy,
                buffered=len(buf),
                oldest_age_s=now - buf[0].received_at,
                in_flight=in_flight(ctx, rt),
                target=_target(ctx, rt),
            )
            if decision is None:
                continue
            size, why = decision
            take, total = 0, 0
            while take < size and (take == 0 or total + buf[take].size <= ctx.config.window_max_bytes):
                total += buf[take].size
                take += 1
            await _close(ctx, rt, source_partition, buf[:take], why)
            del buf[:take]
            closed += 1
    return closed


async def _close(
    ctx: StageContext, rt: NamespaceRuntime, source_partition: int, items: list[Buffered], why: str
) -> None:
    source = f"p{source_partition}"
    wid = window_id(rt.namespace, source, items[0].offset, items[-1].offset)
    closed_at = time.time()
    envelope = WindowEnvelope(
        window_id=wid,
        namespace=rt.namespace,
        source=source,
        first_offset=items[0].offset,
        last_offset=items[-1].offset,
        offsets=tuple(b.offset for b in items),
        seed_key=wid,
        closed_by=why,
        traces=tuple(b.trace for b in items),
        closed_at=closed_at,
        verified_producers={b.trace.trace_id: b.producer for b in items if b.producer is not None},
        feedback_producers={b.trace.trace_id: b.feedback_by for b in items if b.feedback_by is not None},
    )
    # The slot is taken before the send: the map stage (another task of this process) can receive the window
    # and release its slot before `send` returns here. Taken after, that release would come first and the slot
    # would never be given back.
    rt.unseen_windows.add(wid)
    rt.closed_at[wid] = time.monotonic()
    try:
        await ctx.send(ctx.topics.windows, rt.namespace, envelope, rt.partition)
    except BaseException:
        rt.window_seen(wid, None)
        raise
    rt.windows_closed += 1
    ctx.metrics.window_closed(rt.namespace)
    # the feedback records joined to these traces are done with them (workers/feedback.py)
    events = [b.event for b in items] + [e for b in items for e in b.feedback_events]
    if ctx.outcomes is not None:  # acked once the traces' outcomes are counted too (workers/outcomes.py)
        ctx.outcomes.release(rt.namespace, source_partition, events)
    else:
        for e in events:
            await ctx.acks.done(e)
    log.info("closed window %s: %d traces (%s)", wid, len(items), why)


async def closer_loop(ctx: StageContext, tick_s: float = 0.1) -> None:
    """Background task: close due windows when woken (new trace, window applied) or every ``tick_s``; read back
    what was held back once there is room; let idle namespaces go (about once a second)."""
    evicted_at = time.monotonic()
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ctx.wake.wait(), timeout=tick_s)
        ctx.wake.clear()
        try:
            await release_joined(ctx)
            await close_due_windows(ctx)
            if await refill(ctx):
                await close_due_windows(ctx)
            if time.monotonic() - evicted_at >= min(1.0, ctx.config.namespace_idle_s / 4):
                evicted_at = time.monotonic()
                evict_idle(ctx, evicted_at)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("window closer failed; retrying")
            await asyncio.sleep(1.0)
