"""The periodic promotion check of the namespaces this process's combiner owns: act on :mod:`combee.promotion`.

:func:`promotion_loop` checks, every ``promotion.check_s``, the namespaces whose combiner this process runs: a
canary's outcomes (promote or reject), a gated candidate's answers on the validation set (workers/gate.py:
promote or reject) and the live version's outcomes against its predecessor's (roll back). Every decision is
recorded in Redis with its evidence by one script that applies it once (streams/redis_promotion.py).

A rejection, and a rollback, change the playbook the next window builds on, so they are committed by the
combiner as a new version (the live content again, :mod:`workers.combiner.promotion`): the loop records the
decision, then sends itself a signed control record; the combiner commits it once (its window id is in the
snapshot's ledger afterwards).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from combee.promotion import Decision, decide_canary, decide_rollback
from combee.serving import Serving
from streams.control_auth import sign
from streams.envelopes import Control
from workers.combiner.commit import is_current, snapshot_of
from workers.combiner.promotion import record_decision, reject_window_id
from workers.context import StageContext
from workers.gate import gate_decision
from workers.runtime import NamespaceRuntime

__all__ = ["check_namespace", "promotion_loop"]

log = logging.getLogger("combee.worker.promotion")
RESTORE_GRACE_S = 30.0  # a rejection's new head not committed this long after the decision is asked for again


async def check_namespace(ctx: StageContext, rt: NamespaceRuntime, now: float) -> Decision | None:
    """One check of a namespace this process owns: a canary's or the gate's decision, else a rollback on outcomes;
    acted on.
    Returns the decision taken (None: nothing to do, or not this process's namespace)."""
    if ctx.serving is None or ctx.outcomes is None or rt.tenure is None or not is_current(ctx, rt.tenure):
        return None
    history = await ctx.store.history(rt.namespace, limit=2)
    if not history:
        return None
    head = history[0].version
    state = await ctx.serving.serving(rt.namespace)
    await _ask_restore_again(ctx, rt, state, head, now)
    counts = await ctx.outcomes.store.counts(rt.namespace)
    rule = ctx.config.promotion.rule
    decision = decide_canary(state, head, counts, rule, at=now)
    if decision is None and state.policy == "gate":
        decision = await gate_decision(ctx, rt.namespace, state, head, now)
        if decision is not None:  # the evaluation took time: the owner and the head may have moved
            if not is_current(ctx, rt.tenure):
                return None
            head = await ctx.serving.head(rt.namespace) or head
    if decision is None and ctx.config.promotion.rollback_on_outcomes:
        if state.policy == "direct":
            from_rollback = (history[0].meta or {}).get("rollback_to") is not None
            before = history[1].version if len(history) > 1 and not from_rollback else None
            decision = decide_rollback("direct", head, before, counts, rule, at=now)
        elif state.live is not None:
            decision = decide_rollback(state.policy, state.live, state.previous, counts, rule, at=now)
    if decision is None or not await record_decision(ctx, rt, state, decision, head):
        return None
    if decision.action in ("reject", "rollback"):
        kind = "reject" if decision.action == "reject" else "rollback"
        target = decision.version if kind == "reject" else (decision.serve or 0)
        await _send_control(ctx, rt, Control(namespace=rt.namespace, kind=kind, to_version=target,
                                             actor=f"combee:{decision.decided_by}", requested_at=now))  # fmt: skip
    return decision


async def _ask_restore_again(ctx: StageContext, rt: NamespaceRuntime, state: Serving, head: int, now: float) -> None:
    """A rejection is recorded but its new head (the live content) was never committed: the process that recorded
    it stopped before its control record reached Kafka. Ask again, once per process and only after a grace time;
    a request that was merely slow is then a duplicate, which the combiner ignores (once per window id)."""
    assert ctx.serving is not None
    if state.policy == "direct" or head > state.rejected_through:
        return
    moves = [d for d in await ctx.serving.decisions(rt.namespace) if d.get("action") in ("reject", "rollback")]
    if not moves or moves[-1].get("action") != "reject":  # the newest move is what is not committed yet
        return
    last = moves[-1]
    version = int(last.get("version") or 0)
    wid = reject_window_id(rt.namespace, version)
    snap = snapshot_of(rt)
    grace = max(RESTORE_GRACE_S, 3 * ctx.config.promotion.check_s)
    if now - float(last.get("at") or 0.0) < grace or (snap is not None and wid in snap.applied):
        return
    if wid in ctx.restores_asked:
        return
    ctx.restores_asked.add(wid)
    log.warning("%s: the rejection of v%d was never committed as a new head: asking the combiner again", rt.namespace,
                version)  # fmt: skip
    await _send_control(ctx, rt, Control(namespace=rt.namespace, kind="reject", to_version=version,
                                         actor="combee:restore", requested_at=now))  # fmt: skip


async def _send_control(ctx: StageContext, rt: NamespaceRuntime, ctrl: Control) -> None:
    key = ctx.config.control_key
    await ctx.send(ctx.topics.partials, rt.namespace, sign(ctrl, key) if key is not None else ctrl, rt.partition)


async def promotion_loop(ctx: StageContext, clock: Callable[[], float] = time.time) -> None:
    """Background task: :func:`check_namespace` for every namespace every ``promotion.check_s`` seconds. Redis or
    Kafka away: logged, tried again at the next tick.

    Each namespace's check runs as a task of its own, at most one per namespace at a time: a gate evaluation
    (minutes of generator calls on a real model) delays only its own namespace's next check, never the canary
    decisions and rollbacks of the others."""
    running: dict[str, asyncio.Task[None]] = {}
    try:
        while True:
            await asyncio.sleep(ctx.config.promotion.check_s)
            for ns in [ns for ns, task in running.items() if task.done()]:
                del running[ns]
            for rt in list(ctx.runtimes.values()):
                if rt.namespace not in running:
                    running[rt.namespace] = asyncio.create_task(_check_logged(ctx, rt, clock()))
    finally:
        for task in running.values():
            task.cancel()


async def _check_logged(ctx: StageContext, rt: NamespaceRuntime, now: float) -> None:
    try:
        await check_namespace(ctx, rt, now)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning("promotion check of %s failed: %s", rt.namespace, exc)
