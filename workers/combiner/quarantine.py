"""Store what a committed delta record says about the quarantine: the bullets its window held back, the id an
operator's release took out (streams/quarantine.py). In the background, retried while Redis is down: learning
never waits for it, and a combiner that replays the log writes the same entries again (idempotent)."""

from __future__ import annotations

import asyncio
import logging

from streams.envelopes import DeltaRecord
from workers.combiner.port import CombinerPort

__all__ = ["remember_quarantine"]

log = logging.getLogger("combee.worker.combine")

ATTEMPTS = 8


async def _store(ctx: CombinerPort, record: DeltaRecord) -> None:
    store = ctx.quarantine
    if store is None:
        return
    for attempt in range(ATTEMPTS):
        try:
            if record.quarantined:
                added = await store.hold(record.quarantined)
                if added:
                    log.warning(
                        "%s: %d lesson(s) of %s quarantined, not published (%s); see `combee bullet list %s "
                        "--quarantined`",
                        record.namespace, added, record.window_id,
                        ", ".join(sorted({e.reason for e in record.quarantined})), record.namespace,
                    )  # fmt: skip
            if record.resolves is not None:
                await store.resolve(record.namespace, record.resolves)
            return
        except Exception as exc:  # Redis down or refusing: try again later, learning goes on
            delay = min(30.0, 0.5 * 2**attempt) * ctx.rng.uniform(0.5, 1.0)
            log.warning("%s: cannot store the quarantine of %s yet (%s); again in %.1fs", record.namespace,
                        record.window_id, exc, delay)  # fmt: skip
            await asyncio.sleep(delay)
    log.error("%s: gave up storing the quarantine of %s (it stays in the deltas log)", record.namespace,
              record.window_id)  # fmt: skip


def remember_quarantine(ctx: CombinerPort, record: DeltaRecord) -> None:
    """Store ``record``'s quarantine entries (and its release's resolution) in the background."""
    if record.quarantined or record.resolves is not None:
        ctx.spawn(_store(ctx, record))
