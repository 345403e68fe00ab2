"""The combiner's incremental scan merge: open windows take their plan and partials, merges start as soon
as a node's own children are present (:class:`combee.scan.ReduceTracker`), and finished windows are applied
strictly in sequence order (:mod:`workers.combiner.apply`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from combee.llm import Role
from combee.meter import Meter
from combee.models import Playbook
from combee.roles import merge
from combee.scan import ReadyNode, ReduceTracker
from streams.envelopes import Partial, WindowPlan
from workers.combiner.apply import apply_window
from workers.combiner.port import CombinerPort
from workers.runtime import NamespaceRuntime
from workers.tenure import Combining, OpenWindow

__all__ = ["progress", "take"]

log = logging.getLogger("combee.worker.combine")


async def take(ctx: CombinerPort, rt: NamespaceRuntime, env: WindowPlan | Partial, event: Any) -> None:
    """Take a window plan or a partial delta of ``rt``'s namespace (``event``'s record, read under the tenure
    ``rt`` is bound to) into its open window, then :func:`progress`. A record of a window applied already is
    acked at once. Caller holds rt.lock."""
    state = rt.combining
    assert state is not None
    snap = state.snapshot
    if snap is not None and env.window_id in snap.applied:
        await ctx.acks.done(event)  # a redelivery of a window already applied
        return
    w = state.windows.setdefault(env.window_id, OpenWindow(env.window_id))
    w.events.append(event)
    if isinstance(env, WindowPlan):
        if snap is not None and env.seq < snap.next_seq:  # applied long ago (older than the ledger)
            for e in state.windows.pop(env.window_id).events:
                await ctx.acks.done(e)
            return
        if w.plan is None:
            w.plan = env
            w.tracker = ReduceTracker(env.groups, env.tree, env.roots, env.unite)
            state.by_seq[env.seq] = env.window_id
            for level, index, ops in w.early:
                w.tracker.add(level, index, ops)
            w.early.clear()
    elif w.tracker is not None:
        if w.tracker.add(env.level, env.index, env.ops):
            w.service[(env.level, env.index)] = env.service_s
    else:
        w.early.append((env.level, env.index, env.ops))
        w.service[(env.level, env.index)] = env.service_s
    await progress(ctx, rt)


async def progress(ctx: CombinerPort, rt: NamespaceRuntime) -> None:
    """Start every ready merge; apply every finished window that is next in sequence. Caller holds rt.lock."""
    state = rt.combining
    if state is None or state.tenure.fenced:
        return
    for w in state.windows.values():
        if w.tracker is not None:
            for node in w.tracker.ready():
                ctx.spawn(_merge(ctx, rt, state, w, node))
    while True:
        snap = state.snapshot
        wid = state.by_seq.get(snap.next_seq if snap is not None else 0)
        ready = state.windows.get(wid) if wid is not None else None
        if ready is None or ready.tracker is None or (ops := ready.tracker.result()) is None:
            return
        if not await apply_window(ctx, rt, ready, ops):
            return


def _base_playbook(state: Combining, version: int) -> Playbook:
    snap = state.snapshot
    current = snap.playbook if snap is not None else Playbook(namespace=state.namespace)
    return state.playbooks.get(version, current)


async def _merge(ctx: CombinerPort, rt: NamespaceRuntime, state: Combining, w: OpenWindow, node: ReadyNode) -> None:
    """One merge call of window ``w`` (open in ``state``), its partial sent and taken in, then :func:`progress`."""
    assert w.plan is not None
    base = _base_playbook(state, w.plan.base_version)
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
                rt.combining is state
                and state.windows.get(w.window_id) is w
                and w.tracker is not None
                and w.tracker.add(node.level, node.index, ops)
            ):
                w.service[(node.level, node.index)] = outcome.service_s
                await progress(ctx, rt)
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


async def _offer_again(ctx: CombinerPort, rt: NamespaceRuntime, delay_s: float) -> None:
    await asyncio.sleep(delay_s)
    async with rt.lock:
        await progress(ctx, rt)
