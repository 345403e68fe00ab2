"""Promotion in the worker that owns a namespace: act on the decisions of :mod:`combee.promotion`.

Two entries. The combiner hands it an operator's ``promote`` / ``reject`` control record (in order with the
namespace's partials, under the namespace's lock), and :func:`promotion_loop` checks, every
``promotion.check_s``, the namespaces whose combiner this process runs: a canary's outcomes (promote or reject),
a gated candidate's answers on the validation set (workers/gate.py: promote or reject) and the live version's
outcomes against its predecessor's (roll back). Every decision is recorded in Redis with
its evidence by one script that applies it once (streams/redis_promotion.py).

A rejection, and a rollback, change the playbook the next window builds on, so they are committed by the
combiner as a new version (the live content again): the loop records the decision, then sends itself a signed
control record; the combiner commits it once (its window id is in the snapshot's ledger afterwards).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from combee.models import Playbook
from combee.promotion import Action, Decision, decide_canary, decide_rollback, plan_operator
from combee.serving import Serving
from streams.control_auth import sign
from streams.envelopes import Control
from workers.combiner.commit import commit_control, is_current, snapshot_of
from workers.context import StageContext
from workers.gate import gate_decision
from workers.runtime import NamespaceRuntime

__all__ = [
    "check_namespace",
    "handle_promotion",
    "promotion_loop",
    "reject_window_id",
    "restore_live",
    "serve_rollback",
]

log = logging.getLogger("combee.worker.promotion")
RESTORE_GRACE_S = 30.0  # a rejection's new head not committed this long after the decision is asked for again


def reject_window_id(namespace: str, version: int) -> str:
    """The window id of the version that undoes the rejection of ``version`` (at most one per rejection)."""
    return f"{namespace}/reject/v{version}"


def _head(rt: NamespaceRuntime) -> int:
    snap = snapshot_of(rt)
    return snap.playbook.version if snap is not None else 0


async def handle_promotion(ctx: StageContext, rt: NamespaceRuntime, ctrl: Control) -> None:
    """Apply an operator's (or the canary's) ``promote`` / ``reject`` of ``ctrl.to_version``. Caller holds rt.lock."""
    ns, version = rt.namespace, ctrl.to_version
    if ctx.serving is None:
        log.error("%s: %s v%d ignored: this worker has no serving state store", ns, ctrl.kind, version)
        return
    snap = snapshot_of(rt)
    if ctrl.kind == "reject" and snap is not None and reject_window_id(ns, version) in snap.applied:
        return  # done before: a redelivery
    state = await ctx.serving.serving(ns)
    counts = await ctx.outcomes.store.counts(ns) if ctx.outcomes is not None else {}
    recorded = await ctx.serving.decision(ns, f"reject/v{version}") if ctrl.kind == "reject" else None
    if recorded is None:
        action: Action = "promote" if ctrl.kind == "promote" else "reject"
        plan = plan_operator(action, version, state, _head(rt), counts, actor=ctrl.actor, at=time.time())
        if isinstance(plan, str):
            log.warning("%s: %s v%d refused: %s", ns, ctrl.kind, version, plan)
            return
        if not await _record(ctx, rt, state, plan, _head(rt)):
            return
    if ctrl.kind == "reject":
        await restore_live(ctx, rt, state.live, version)


async def _record(ctx: StageContext, rt: NamespaceRuntime, state: Serving, decision: Decision, head: int) -> bool:
    """Record ``decision`` and apply it to the serving state; False when it was stale or recorded before."""
    assert ctx.serving is not None
    serves = state.policy != "direct"  # under direct the head is served: a rollback commits a new head instead
    result = await ctx.serving.decide(
        rt.namespace,
        decision.as_json(),
        expect_live=state.live if serves or decision.action != "rollback" else "*",
        new_live=decision.serve if decision.action == "promote" or (serves and decision.action == "rollback") else None,
        rejected_through=head if decision.action == "reject" or (serves and decision.action == "rollback") else None,
        above_rejected=decision.version if decision.action == "reject" else None,
    )
    if result != "done":
        log.info("%s: %s not applied (%s)", rt.namespace, decision.id, result)
        return False
    ctx.metrics.promotion_decision(rt.namespace, decision.action, decision.decided_by.split(":")[0])
    log.warning(
        "%s: %s v%d by %s under %s (serving v%s): %s",
        rt.namespace, decision.action, decision.version, decision.decided_by, decision.policy,
        decision.serve if decision.serve is not None else "head", decision.reason,
    )  # fmt: skip
    return True


async def serve_rollback(ctx: StageContext, rt: NamespaceRuntime, ctrl: Control, head: int) -> None:
    """An operator's rollback to ``ctrl.to_version`` under a policy other than ``direct``: serve that version now
    (it is published; the new head the rollback commits is a candidate like any other) and reject the candidates
    above it. Nothing to do under ``direct`` (the new head is served) or when it is served already (a rollback on
    outcomes moved it before asking for the content)."""
    if ctx.serving is None:
        return
    state = await ctx.serving.serving(rt.namespace)
    if state.policy == "direct" or state.live == ctrl.to_version:
        return
    who, why = f"operator:{ctrl.actor or 'unknown'}", f"rolled back to v{ctrl.to_version} by an operator"
    decision = Decision("rollback", state.live or 0, who, state.policy, why, ctrl.to_version, at=time.time())
    await _record(ctx, rt, state, decision, head)


async def restore_live(ctx: StageContext, rt: NamespaceRuntime, live: int | None, rejected: int) -> None:
    """Commit the live version's playbook (empty: nothing live) as the next version, so the next window builds on
    what agents are served rather than on the rejected candidates. Once per rejection (its window id)."""
    snap = snapshot_of(rt)
    current = snap.playbook if snap is not None else Playbook(namespace=rt.namespace)
    content = Playbook(namespace=rt.namespace)
    if live:
        found = await ctx.store.get_version(rt.namespace, live)
        if found is None:
            log.error("%s: the live v%d is not in the store; the rejected head stays", rt.namespace, live)
            return
        content = Playbook.model_validate_json(found.playbook_json)
    playbook = Playbook(
        namespace=rt.namespace,
        version=current.version + 1,
        bullets=content.bullets,
        next_id=max(current.next_id, content.next_id),
    )
    note = f"candidates from v{rejected} rejected: back to the content of the live v{live or 0}"
    wid = reject_window_id(rt.namespace, rejected)
    if await commit_control(ctx, rt, playbook, wid, note, rollback_to=live or 0):
        log.info("%s: %s as v%d", rt.namespace, note, playbook.version)


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
    if decision is None or not await _record(ctx, rt, state, decision, head):
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
    Kafka away: logged, tried again at the next tick."""
    while True:
        await asyncio.sleep(ctx.config.promotion.check_s)
        for rt in list(ctx.runtimes.values()):
            try:
                await check_namespace(ctx, rt, clock())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("promotion check of %s failed: %s", rt.namespace, exc)
