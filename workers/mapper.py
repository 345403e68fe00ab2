"""Map stage: windows in; reflections, tags, shuffle and reduce plan out (to the curate workers and combiner).

Acceptance (dedup and sequence numbers) is decided by :func:`combee.windowing.accept_window` and recorded in
the map-state table before any LLM work. Each namespace's windows are then mapped in order by one task,
which waits until at most ``max_inflight - 1`` earlier windows are unapplied (bounded staleness), has the
pool reflect the window's traces (:mod:`workers.fanout`), and plans the reduce.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from combee.engine import canonical_reflections, teaching
from combee.evidence import window_lessons
from combee.holdout import split_holdout
from combee.identity import counted_producer
from combee.meter import Meter
from combee.models import Playbook, Reflection
from combee.playbook import count_tags, harmful_taggers
from combee.scan import tree_shape
from combee.screen import run_facts
from combee.windowing import Acceptance, MapState
from streams.envelopes import GroupTask, WindowEnvelope, WindowPlan
from workers.context import StageContext
from workers.fanout import reflect_window
from workers.gate import keep_holdout
from workers.runtime import NamespaceRuntime

__all__ = ["handle_window"]

log = logging.getLogger("combee.worker.map")


async def handle_window(ctx: StageContext, stream: Any, event: Any) -> None:
    env = await ctx.receive(stream, event, WindowEnvelope, "map", "a window envelope")
    if env is None:
        return
    msg = event.message
    rt = ctx.runtime(env.namespace)
    await ctx.map_table.recover(msg.partition)
    await ctx.snapshots.recover(msg.partition)
    state = ctx.map_table.get(env.namespace) or MapState()
    acc = accept_window(state, env)
    _count_traces(ctx, env, acc)
    if acc.duplicate:
        # Every offered window releases the slot its closing took, the dropped ones too: a slot kept here
        # would stall the namespace (close_size refuses while max_inflight windows are in flight).
        rt.window_seen(env.window_id, None)
        log.info("window %s already windowed (%d traces); dropped", env.window_id, acc.stripped)
        await ctx.acks.done(event)
        return
    if acc.state != state:
        await ctx.map_table.put(env.namespace, acc.state)
    rt.window_seen(env.window_id, acc.window_id)
    rt.accepted_seq = max(rt.accepted_seq, acc.seq)
    received = time.time()
    log.debug("window %s reached the map stage %.3fs after it was written", env.window_id, received - env.closed_at)
    rt.map_queue.put_nowait((acc, env, event))
    if rt.mapper is None or rt.mapper.done():
        rt.mapper = ctx.spawn(_mapper(ctx, rt))  # type: ignore[assignment]


def _count_traces(ctx: StageContext, env: WindowEnvelope, acc: Acceptance) -> None:
    """Accepted: traces windowed for the first time. Duplicate: traces windowed before (a redelivered window,
    or a re-formed one overlapping an accepted one), whether stripped or mapped again."""
    if acc.duplicate or acc.replayed:
        ctx.metrics.trace_duplicate(env.namespace, len(env.traces))
        return
    ctx.metrics.trace_accepted(env.namespace, len(acc.traces))
    if acc.stripped:
        ctx.metrics.trace_duplicate(env.namespace, acc.stripped)


def accept_window(state: MapState, env: WindowEnvelope) -> Acceptance:
    from combee.windowing import accept_window as accept

    return accept(state, env.namespace, env.source, env.offsets, env.traces)


def _counted_producers(ctx: StageContext, env: WindowEnvelope, acc: Acceptance) -> dict[str, str]:
    """Trace id -> the producer each accepted trace counts as (combee.identity.counted_producer), where known."""
    counted = {
        t.trace_id: counted_producer(t, env.verified_producers.get(t.trace_id), ctx.config.identity) for t in acc.traces
    }
    return {t: p for t, p in counted.items() if p is not None}


RECHECK_S = 5.0


async def _wait_turn(ctx: StageContext, rt: NamespaceRuntime, seq: int) -> Playbook:
    """Wait until window ``seq`` may be mapped; return the playbook version it is computed against.

    Woken by the combiner each time a snapshot of the namespace becomes current; the turn is also looked at
    again every ``RECHECK_S`` seconds, so a wake-up lost to a rebalance costs seconds, not the namespace's
    liveness (such a late turn is logged: it means a path that moves the snapshot on did not wake us).
    """
    limit = ctx.config.policy.max_inflight
    async with rt.applied:
        while True:
            snap = ctx.snapshots.get(rt.namespace)
            applied = snap.next_seq if snap is not None else 0
            if seq - applied < limit:
                return snap.playbook if snap is not None else Playbook(namespace=rt.namespace)
            try:
                await asyncio.wait_for(rt.applied.wait(), RECHECK_S)
            except TimeoutError:
                snap = ctx.snapshots.get(rt.namespace)
                if snap is not None and seq - snap.next_seq < limit:
                    log.warning("%s: window seq %d found its turn without a wake-up", rt.namespace, seq)


MAX_UNEXPECTED_FAILURES = 5


async def _mapper(ctx: StageContext, rt: NamespaceRuntime) -> None:
    while not rt.map_queue.empty():
        acc, env, event = rt.map_queue.get_nowait()
        rt.mapping = True
        await _map_until_done(ctx, rt, acc, env, event)
        rt.mapping = False
        await ctx.acks.done(event)


async def _map_until_done(
    ctx: StageContext, rt: NamespaceRuntime, acc: Acceptance, env: WindowEnvelope, event: Any
) -> None:
    """Map one window; never return without its plan sent, or every later window of the namespace waits.

    LLM outages wait inside :meth:`StageContext.retrying`. Any other failure (a bug, bad data) is retried a few
    times; then the window's content is given up — it is dead-lettered with the reason and an empty plan
    applies as a no-op version — and sending that is retried until Kafka takes it.
    """
    failures = 0
    while True:
        give_up = failures >= MAX_UNEXPECTED_FAILURES
        try:
            await _map_one(ctx, rt, acc, env, give_up=give_up)
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failures += 1
            log.exception("mapping window %s failed (%d/%d)", acc.window_id, failures, MAX_UNEXPECTED_FAILURES)
            if failures == MAX_UNEXPECTED_FAILURES:
                try:
                    await ctx.dead_letter("map", f"window could not be mapped: {exc!r}"[:400], event.message)
                except Exception:
                    log.exception("dead-lettering window %s failed; giving its content up all the same", acc.window_id)
            await asyncio.sleep(min(30.0, 2.0 ** min(failures, 5)))


async def _map_one(
    ctx: StageContext, rt: NamespaceRuntime, acc: Acceptance, env: WindowEnvelope, give_up: bool = False
) -> None:
    snap = ctx.snapshots.get(rt.namespace)
    if snap is not None and acc.window_id in snap.applied:
        return  # already applied before a restart: nothing to redo
    playbook = await _wait_turn(ctx, rt, acc.seq)
    method = ctx.config.method
    started = time.time()
    waited = started - env.closed_at

    reflected: list[Reflection] = []
    skipped, map_s = 0, 0.0
    learn, held = split_holdout(acc.traces, ctx.config.promotion.gate_holdout)  # held out: never reflected on
    await keep_holdout(ctx, rt.namespace, held)
    if not give_up and learn:
        reflected, skipped, map_s = await reflect_window(ctx, rt.namespace, acc.window_id, acc.seq, learn, playbook)
    # the same steps as combee.engine.run_window: tags from every reflection, the reduce over the ones that
    # teach, routed by their canonical sections
    reflections = await canonical_reflections(teaching(reflected), playbook, method, ctx.dedup, Meter())
    forest = method.forest(reflections, env.seed_key)
    groups = forest.groups
    for index, members in enumerate(groups):
        task = GroupTask(
            window_id=acc.window_id,
            namespace=rt.namespace,
            seq=acc.seq,
            index=index,
            playbook=playbook,
            reflections=tuple(reflections[i] for i in members),
        )
        await ctx.send(ctx.topics.groups, f"{acc.window_id}/{index}", task)
    window_plan = WindowPlan(
        window_id=acc.window_id,
        namespace=rt.namespace,
        seq=acc.seq,
        source=env.source,
        first_offset=acc.first_offset,
        last_offset=acc.last_offset,
        offsets=acc.offsets,
        seed_key=env.seed_key,
        trace_count=len(acc.traces),
        reflections=len(reflected),
        base_version=playbook.version,
        groups=len(groups),
        tree=tree_shape(forest),
        shape=method.shuffle_key,
        roots=forest.roots,
        unite=forest.unite,
        tag_counts=count_tags(reflected),
        harmful_taggers=harmful_taggers(reflected),
        closed_at=env.closed_at,
        mapped_at=time.time(),
        map_service_s=map_s,
        skipped_traces=skipped,
        trace_ids=tuple(t.trace_id for t in acc.traces),
        producers=_counted_producers(ctx, env, acc),
        verified_producers={t.trace_id: p for t in acc.traces if (p := env.verified_producers.get(t.trace_id))},
        feedback_producers={t.trace_id: p for t in acc.traces if (p := env.feedback_producers.get(t.trace_id))},
        lessons=window_lessons(reflections),
        run_facts=run_facts(acc.traces),
    )
    await ctx.send(ctx.topics.partials, rt.namespace, window_plan, rt.partition)
    ctx.metrics.window_mapped(rt.namespace, window_plan.mapped_at - env.closed_at)
    log.info(
        "mapped window %s (seq %d, v%d): %d reflections -> %d groups (%s, %d merges) in %.2fs (%.2fs after "
        "closing; slowest reflection %.2fs)",
        acc.window_id, acc.seq, playbook.version, len(reflections), len(groups), method.shuffle_key,
        forest.merge_calls, time.time() - started, waited, map_s,
    )  # fmt: skip
