"""The combiner's side of ``combee bullet release|remove|pin|unpin``: an operator's signed control record
becomes the namespace's next version, committed like a window (deltas log, snapshot, Redis compare-and-set).
The decisions are :mod:`combee.quarantine`'s; this module reads the quarantined entry and commits."""

from __future__ import annotations

import logging

from combee.models import Playbook
from combee.quarantine import UnknownBullet, release, remove_bullet, remove_bullets, set_pinned
from streams.envelopes import Control
from workers.combiner.commit import commit_control, snapshot_of
from workers.combiner.port import CombinerPort
from workers.runtime import NamespaceRuntime

__all__ = ["operate"]

log = logging.getLogger("combee.worker.combine")


async def _next(ctx: CombinerPort, current: Playbook, ctrl: Control, wid: str) -> tuple[Playbook, str | None]:
    """The playbook the action makes, and the quarantine id it resolves. Raises UnknownBullet."""
    bullet_id = ctrl.bullet_id or ""
    if ctrl.kind == "release":
        entry = await ctx.quarantine.get(ctrl.namespace, bullet_id) if ctx.quarantine is not None else None
        if entry is None:
            raise UnknownBullet(f"{ctrl.namespace}: no quarantined bullet {bullet_id}")
        return release(current, entry, wid, ctx.config.method.policy), entry.id
    if ctrl.kind == "remove" and ctrl.bullet_ids:
        return remove_bullets(current, ctrl.bullet_ids), None
    if ctrl.kind == "remove":
        return remove_bullet(current, bullet_id), None
    return set_pinned(current, bullet_id, ctrl.kind == "pin"), None


async def operate(ctx: CombinerPort, rt: NamespaceRuntime, ctrl: Control) -> None:
    """Apply an operator's action on one bullet (or a remove of several, ``bullet_ids``) as the next version
    (nothing, and an error logged, when a bullet is not there or Redis cannot be read)."""
    assert rt.tenure is not None
    snap = snapshot_of(rt)
    current = snap.playbook if snap is not None else Playbook(namespace=rt.namespace)
    named = ctrl.bullet_id if not ctrl.bullet_ids else f"{ctrl.bullet_ids[0]}+{len(ctrl.bullet_ids) - 1}"
    wid = f"{rt.namespace}/{ctrl.kind}/{named}@v{current.version + 1}"
    try:
        playbook, resolves = await _next(ctx, current, ctrl, wid)
    except UnknownBullet as exc:
        log.error("%s %s: %s", ctrl.kind, named, exc)
        return
    except Exception as exc:
        log.error("%s %s of %s: cannot read the quarantine: %s", ctrl.kind, ctrl.bullet_id, rt.namespace, exc)
        return
    note = f"{ctrl.kind} {named} by {ctrl.actor or 'an operator'}"
    if await commit_control(ctx, rt, playbook, wid, note, resolves=resolves):
        log.info("%s: %s as v%d", rt.namespace, note, playbook.version)
