"""Fencing zombie combiners (docs/reliability.md), with the in-memory Kafka of test_stages.

Two stage contexts over the same topics play the old and the new owner of a partition. The old one has a
merge in flight (its model call held back) when the new one claims the partition and applies the window;
then the old one's merge finishes. Its record lands in the log after the new owner's claim: fenced — counted,
and nothing of it reaches the snapshot table, the publisher or the acks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from combee.engine import MethodConfig
from combee.llm import ChatRequest, ChatResponse, Role
from streams.deltalog import LogSplit, split_log
from tests.fakes import ScriptedLLM, echo_script
from tests.workers.test_stages import Event, MemoryKafka, Stream, feed_traces, learner, settle
from tests.workers.test_stages import deliver as deliver_one
from workers.app import _forget
from workers.combine import ensure_ready
from workers.combiner.claim import bind
from workers.context import StageContext
from workers.window import close_due_windows

PAPER = MethodConfig(shuffle_key="none")  # the paper's reduce: these scenarios need a merge call to hold


@dataclass
class HeldMerges:
    """The scripted model, except that merge calls wait until released (a merge in flight, for as long as
    the test likes)."""

    inner: ScriptedLLM = field(default_factory=lambda: ScriptedLLM(echo_script))
    release: asyncio.Event = field(default_factory=asyncio.Event)
    held: int = 0

    async def complete(self, request: ChatRequest) -> ChatResponse:
        if request.role == Role.MERGER:
            self.held += 1
            await self.release.wait()
        return await self.inner.complete(request)


@dataclass
class TP:
    topic: str
    partition: int


async def _turns(n: int = 100) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def deliver(ctx: StageContext, kafka: MemoryKafka, stream: Stream, seen: set[Any], topics: list[str]) -> int:
    """Hand every record of ``topics`` not yet in ``seen`` to its stage; let spawned work run (no waiting for
    it to finish: a held merge never would). Returns how many records were delivered."""
    gate = asyncio.Semaphore(8)
    n = 0
    for topic in topics:
        for msg in kafka.records(topic):
            key = (msg.topic, msg.partition, msg.offset)
            if key in seen:
                continue
            seen.add(key)
            n += 1
            await deliver_one(ctx, stream, Event(msg), gate)
        await _turns()
    return n


async def old_owner_with_a_merge_in_flight(kafka: MemoryKafka) -> tuple[StageContext, HeldMerges, Stream]:
    """Worker A has windowed, mapped and curated alpha's traces and waits on a merge."""
    llm = HeldMerges()
    a, stream, seen = learner(kafka, llm, method=PAPER), Stream(), set[Any]()
    await feed_traces(a, kafka, stream, "alpha", 4)
    await close_due_windows(a)
    topics = [a.topics.windows, a.topics.reflect, a.topics.reflections, a.topics.groups, a.topics.partials]
    for _ in range(20):
        await deliver(a, kafka, stream, seen, topics)
        if llm.held:
            break
    assert llm.held, "A never started a merge"
    return a, llm, stream


def log_of(kafka: MemoryKafka, learner_: StageContext) -> LogSplit:
    return split_log((m.partition, m.offset, m.value) for m in kafka.records(learner_.topics.deltas))


async def test_a_zombie_combiners_late_record_is_fenced_and_goes_nowhere_else() -> None:
    kafka = MemoryKafka()
    a, llm, a_stream = await old_owner_with_a_merge_in_flight(kafka)
    part = a.home_partition("alpha")

    # B takes the partition over (A was paused past its session timeout): it claims, redoes and applies
    b, b_stream = learner(kafka, ScriptedLLM(echo_script), method=PAPER), Stream()
    await deliver(b, kafka, b_stream, set(), [b.topics.partials])
    await asyncio.gather(*list(b.tasks))
    split = log_of(kafka, b)
    assert [r.window_id for r in split.records("alpha")] == [f"alpha/p{part}/0-3"]
    assert b.tenures.get(part).epoch > a.tenures.get(part).epoch

    playbooks_before = len(kafka.records(a.topics.playbooks))
    offers_before = list(a.publisher.offers)
    acked_before = list(a_stream.acked)

    llm.release.set()  # A wakes up and finishes its merge, not knowing
    await _turns()
    await asyncio.gather(*list(a.tasks))

    assert a.tenures.fenced_writes == 1
    split = log_of(kafka, a)
    assert [r.window_id for r in split.fenced_records("alpha")] == [f"alpha/p{part}/0-3"]
    assert [r.epoch for r in split.fenced_records()] == [a.tenures.get(part).epoch]
    assert [r.window_id for r in split.records("alpha")] == [f"alpha/p{part}/0-3"]  # each window once
    assert len(kafka.records(a.topics.playbooks)) == playbooks_before  # no snapshot, no checkpoint
    assert a.publisher.offers == offers_before  # Redis never hears of the fenced version
    assert [x for x in a_stream.acked if x not in acked_before] == []  # nor are its records acked
    assert a.tenures.get(part).fenced and a.runtime("alpha").open_windows == 0

    # and A does not claim the partition back while it is still (as far as it knows) assigned to it
    await deliver(a, kafka, a_stream, set(), [a.topics.partials])
    assert len(log_of(kafka, a).claims) == 2


