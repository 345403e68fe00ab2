"""The map stage's reflections, spread over the pool: send a window's reflection tasks, gather the answers.

The owner of a namespace cuts an accepted window into reflection tasks (:func:`combee.fanout.task_slices`)
and sends them to the reflect topic, one partition after the other (:func:`streams.topics.task_partition`),
so every worker of the pool takes a share; the answers come back on the reflections topic, keyed by
namespace, to this owner (:func:`handle_reflected`). :class:`combee.fanout.ReflectionGather` keeps the first
answer per task, so a redelivered or re-sent task changes nothing, and gives the reflections in trace order:
the plan is the one a single process would have made.

A pool worker that dies takes its unacknowledged tasks with it only until Kafka gives its partitions to
another worker, which reflects them again. An owner that dies leaves its window unacknowledged: the next
owner maps it again, taking the answers that are already on their way.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from combee.fanout import ReflectionGather, task_slices
from combee.models import Playbook, Reflection, Trace
from streams.envelopes import Reflected, ReflectTask
from streams.topics import task_partition
from workers.context import StageContext

__all__ = ["handle_reflected", "reflect_window"]

log = logging.getLogger("combee.worker.map")

WARN_AFTER_S = 120.0  # silence from the pool this long is worth a line in the owner's log


async def reflect_window(
    ctx: StageContext, namespace: str, window_id: str, seq: int, traces: tuple[Trace, ...], playbook: Playbook
) -> tuple[list[Reflection], int, float]:
    """Reflect every trace of the window through the pool; returns the reflections in trace order, how many
    traces had none (their answers never parsed), and the slowest reflection's service time."""
    gather = ReflectionGather(task_slices(len(traces), ctx.config.reflect_task_size), playbook.version)
    waiting = ctx.gathers.expect(window_id, gather)  # before sending: an answer may come back at once
    try:
        partitions = ctx.topics.partitions
        await asyncio.gather(
            *(
                ctx.send(
                    ctx.topics.reflect,
                    f"{window_id}/{index}",
                    ReflectTask(
                        window_id=window_id,
                        namespace=namespace,
                        seq=seq,
                        index=index,
                        playbook=playbook,
                        traces=traces[span.start : span.stop],
                    ),
                    task_partition(window_id, index, partitions),
                )
                for index in gather.missing()
                for span in (gather.slices[index],)
            )
        )
        quiet_s = 0.0
        while not gather.complete:
            try:
                await asyncio.wait_for(waiting.arrived.wait(), timeout=WARN_AFTER_S)
            except TimeoutError:
                quiet_s += WARN_AFTER_S
                log.warning(
                    "window %s: %d of %d reflection tasks unanswered after %.0fs without an answer; is a worker "
                    "with --role curate (or all) running?",
                    window_id, len(gather.missing()), len(gather.slices), quiet_s,
                )  # fmt: skip
                continue
            quiet_s = 0.0
            waiting.arrived.clear()
            ctx.touch()
    finally:
        ctx.gathers.done(window_id)
    answers = gather.reflections()
    reflections = [r for r in answers if r is not None]
    return reflections, len(answers) - len(reflections), gather.service_s


async def handle_reflected(ctx: StageContext, stream: Any, event: Any) -> None:
    """One answer on the reflections topic: hand it to the window awaiting it (or keep it for later); ack."""
    env = await ctx.receive(stream, event, Reflected, "map", "a reflection answer")
    if env is None:
        return
    if not ctx.gathers.offer(env):
        log.debug("answer %s/%d (v%d) kept for later or a duplicate", env.window_id, env.index, env.base_version)
    await ctx.acks.done(event)
