"""Worker tier: the window stage counts each trace's outcome for the version it names, and a trace is acked only
once its window is written *and* its outcome counted; a restarted worker that re-reads the same offsets counts
nothing twice. The store is an in-memory stand-in that does what the Redis script does (combee.outcomes.record).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from combee.outcomes import Ledger, Observation, OutcomeCounts, record
from streams.redis_outcomes import RecordResult
from tests.fakes import ScriptedLLM, echo_script
from tests.workers.test_stages import Event, MemoryKafka, Msg, Stream, learner
from workers.context import StageContext
from workers.outcomes import OutcomeRecorder
from workers.window import close_due_windows, handle_trace


@dataclass
class LedgerStore:
    """The Redis script's semantics in memory; ``down`` makes every call fail as Redis unreachable would."""

    live: int = 3
    down: bool = False
    ledgers: dict[str, Ledger] = field(default_factory=dict)

    async def record(self, namespace: str, partition: int, observations: Sequence[Observation]) -> RecordResult:
        if self.down:
            raise ConnectionError("redis down")
        ledger, counted = record(self.ledgers.get(namespace, Ledger()), partition, observations, self.live)
        self.ledgers[namespace] = ledger
        return RecordResult(counted, len(observations) - counted, ledger.marks.get(partition, -1))

    async def counts(self, namespace: str) -> dict[str, OutcomeCounts]:
        return dict(self.ledgers.get(namespace, Ledger()).counts)


def versioned(ns: str, i: int) -> bytes:
    """Trace i names version i % 5 (4 is above the live 3) and succeeds when i is even; every third names none."""
    body: dict = {"namespace": ns, "trace_id": f"{ns}-{i}", "task": f"task {i}"}
    if i % 3:
        body |= {"playbook_version": i % 5, "feedback": {"success": i % 2 == 0, "score": i / 4}}
    return json.dumps(body).encode()


def expected(n: int) -> dict[str, OutcomeCounts]:
    out: dict[str, OutcomeCounts] = {}
    for i in range(n):
        if i % 3:
            key = str(i % 5) if i % 5 <= 3 else "unknown"
            won = i % 2 == 0
            out[key] = out.get(key, OutcomeCounts()) + OutcomeCounts(
                success=int(won), failure=int(not won), score_sum=i / 4, score_count=1
            )
    return out


def worker(kafka: MemoryKafka, store: LedgerStore) -> StageContext:
    ctx = learner(kafka, ScriptedLLM(echo_script))
    ctx.outcomes = OutcomeRecorder(store, ctx.acks.done)
    return ctx


async def deliver_traces(ctx: StageContext, kafka: MemoryKafka, stream: Stream, ns: str, start: int = 0) -> None:
    for msg in kafka.records(ctx.topics.traces)[start:]:
        await handle_trace(ctx, stream, Event(Msg(msg.topic, msg.partition, msg.offset, msg.key, msg.value)))
    await close_due_windows(ctx, now=1e12)  # every buffered trace is due


async def publish(kafka: MemoryKafka, ctx: StageContext, ns: str, n: int) -> None:
    for i in range(n):
        await kafka.send(ctx.topics.traces, ns.encode(), versioned(ns, i), ctx.home_partition(ns))


async def test_traces_are_acked_only_after_their_outcomes_are_counted() -> None:
    kafka, stream, store = MemoryKafka(), Stream(), LedgerStore()
    ctx = worker(kafka, store)
    await publish(kafka, ctx, "alpha", 30)
    await deliver_traces(ctx, kafka, stream, "alpha")
    traces = [a for a in stream.acked if a[0] == ctx.topics.traces]
    assert traces == []  # the windows are written, the counts are not: nothing acked yet
    assert ctx.outcomes is not None and ctx.outcomes.busy()

    await ctx.outcomes.flush()
    assert await store.counts("alpha") == expected(30)
    assert len([a for a in stream.acked if a[0] == ctx.topics.traces]) == 30
    assert not ctx.outcomes.busy()


async def test_redis_down_holds_the_acks_and_loses_no_count() -> None:
    kafka, stream, store = MemoryKafka(), Stream(), LedgerStore(down=True)
    ctx = worker(kafka, store)
    await publish(kafka, ctx, "alpha", 12)
    await deliver_traces(ctx, kafka, stream, "alpha")
    assert ctx.outcomes is not None
    with pytest.raises(ConnectionError):
        await ctx.outcomes.flush()
    assert [a for a in stream.acked if a[0] == ctx.topics.traces] == []
    assert len(kafka.records(ctx.topics.windows)) >= 1  # learning went on
    store.down = False
    await ctx.outcomes.flush()
    assert await store.counts("alpha") == expected(12)
    assert len([a for a in stream.acked if a[0] == ctx.topics.traces]) == 12


async def test_a_restart_that_rereads_the_same_offsets_counts_nothing_twice() -> None:
    kafka, store = MemoryKafka(), LedgerStore()
    first = worker(kafka, store)
    await publish(kafka, first, "alpha", 20)
    await deliver_traces(first, kafka, Stream(), "alpha")
    assert first.outcomes is not None
    await first.outcomes.flush()  # counted; then the worker dies before Kafka's commit

    await publish(kafka, first, "alpha", 10)  # ten more (offsets 20..29; their i repeats 0..9)
    restarted = worker(kafka, store)
    await deliver_traces(restarted, kafka, Stream(), "alpha", start=5)  # the commit lagged: 5.. read again
    assert restarted.outcomes is not None
    await restarted.outcomes.flush()
    assert await store.counts("alpha") == _sum(expected(20), expected(10))
    assert restarted.outcomes.skipped == len([i for i in range(5, 20) if i % 3])


def _sum(a: dict[str, OutcomeCounts], b: dict[str, OutcomeCounts]) -> dict[str, OutcomeCounts]:
    return {k: a.get(k, OutcomeCounts()) + b.get(k, OutcomeCounts()) for k in set(a) | set(b)}