async def test_work_finished_after_a_revocation_but_before_any_new_claim_counts_once() -> None:
    """A revoked combiner's merge finishes before the next owner claims: its record is valid (nobody
    superseded it yet), goes to the log and the changelog, and the next owner replays it rather than
    applying the window again."""
    kafka = MemoryKafka()
    a, llm, _ = await old_owner_with_a_merge_in_flight(kafka)
    part = a.home_partition("alpha")
    _forget(a, [TP(a.topics.partials, p) for p in range(a.topics.partitions)])  # a rebalance revokes it
    llm.release.set()
    await _turns()
    await asyncio.gather(*list(a.tasks))
    assert a.tenures.fenced_writes == 0
    assert a.snapshots.get("alpha") is None  # its late snapshot went to the changelog, not to the wiped cache

    b = learner(kafka, ScriptedLLM(echo_script), method=PAPER)
    await deliver(b, kafka, Stream(), set(), [b.topics.partials])
    await asyncio.gather(*list(b.tasks))
    split = log_of(kafka, b)
    assert [(r.window_id, r.version) for r in split.records("alpha")] == [(f"alpha/p{part}/0-3", 1)]
    assert split.fenced == []
    assert b.snapshots.get("alpha").playbook.version == 1  # type: ignore[union-attr]


async def test_the_same_worker_reassigned_fences_its_own_earlier_tenure() -> None:
    """Revoked and assigned the same partition again, a worker claims anew; a merge of its earlier tenure that
    finishes afterwards is fenced like anyone else's."""
    kafka = MemoryKafka()
    a, llm, _ = await old_owner_with_a_merge_in_flight(kafka)
    part = a.home_partition("alpha")
    first = a.tenures.get(part)
    _forget(a, [TP(a.topics.partials, p) for p in range(a.topics.partitions)])
    await ensure_ready(a, part)  # reassigned: the first partials event claims again
    assert a.tenures.get(part) is not first
    llm.release.set()
    await _turns()
    await asyncio.gather(*list(a.tasks))
    assert a.tenures.fenced_writes == 1 and first.fenced
    assert log_of(kafka, a).records("alpha") == []


@dataclass
class SlowSnapshots(MemoryKafka):
    """Holds back one writer's snapshot writes (``hold``), as a slow or paused process would."""

    held: asyncio.Event = field(default_factory=asyncio.Event)
    hold: bool = False

    def writer(self, hold: bool) -> Any:
        outer = self

        class View:
            async def send(self, topic: str, key: bytes, value: bytes, partition: int) -> int:
                if hold and topic.endswith(".playbooks") and not key.startswith(b"__"):
                    await outer.held.wait()
                return await outer.send(topic, key, value, partition)

            def read(self, *args: Any) -> Any:
                return outer.read(*args)

        return View()


async def test_a_late_valid_snapshot_written_after_the_successors_checkpoint_skips_nothing() -> None:
    """A logs a window, is revoked, and B claims; A's snapshot write (valid: nobody had claimed when A logged)
    lands only after B has applied the next window and checkpointed past it. A third owner must not trust the
    checkpoint alone: it replays from the late snapshot's own position and recovers B's window too."""
    kafka = SlowSnapshots()
    a = learner(kafka, ScriptedLLM(echo_script), method=PAPER)
    a.io = kafka.writer(hold=True)  # type: ignore[assignment]
    a.snapshots.io = a.io
    stream, seen = Stream(), set[Any]()
    await feed_traces(a, kafka, stream, "alpha", 4)
    await close_due_windows(a)
    topics = [a.topics.windows, a.topics.reflect, a.topics.reflections, a.topics.groups, a.topics.partials]
    task: asyncio.Future[int] | None = None
    for _ in range(10):  # one delivery at a time: the last one is held by A's snapshot write
        if task is None or task.done():
            task = asyncio.ensure_future(deliver(a, kafka, stream, seen, topics))
        await _turns(300)
        if any(r.offset > 0 for r in kafka.records(a.topics.deltas)):
            break
    part = a.home_partition("alpha")
    assert [r.window_id for r in log_of(kafka, a).records("alpha")] == [f"alpha/p{part}/0-3"]

    _forget(a, [TP(a.topics.partials, p) for p in range(a.topics.partitions)])  # revoked, its write still held
    b = learner(kafka, ScriptedLLM(echo_script), method=PAPER)
    await feed_traces(b, kafka, Stream(), "alpha", 8)  # traces 4..7 come after: B's own window
    await ensure_ready(b, part)
    bstream, bseen = Stream(), {(m.topic, m.partition, m.offset) for m in kafka.records(b.topics.partials)}
    for _ in range(10):
        await close_due_windows(b)
        await deliver(b, kafka, bstream, bseen, topics)
        await settle(b)
    assert [r.version for r in log_of(kafka, b).records("alpha")] == [1, 2]

    kafka.held.set()  # A's late write of the v1 snapshot lands now, after B's v2 and its checkpoint
    assert task is not None
    await task
    await asyncio.gather(*list(a.tasks))
    c = learner(kafka, ScriptedLLM(echo_script), method=PAPER)
    await ensure_ready(c, part)
    assert c.snapshots.get("alpha").playbook.version == 2  # type: ignore[union-attr]


