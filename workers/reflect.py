"""Reflect stage (the pool): one reflection task — a slice of a window's traces — at a time per slot,
``reflect_concurrency`` tasks at a time; the answer goes back to the window's owner (keyed by namespace).

Stateless and idempotent: a redelivered task is reflected again and its answer sent again; the owner keeps
the first answer per (window, task, playbook version) (:class:`combee.fanout.ReflectionGather`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from combee.llm import Role
from combee.meter import Meter
from combee.roles import reflect
from streams.envelopes import Reflected, ReflectTask
from workers.context import StageContext
from workers.pool import take_task

__all__ = ["handle_reflect_task"]


async def handle_reflect_task(ctx: StageContext, stream: Any, event: Any, gate: asyncio.Semaphore) -> None:
    """Take a reflection task off the stream and reflect it in the background (:func:`workers.pool.take_task`)."""

    async def skip(task: ReflectTask) -> None:
        # Given up: the slice's traces are counted as skipped, so the window still completes.
        await _answer(ctx, task, (None,) * len(task.traces), 0.0)

    await take_task(
        ctx, stream, event, gate, stage="reflect", kind=ReflectTask, run=lambda task: _reflect_one(ctx, task),
        give_up=skip, failed="traces could not be reflected",
    )  # fmt: skip


async def _reflect_one(ctx: StageContext, task: ReflectTask) -> None:
    method = ctx.config.method

    async def reflect_all() -> tuple[tuple[Any, ...], Meter]:
        meter = Meter()  # per try: a retried slice is not counted twice
        outcomes = await asyncio.gather(
            *(
                reflect(
                    t, task.playbook, ctx.llm, meter=meter, attempts=method.parse_attempts,
                    sections=method.sections, screen=method.screen,
                )
                for t in task.traces
            )
        )  # fmt: skip
        return tuple(outcomes), meter

    outcomes, meter = await ctx.retrying(f"reflect {task.window_id}/{task.index}", reflect_all, Role.REFLECTOR)
    ctx.metrics.llm_usage(meter)
    await _answer(ctx, task, tuple(o.value for o in outcomes), max(o.service_s for o in outcomes))


async def _answer(ctx: StageContext, task: ReflectTask, reflections: tuple[Any, ...], service_s: float) -> None:
    answer = Reflected(
        window_id=task.window_id,
        namespace=task.namespace,
        index=task.index,
        base_version=task.playbook.version,
        reflections=reflections,
        service_s=service_s,
        worker=ctx.owner,
    )
    await ctx.send(ctx.topics.reflections, task.namespace, answer)
