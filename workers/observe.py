"""What a worker reports that is no stage's own: consumer lag, versions seen in Redis and the outcome counts of
its namespaces (docs/operations.md).

Both report through the context's :class:`combee.metrics.Metrics` (a no-op when metrics are off).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from workers.context import StageContext
from workers.outcomes import DEFAULT_LABELLED_VERSIONS, OutcomeRecorder, outcome_totals

__all__ = ["export_outcomes", "lag_reporter", "publish_listener", "report_lag"]

log = logging.getLogger("combee.worker")


def publish_listener(ctx: StageContext, clock: Callable[[], float] = time.time) -> Callable[[str, int], None]:
    """The publisher's ``on_published``: the version Redis holds, and how long after its window closed (by
    ``clock``, the wall clock the window's closing time was taken from)."""

    def published(namespace: str, version: int) -> None:
        rt = ctx.runtimes.get(namespace)
        closed = rt.published(version) if rt is not None else None
        ctx.metrics.prompt_published(namespace, version, None if closed is None else clock() - closed)

    return published


async def report_lag(ctx: StageContext, consumer: Any, reported: set[tuple[str, int]]) -> set[tuple[str, int]]:
    """Report the lag of every assigned partition of the stages' topics; forget the ones no longer assigned.

    Lag is the partition's end offset (the consumer's last-seen high watermark) minus its first unfinished
    offset (every record before it is done and acked; the fetch position when no record came since the
    assignment). Returns the partitions reported, for the next call.
    """
    now: set[tuple[str, int]] = set()
    for tp in sorted(consumer.assignment()):
        if tp.topic not in ctx.topics.stage_inputs:
            continue
        end = consumer.highwater(tp)
        if end is None:
            continue
        first = ctx.acks.next_unfinished(tp.topic, tp.partition)
        if first is None:
            first = await consumer.position(tp)
        if first is None:
            continue
        ctx.metrics.consumer_lag(tp.topic, tp.partition, end - first)
        now.add((tp.topic, tp.partition))
    for topic, partition in sorted(reported - now):
        ctx.metrics.consumer_lag(topic, partition, None)
    return now


async def lag_reporter(ctx: StageContext, consumer: Callable[[], Any], period_s: float = 5.0) -> None:
    """Background task: :func:`report_lag` every ``period_s`` seconds (``consumer()`` gives Faust's consumer)."""
    reported: set[tuple[str, int]] = set()
    while True:
        await asyncio.sleep(period_s)
        try:
            reported = await report_lag(ctx, consumer(), reported)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a rebalance in progress, the broker away: lag is best effort
            log.debug("consumer lag not reported: %s", exc)


async def export_outcomes(ctx: StageContext, recorder: OutcomeRecorder, keep: int = DEFAULT_LABELLED_VERSIONS) -> None:
    """Hand the metrics the counts of the namespaces whose traces this worker takes (their owner exports them,
    so a scrape of every worker sums to the counts in Redis). Best effort: Redis down leaves the last ones."""

    def live(namespace: str) -> int | None:
        snap = ctx.snapshots.get(namespace)
        return snap.playbook.version if snap is not None and snap.playbook.version > 0 else None

    owned = sorted(rt.namespace for rt in ctx.runtimes.values() if rt.traces_seen)
    try:
        ctx.metrics.outcome_totals(await outcome_totals(recorder.store, owned, live, keep))
    except Exception as exc:
        log.debug("outcome counts not read for the metrics: %s", exc)