class RevokedDuringClaim(MemoryKafka):
    """A rebalance revokes the partials partition while the worker's claim is on its way to the log."""

    ctx: StageContext | None = None
    revoked: int = 0

    async def send(self, topic: str, key: bytes, value: bytes, partition: int) -> int:
        offset = await super().send(topic, key, value, partition)
        if self.ctx is not None and key == b"__claim__" and not self.revoked:
            self.revoked += 1
            _forget(self.ctx, [TP(self.ctx.topics.partials, partition)])
        return offset


async def test_a_claim_revoked_while_it_is_readied_is_not_bound_and_the_redelivered_records_are_applied() -> None:
    """Seen in the zombie fault test: a revocation landed while a claim was being readied; the record that
    asked for it was bound to the revoked tenure, a second claim followed, and rebinding dropped the runtime a
    mapper was waiting on — the namespace stalled. A revoked tenure is never made ready nor bound: the record
    is left for the partition's owner, and once reassigned the redelivered records are applied."""
    kafka = RevokedDuringClaim()
    llm = ScriptedLLM(echo_script)
    a, stream = learner(kafka, llm, method=PAPER), Stream()
    kafka.ctx = a
    await feed_traces(a, kafka, stream, "alpha", 4)
    await close_due_windows(a)
    part = a.home_partition("alpha")
    seen: set[Any] = set()
    for _ in range(10):  # map and curate; the first partials event claims, and is revoked on the way
        await deliver(
            a, kafka, stream, seen, [a.topics.windows, a.topics.reflect, a.topics.reflections, a.topics.groups]
        )
        await settle(a)
    await deliver(a, kafka, stream, seen, [a.topics.partials])
    await asyncio.gather(*list(a.tasks))
    assert kafka.revoked == 1
    _, first_claim, _ = log_of(kafka, a).claims[0]
    assert all(t.epoch != first_claim for t in a.tenures.held())  # the revoked claim was never made ready
    assert log_of(kafka, a).records("alpha") == []  # the event that asked for it was left for its owner

    # reassigned: the stream resumes at the committed offset and hands the partials over again
    await deliver(a, kafka, stream, set(), [a.topics.partials])
    await asyncio.gather(*list(a.tasks))
    split = log_of(kafka, a)
    assert [(r.window_id, r.version) for r in split.records("alpha")] == [(f"alpha/p{part}/0-3", 1)]
    assert split.fenced == []
    assert a.snapshots.get("alpha").playbook.version == 1  # type: ignore[union-attr]
    assert a.runtime("alpha").tenure is a.tenures.ready(part)  # bound to the tenure that applied them


async def test_rebinding_a_namespace_keeps_the_runtime_a_mapper_waits_on() -> None:
    """Should a namespace's combiner state ever pass to a new tenure of this process, only that state is
    reset: the runtime object (and its ``applied`` condition, which the map stage waits on) stays."""
    kafka = MemoryKafka()
    a = learner(kafka, ScriptedLLM(echo_script), method=PAPER)
    part = a.home_partition("alpha")
    first = await ensure_ready(a, part)
    rt = bind(a, first, "alpha")
    woke = asyncio.Event()

    async def waiter() -> None:
        async with rt.applied:
            await rt.applied.wait()
        woke.set()

    task = asyncio.create_task(waiter())
    await _turns()
    a.tenures.revoke(part)  # the combiner's part only (the runtimes stay): a second tenure of the same partition
    second = await ensure_ready(a, part)
    again = bind(a, second, "alpha")
    assert again is rt and rt.tenure is second
    assert rt.combining is second.combining("alpha") and rt.combining is not first.combining("alpha")
    async with again.applied:
        again.applied.notify_all()
    await asyncio.wait_for(woke.wait(), 1.0)
    await task
