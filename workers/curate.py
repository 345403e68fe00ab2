"""Curate stage: one curator call per level-1 group task, ``curate_concurrency`` calls at a time.

Stateless and idempotent: a redelivered task produces a partial for the same (window, level 1, index), and
the combiner keeps the first one it sees.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from combee.llm import Role
from combee.meter import Meter
from combee.roles import curate
from streams.envelopes import GroupTask, Partial
from workers.context import StageContext
from workers.pool import take_task

__all__ = ["handle_group"]

log = logging.getLogger("combee.worker.curate")


async def handle_group(ctx: StageContext, stream: Any, event: Any, gate: asyncio.Semaphore) -> None:
    """Take a group task off the stream and curate it in the background (:func:`workers.pool.take_task`)."""

    async def skip(task: GroupTask) -> None:
        await _send_partial(ctx, task, None, 0.0, Meter())  # a skipped group, so the window completes

    await take_task(
        ctx, stream, event, gate, stage="curate", kind=GroupTask, run=lambda task: _curate_one(ctx, task),
        give_up=skip, failed="group could not be curated",
    )  # fmt: skip


async def _curate_one(ctx: StageContext, task: GroupTask) -> None:
    meter = Meter()
    outcome = await ctx.retrying(
        f"curate {task.window_id}/{task.index}",
        lambda: curate(
            task.reflections,
            task.playbook,
            ctx.llm,
            meter=meter,
            attempts=ctx.config.method.parse_attempts,
            sections=ctx.config.method.sections,
        ),
        Role.CURATOR,
    )
    ctx.metrics.llm_usage(meter)
    await _send_partial(ctx, task, outcome.value, outcome.service_s, meter)


async def _send_partial(ctx: StageContext, task: GroupTask, ops: Any, service_s: float, meter: Meter) -> None:
    role = meter.roles.get("curator")
    partial = Partial(
        window_id=task.window_id,
        namespace=task.namespace,
        level=1,
        index=task.index,
        ops=ops or (),
        ok=ops is not None,
        service_s=service_s,
        calls=role.calls if role else 0,
        prompt_tokens=role.prompt_tokens if role else 0,
        completion_tokens=role.completion_tokens if role else 0,
    )
    await ctx.send(ctx.topics.partials, task.namespace, partial)
    if not partial.ok:
        log.warning("group %s/%d skipped: no parsable curator answer", task.window_id, task.index)
