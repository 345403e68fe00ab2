"""Issue 16: one namespace's reflections spread over a pool of workers, through the reflect topic.

Worker A owns the namespace (window, map, combine); the reflect topic's partitions are shared between A and a
second worker B, as Kafka's group would share them. The playbook must be exactly the one-worker playbook,
whichever worker reflected which slice, and a task redelivered or reflected twice must change nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

from combee.llm import Role
from streams.envelopes import DeltaRecord
from tests.fakes import ScriptedLLM, echo_script
from tests.workers.test_stages import Event, MemoryKafka, Stream, deliver, deltas, feed_traces, learner
from workers.context import StageContext
from workers.window import close_due_windows


async def learn(traces: int, *, pool: list[StageContext], owner: StageContext, kafka: MemoryKafka) -> None:
    """Run until quiet; reflect-topic partition p is consumed by ``pool[p % len(pool)]``, the rest by A."""
    stream, seen, gate = Stream(), set[tuple[str, int, int]](), asyncio.Semaphore(8)
    await feed_traces(owner, kafka, stream, "alpha", traces)
    for _ in range(400):
        await asyncio.sleep(0.02)  # past max_wait
        moved = await close_due_windows(owner)
        for topic in (owner.topics.windows, owner.topics.reflect, owner.topics.reflections, owner.topics.groups,
                      owner.topics.partials):  # fmt: skip
            for msg in kafka.records(topic):
                key = (msg.topic, msg.partition, msg.offset)
                if key in seen:
                    continue
                seen.add(key)
                moved += 1
                ctx = pool[msg.partition % len(pool)] if topic == owner.topics.reflect else owner
                await deliver(ctx, stream, Event(msg), gate)
        for _ in range(50):
            await asyncio.sleep(0)
        busy = [t for c in [*pool, owner] for t in c.tasks if t not in {rt.mapper for rt in c.runtimes.values()}]
        await asyncio.gather(*busy)
        quiet = not moved and not busy and all(not rt.mapping for rt in owner.runtimes.values())
        if quiet and sum(r.trace_count for r in deltas(kafka, owner.topics)) >= traces:
            return
    raise AssertionError("the pipeline did not go quiet")


def playbook_of(records: list[DeltaRecord]) -> list[tuple[str, int, Any]]:
    return [(r.window_id, r.version, r.delta.ops) for r in records]


async def test_two_workers_share_the_reflections_and_learn_the_one_worker_playbook() -> None:
    alone = MemoryKafka()
    solo = learner(alone, ScriptedLLM(echo_script), partitions=4)
    await learn(60, pool=[solo], owner=solo, kafka=alone)

    shared = MemoryKafka()
    llm_a, llm_b = ScriptedLLM(echo_script), ScriptedLLM(echo_script)
    a, b = learner(shared, llm_a, partitions=4), learner(shared, llm_b, partitions=4)
    await learn(60, pool=[a, b], owner=a, kafka=shared)

    reflected = [len(llm.calls(Role.REFLECTOR)) for llm in (llm_a, llm_b)]
    assert sum(reflected) == 60 and min(reflected) >= 0.35 * 60, reflected
    assert playbook_of(deltas(shared, a.topics)) == playbook_of(deltas(alone, solo.topics))
    assert a.snapshots.get("alpha") is not None
    assert a.snapshots.get("alpha").playbook == solo.snapshots.get("alpha").playbook  # type: ignore[union-attr]
    assert a.acks.pending() == 0 and b.acks.pending() == 0


async def test_reflection_tasks_redone_by_another_worker_change_nothing() -> None:
    """B dies after reflecting but before its answers are acked: Kafka gives its tasks to A, which reflects
    them again; both answers reach the owner and the first one counts."""
    alone = MemoryKafka()
    solo = learner(alone, ScriptedLLM(echo_script), partitions=2)
    await learn(24, pool=[solo], owner=solo, kafka=alone)

    kafka = MemoryKafka()
    a, b = learner(kafka, ScriptedLLM(echo_script), partitions=2), learner(kafka, ScriptedLLM(echo_script), 2)
    await learn(24, pool=[a, b], owner=a, kafka=kafka)
    stream, gate = Stream(), asyncio.Semaphore(8)
    for msg in kafka.records(a.topics.reflect):  # everything redelivered to A, answers and all
        await deliver(a, stream, Event(msg), gate)
    await asyncio.gather(*list(a.tasks))
    for msg in kafka.records(a.topics.reflections):
        await deliver(a, stream, Event(msg), gate)
    assert playbook_of(deltas(kafka, a.topics)) == playbook_of(deltas(alone, solo.topics))
