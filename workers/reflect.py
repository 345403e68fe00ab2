"""Reflect stage (the pool): one reflection task — a slice of a window's traces — at a time per slot,
``reflect_concurrency`` tasks at a time; the answer goes back to the window's owner (keyed by namespace).

Stateless and idempotent: a redelivered task is reflected again and its answer sent again; the owner keeps
the first answer per (window, task, playbook version) (:class:`combee.fanout.ReflectionGather`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from combee.engine import reflect
from combee.llm import Role
from combee.meter import Meter
from streams.codec import CodecError, decode
from streams.envelopes import Reflected, ReflectTask
from workers.context import StageContext

__all__ = ["handle_reflect_task"]

log = logging.getLogger("combee.worker.reflect")

MAX_UNEXPECTED_FAILURES = 5


async def handle_reflect_task(ctx: StageContext, stream: Any, event: Any, gate: asyncio.Semaphore) -> None:
    """Register the task and run it in the background (bounded by ``gate``); acks stay in offset order."""
    msg = event.message
    ctx.acks.add(stream, event)
    ctx.touch()
    try:
        task = decode(msg.value or b"")
        if not isinstance(task, ReflectTask):
            raise CodecError(f"expected a reflection task, got {task.schema_}")
    except CodecError as exc:
        await ctx.dead_letter("reflect", exc.reason, msg)
        await ctx.acks.done(event)
        return
    await gate.acquire()
    ctx.in_flight_tasks += 1
    ctx.spawn(_run(ctx, task, event, gate))


async def _run(ctx: StageContext, task: ReflectTask, event: Any, gate: asyncio.Semaphore) -> None:
    try:
        for failure in range(1, MAX_UNEXPECTED_FAILURES + 1):
            try:
                await _reflect_one(ctx, task)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # not an LLM outage (those wait inside): a bug or bad data
                log.exception(
                    "reflect %s/%d failed (%d/%d)", task.window_id, task.index, failure, MAX_UNEXPECTED_FAILURES
                )
                if failure == MAX_UNEXPECTED_FAILURES:
                    # Given up: the slice's traces are counted as skipped, so the window still completes.
                    await ctx.dead_letter("reflect", f"traces could not be reflected: {exc!r}"[:400], event.message)
                    await _answer(ctx, task, (None,) * len(task.traces), 0.0)
                else:
                    await asyncio.sleep(min(30.0, 2.0**failure))
        await ctx.acks.done(event)
    finally:
        ctx.in_flight_tasks -= 1
        ctx.touch()
        gate.release()


async def _reflect_one(ctx: StageContext, task: ReflectTask) -> None:
    attempts = ctx.config.method.parse_attempts

    async def reflect_all() -> tuple[tuple[Any, ...], Meter]:
        meter = Meter()  # per try: a retried slice is not counted twice
        outcomes = await asyncio.gather(
            *(reflect(t, task.playbook, ctx.llm, meter=meter, attempts=attempts) for t in task.traces)
        )
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
