"""Curate stage: one curator call per level-1 group task, ``curate_concurrency`` calls at a time.

Stateless and idempotent: a redelivered task produces a partial for the same (window, level 1, index), and
the combiner keeps the first one it sees.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from combee.engine import curate
from combee.llm import Role
from combee.meter import Meter
from streams.codec import CodecError, decode
from streams.envelopes import GroupTask, Partial
from workers.context import StageContext

__all__ = ["handle_group"]

log = logging.getLogger("combee.worker.curate")


async def handle_group(ctx: StageContext, stream: Any, event: Any, gate: asyncio.Semaphore) -> None:
    """Register the task and run it in the background (bounded by ``gate``); acks stay in offset order."""
    msg = event.message
    ctx.acks.add(stream, event)
    ctx.touch()
    try:
        task = decode(msg.value or b"")
        if not isinstance(task, GroupTask):
            raise CodecError(f"expected a group task, got {task.schema_}")
    except CodecError as exc:
        await ctx.dead_letter("curate", exc.reason, msg)
        await ctx.acks.done(event)
        return
    await gate.acquire()
    ctx.in_flight_tasks += 1
    ctx.spawn(_run(ctx, task, event, gate))


MAX_UNEXPECTED_FAILURES = 5


async def _run(ctx: StageContext, task: GroupTask, event: Any, gate: asyncio.Semaphore) -> None:
    try:
        for failure in range(1, MAX_UNEXPECTED_FAILURES + 1):
            try:
                await _curate_one(ctx, task)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # not an LLM outage (those wait inside): a bug or bad data
                log.exception(
                    "curate %s/%d failed (%d/%d)", task.window_id, task.index, failure, MAX_UNEXPECTED_FAILURES
                )
                if failure == MAX_UNEXPECTED_FAILURES:
                    await ctx.dead_letter("curate", f"group could not be curated: {exc!r}"[:400], event.message)
                    await _send_partial(ctx, task, None, 0.0, Meter())  # skipped group, so the window completes
                else:
                    await asyncio.sleep(min(30.0, 2.0**failure))
        await ctx.acks.done(event)
    finally:
        ctx.in_flight_tasks -= 1
        ctx.touch()
        gate.release()


async def _curate_one(ctx: StageContext, task: GroupTask) -> None:
    meter = Meter()
    outcome = await ctx.retrying(
        f"curate {task.window_id}/{task.index}",
        lambda: curate(
            task.reflections, task.playbook, ctx.llm, meter=meter, attempts=ctx.config.method.parse_attempts
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
