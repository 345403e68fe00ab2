"""The combiner's pending pool (combee/corroborate.py): loaded from Redis once per tenure, kept in memory, the
entries a window changed written back after the window is committed (streams/pending.py).

While Redis cannot be read, a window is judged against an empty pool (a lesson then needs its k teachers
within the windows learned meanwhile: never less corroboration, only less memory of it) and the loading is
tried again at the next window; writes that fail are retried with the next window's.
"""

from __future__ import annotations

import asyncio
import logging

from combee.corroborate import Corroborated, PendingLesson
from workers.combiner.port import CombinerPort
from workers.tenure import Combining

__all__ = ["keep_pending", "pending_pool"]

log = logging.getLogger("combee.worker.combine")

TIMEOUT_S = 5.0


async def pending_pool(ctx: CombinerPort, state: Combining) -> tuple[PendingLesson, ...]:
    """The namespace's pool (loaded from Redis the first time in ``state``'s tenure; empty while it cannot be)."""
    if state.pending is not None:
        return state.pending
    if ctx.pending is None:
        state.pending = ()
        return state.pending
    try:
        state.pending = tuple(await asyncio.wait_for(ctx.pending.entries(state.namespace), TIMEOUT_S))
    except Exception as exc:  # Redis down: an empty pool for now, loaded at the next window
        log.warning("%s: cannot read the pending lessons yet (%s); this window starts from none", state.namespace, exc)
        return ()
    return state.pending


async def keep_pending(ctx: CombinerPort, state: Combining, corroborated: Corroborated | None) -> None:
    """After a committed window: the pool it left in memory, and its changes written to Redis."""
    if corroborated is None and not state.pending_unsaved:
        return
    if corroborated is not None:
        if state.pending is not None:  # a pool not loaded stays to be loaded (this window's entries are saved)
            state.pending = corroborated.pending
        state.pending_unsaved |= {*corroborated.changed, *corroborated.resolved}
    if ctx.pending is None:
        return
    pool = {e.id: e for e in (corroborated.pending if corroborated is not None else state.pending or ())}
    write = [pool[i] for i in sorted(state.pending_unsaved) if i in pool]
    delete = [i for i in sorted(state.pending_unsaved) if i not in pool]
    try:
        await asyncio.wait_for(ctx.pending.save(state.namespace, write, delete), TIMEOUT_S)
    except Exception as exc:  # kept in memory; written with the next window's changes
        unsaved = len(state.pending_unsaved)
        log.warning("%s: cannot store %d pending lesson change(s) yet (%s)", state.namespace, unsaved, exc)
        return
    state.pending_unsaved.clear()
