"""Promotion in the combiner: an operator's ``promote`` / ``reject``, and the serving side of a rollback.

The combiner hands :func:`handle_promotion` a ``promote`` / ``reject`` control record (in order with the
namespace's partials, under the namespace's lock). Every decision is recorded in Redis with its evidence by one
script that applies it once (streams/redis_promotion.py, :func:`record_decision`). A rejection changes the
playbook the next window builds on, so it is committed as a new version (the live content again,
:func:`restore_live`) once: its window id is in the snapshot's ledger afterwards. The periodic check of the
namespaces (:mod:`workers.promotion`) decides and records too, and sends its rejections and rollbacks here as
signed control records.
"""

from __future__ import annotations

import logging
import time

from combee.models import Playbook
from combee.promotion import Action, Decision, plan_operator
from combee.serving import Serving
from streams.envelopes import Control
from workers.combiner.commit import commit_control, snapshot_of
from workers.combiner.port import CombinerPort
from workers.runtime import NamespaceRuntime

__all__ = ["handle_promotion", "record_decision", "reject_window_id", "restore_live", "serve_rollback"]

log = logging.getLogger("combee.worker.promotion")


def reject_window_id(namespace: str, version: int) -> str:
    """The window id of the version that undoes the rejection of ``version`` (at most one per rejection)."""
    return f"{namespace}/reject/v{version}"


def _head(rt: NamespaceRuntime) -> int:
    snap = snapshot_of(rt)
    return snap.playbook.version if snap is not None else 0


async def handle_promotion(ctx: CombinerPort, rt: NamespaceRuntime, ctrl: Control) -> None:
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
        if not await record_decision(ctx, rt, state, plan, _head(rt)):
            return
    if ctrl.kind == "reject":
        await restore_live(ctx, rt, state.live, version)


async def record_decision(
    ctx: CombinerPort, rt: NamespaceRuntime, state: Serving, decision: Decision, head: int
) -> bool:
    """Record ``decision`` and apply it to the serving state; False when it was stale or recorded before.
    ``head``: the namespace's newest version, through which a rejection or a served rollback rejects."""
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


async def serve_rollback(ctx: CombinerPort, rt: NamespaceRuntime, ctrl: Control, head: int) -> None:
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
    await record_decision(ctx, rt, state, decision, head)


async def restore_live(ctx: CombinerPort, rt: NamespaceRuntime, live: int | None, rejected: int) -> None:
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
