"""What the pool's two stages share: take a task off its topic, run it in the background, give it up cleanly.

A reflection task (:mod:`workers.reflect`) and a curator group (:mod:`workers.curate`) are handled alike: decode
the record (a bad one is dead-lettered), wait for a slot of the stage's ``gate``, and run the task without
blocking the stream, acks staying in offset order. An LLM outage waits inside the task (``ctx.retrying``); any
other failure (a bug, bad data) is retried a few times with a growing pause, then the record is dead-lettered
and the stage sends the answer that lets the window complete without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from streams.envelopes import GroupTask, ReflectTask
from workers.context import StageContext

__all__ = ["MAX_UNEXPECTED_FAILURES", "take_task"]

log = logging.getLogger("combee.worker.pool")

MAX_UNEXPECTED_FAILURES = 5

T = TypeVar("T", GroupTask, ReflectTask)


async def take_task(
    ctx: StageContext,
    stream: Any,
    event: Any,
    gate: asyncio.Semaphore,
    *,
    stage: str,
    kind: type[T],
    run: Callable[[T], Awaitable[None]],
    give_up: Callable[[T], Awaitable[None]],
    failed: str,
) -> None:
    """Register ``event``'s task and run it in the background (bounded by ``gate``).

    ``run`` does the task; once it has failed :data:`MAX_UNEXPECTED_FAILURES` times the record is dead-lettered
    (reason: ``failed`` and the error) and ``give_up`` sends what lets the window complete without the task.
    """
    task = await ctx.receive(stream, event, kind, stage, f"a {kind.__name__}")
    if task is None:
        return
    await gate.acquire()
    ctx.in_flight_tasks += 1
    ctx.spawn(_run(ctx, task, event, gate, stage, run, give_up, failed))


async def _run(
    ctx: StageContext,
    task: T,
    event: Any,
    gate: asyncio.Semaphore,
    stage: str,
    run: Callable[[T], Awaitable[None]],
    give_up: Callable[[T], Awaitable[None]],
    failed: str,
) -> None:
    try:
        for failure in range(1, MAX_UNEXPECTED_FAILURES + 1):
            try:
                await run(task)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # not an LLM outage (those wait inside): a bug or bad data
                log.exception(
                    "%s %s/%d failed (%d/%d)", stage, task.window_id, task.index, failure, MAX_UNEXPECTED_FAILURES
                )
                if failure == MAX_UNEXPECTED_FAILURES:
                    await ctx.dead_letter(stage, f"{failed}: {exc!r}"[:400], event.message)
                    await give_up(task)
                else:
                    await asyncio.sleep(min(30.0, 2.0**failure))
        await ctx.acks.done(event)
    finally:
        ctx.in_flight_tasks -= 1
        ctx.touch()
        gate.release()
