"""An operator's rollback: the content of an earlier version becomes the namespace's next version."""

from __future__ import annotations

import logging

from combee.models import Playbook
from streams.envelopes import Control
from workers.combiner.commit import commit_control, snapshot_of
from workers.combiner.port import CombinerPort
from workers.combiner.promotion import serve_rollback
from workers.runtime import NamespaceRuntime

__all__ = ["rollback"]

log = logging.getLogger("combee.worker.combine")


async def rollback(ctx: CombinerPort, rt: NamespaceRuntime, ctrl: Control) -> None:
    """Make the content of version ``to_version`` the next version (versions never go backwards)."""
    assert rt.tenure is not None
    snap = snapshot_of(rt)
    current = snap.playbook if snap is not None else Playbook(namespace=rt.namespace)
    try:
        target = await ctx.store.get_version(rt.namespace, ctrl.to_version)
    except Exception as exc:
        log.error("rollback of %s to v%d: cannot read it from Redis: %s", rt.namespace, ctrl.to_version, exc)
        return
    if target is None:
        log.error("rollback of %s: version %d is not in the store", rt.namespace, ctrl.to_version)
        return
    old = Playbook.model_validate_json(target.playbook_json)
    await serve_rollback(ctx, rt, ctrl, current.version)  # under a policy other than direct: serve it at once
    playbook = Playbook(
        namespace=rt.namespace,
        version=current.version + 1,
        bullets=old.bullets,
        next_id=max(current.next_id, old.next_id),
    )
    wid = f"{rt.namespace}/rollback/v{ctrl.to_version}@v{playbook.version}"
    note = f"rollback to the content of v{ctrl.to_version}"
    if not await commit_control(ctx, rt, playbook, wid, note, rollback_to=ctrl.to_version):
        return
    log.info("rolled %s back to the content of v%d as v%d", rt.namespace, ctrl.to_version, playbook.version)
