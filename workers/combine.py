"""The combine stage: decode a record of the partials topic, claim its partition, hand it to the combiner.

Window plans and partial deltas (keyed by namespace) go to the scan merge (:mod:`workers.combiner.scan`), which
applies finished windows in sequence order; operators' control records, once their signature is checked, go
to a rollback, a promotion decision or an action on a bullet. The first record of a partition claims it
(:func:`~workers.combiner.claim.ensure_ready`): recovery, ownership and fencing are the combiner's
(docs/reliability.md, "Fencing zombie combiners"); each record is acked once its effect is durable.
"""

from __future__ import annotations

from typing import Any, cast

from streams.control_auth import refusal
from streams.envelopes import Control, Partial, WindowPlan
from workers.combiner.bullets import operate
from workers.combiner.claim import bind, ensure_ready
from workers.combiner.commit import is_current
from workers.combiner.promotion import handle_promotion
from workers.combiner.rollback import rollback
from workers.combiner.scan import take
from workers.context import StageContext

__all__ = ["ensure_ready", "handle_partial"]


async def handle_partial(ctx: StageContext, stream: Any, event: Any) -> None:
    kinds = (WindowPlan, Partial, Control)
    env = cast(
        "WindowPlan | Partial | Control | None",
        await ctx.receive(stream, event, kinds, "combine", "a record of the partials topic"),
    )
    if env is None:
        return
    msg = event.message
    refused = refusal(env, ctx.config.control_key) if isinstance(env, Control) else None
    if refused is not None:  # a control record not signed with this worker's key: never applied
        ctx.metrics.control_refused(refused[0])
        await ctx.dead_letter("combine", refused[1], msg)
        await ctx.acks.done(event)
        return
    tenure = await ensure_ready(ctx, msg.partition)
    if not is_current(ctx, tenure):
        return  # another tenure owns the partition now (maybe ours, after a rebalance): it redoes this record
    rt = bind(ctx, tenure, env.namespace)
    async with rt.lock:
        if isinstance(env, Control):
            if env.kind == "rollback":
                await rollback(ctx, rt, env)
            elif env.kind in ("promote", "reject"):
                await handle_promotion(ctx, rt, env)
            else:
                await operate(ctx, rt, env)
            await ctx.acks.done(event)
            return
        await take(ctx, rt, env, event)
