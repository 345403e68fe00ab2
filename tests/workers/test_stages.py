"""Worker tier: the stages' wiring, driven with in-memory topics instead of Kafka (fast, deterministic).

Records flow stage to stage exactly as on Kafka (same envelopes, same codec, same keys and partitions);
only the transport is a dict of lists. Crash recovery is simulated by building a fresh worker context over
the same topics.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from combee.engine import MethodConfig, Window, run_window
from combee.llm import ChatRequest, Role
from combee.models import Playbook
from combee.windowing import WindowPolicy
from streams.codec import decode, decode_trace, encode
from streams.deltalog import split_log
from streams.envelopes import DeltaRecord, Reflected, ReflectTask
from streams.topics import Topics
from tests.fakes import ScriptedLLM, block_lines, echo_script
from workers import pool
from workers.app import _map_state_decode, _map_state_encode, _snapshot_decode, _snapshot_encode
from workers.combine import handle_partial
from workers.context import StageConfig, StageContext
from workers.curate import handle_group
from workers.delivery.backfill import with_backfill
from workers.delivery.kafka_io import LogRecord
from workers.delivery.tables import ChangelogTable
from workers.fanout import handle_reflected
from workers.mapper import handle_window
from workers.reflect import handle_reflect_task
from workers.window import close_due_windows, handle_trace


@dataclass
class Msg:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass
class Event:
    message: Msg


@dataclass
class Stream:
    acked: list[tuple[str, int, int]] = field(default_factory=list)

    async def ack(self, event: Event) -> bool:
        m = event.message
        self.acked.append((m.topic, m.partition, m.offset))
        return True


@dataclass
class MemoryKafka:
    logs: dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]] = field(default_factory=dict)

    async def send(self, topic: str, key: bytes, value: bytes, partition: int) -> int:
        log = self.logs.setdefault((topic, partition), [])
        log.append((key, value))
        return len(log) - 1

    async def read(self, topic: str, partition: int, start: int = 0) -> AsyncIterator[LogRecord]:
        for offset, (key, value) in enumerate(list(self.logs.get((topic, partition), []))[start:], start=start):
            yield LogRecord(offset, key, value, 0)

    def records(self, topic: str) -> list[Msg]:
        return [
            Msg(t, p, o, k, v)
            for (t, p), log in sorted(self.logs.items())
            if t == topic
            for o, (k, v) in enumerate(log)
        ]


class Publisher:
    pending = 0

    def __init__(self) -> None:
        self.offers: list[tuple[str, int]] = []

    def offer(self, namespace: str, version: int, *args: Any, **kw: Any) -> bool:
        self.offers.append((namespace, version))
        return True

    def pending_version(self, namespace: str) -> int | None:
        return None  # every offer is taken at once


def learner(kafka: MemoryKafka, llm: Any, partitions: int = 2, method: MethodConfig | None = None) -> StageContext:
    topics = Topics(prefix="t", partitions=partitions)
    cfg = StageConfig(
        topics=topics,
        method=method or MethodConfig(),
        policy=WindowPolicy(max_inflight=1, max_wait_s=0.01, bs_min=1, bs_max=64),
        bs_candidates=(4,),
        bs_default=8,
    )
    return StageContext(
        config=cfg,
        io=kafka,  # type: ignore[arg-type]
        llm=llm,
        publisher=Publisher(),
        store=None,
        map_table=ChangelogTable(kafka, topics.mapstate, partitions, _map_state_decode, _map_state_encode),  # type: ignore[arg-type]
        snapshots=ChangelogTable(kafka, topics.playbooks, partitions, _snapshot_decode, _snapshot_encode),  # type: ignore[arg-type]
    )


def trace(ns: str, i: int) -> bytes:
    return json.dumps({"namespace": ns, "trace_id": f"{ns}-{i}", "task": f"task {i} of {ns}"}).encode()


async def pump(ctx: StageContext, kafka: MemoryKafka, stream: Stream, seen: set[tuple[str, int, int]]) -> int:
    """Deliver every not-yet-delivered record of the learner and pool topics to its stage; returns how many.

    A map task waits for its window's reflection answers, which the next pump delivers: it is let run, not
    waited for."""
    n = 0
    gate = asyncio.Semaphore(4)
    for topic in (
        ctx.topics.windows,
        ctx.topics.reflect,
        ctx.topics.reflections,
        ctx.topics.groups,
        ctx.topics.partials,
    ):
        for msg in kafka.records(topic):
            key = (msg.topic, msg.partition, msg.offset)
            if key in seen:
                continue
            seen.add(key)
            n += 1
            await deliver(ctx, stream, Event(msg), gate)
    await settle(ctx)
    return n


async def settle(ctx: StageContext) -> None:
    """Let spawned work run and wait for it, except map tasks (they wait for answers a pump delivers)."""
    for _ in range(50):
        await asyncio.sleep(0)
    mappers = {rt.mapper for rt in ctx.runtimes.values()}
    await asyncio.gather(*[t for t in list(ctx.tasks) if t not in mappers])
    for _ in range(50):
        await asyncio.sleep(0)


async def reflect_through_the_pool(ctx: StageContext, kafka: MemoryKafka, stream: Stream) -> None:
    """Deliver the reflection tasks on the topic and their answers (the pool's round trip), then settle."""
    gate = asyncio.Semaphore(8)
    for topic in (ctx.topics.reflect, ctx.topics.reflections):
        for _ in range(50):
            await asyncio.sleep(0)
        for msg in kafka.records(topic):
            await deliver(ctx, stream, Event(msg), gate)
        await settle(ctx)


async def deliver(ctx: StageContext, stream: Stream, event: Event, gate: asyncio.Semaphore) -> None:
    """Hand one record to the stage that consumes its topic."""
    topic = event.message.topic
    if topic == ctx.topics.windows:
        await handle_window(ctx, stream, event)
    elif topic == ctx.topics.reflect:
        await handle_reflect_task(ctx, stream, event, gate)
    elif topic == ctx.topics.reflections:
        await handle_reflected(ctx, stream, event)
    elif topic == ctx.topics.groups:
        await handle_group(ctx, stream, event, gate)
    else:
        await handle_partial(ctx, stream, event)


async def run_until_quiet(ctx: StageContext, kafka: MemoryKafka, stream: Stream, seen: set) -> None:
    for _ in range(200):
        await asyncio.sleep(0.02)
        closed = await close_due_windows(ctx)
        if not closed and not await pump(ctx, kafka, stream, seen) and not ctx.tasks:
            return


async def feed_traces(ctx: StageContext, kafka: MemoryKafka, stream: Stream, ns: str, n: int) -> None:
    part = ctx.home_partition(ns)
    for i in range(n):
        offset = await kafka.send(ctx.topics.traces, ns.encode(), trace(ns, i), part)
        await handle_trace(ctx, stream, Event(Msg(ctx.topics.traces, part, offset, ns.encode(), trace(ns, i))))


def deltas(kafka: MemoryKafka, topics: Topics) -> list[DeltaRecord]:
    """The valid records of the delta log (streams/deltalog.py), in log order per partition."""
    return split_log((m.partition, m.offset, m.value) for m in kafka.records(topics.deltas)).records()


async def test_traces_flow_through_every_stage_and_every_record_is_acked_in_order() -> None:
    kafka, stream, seen = MemoryKafka(), Stream(), set()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    await feed_traces(ctx, kafka, stream, "alpha", 30)
    await feed_traces(ctx, kafka, stream, "beta", 12)
    await run_until_quiet(ctx, kafka, stream, seen)

    records = deltas(kafka, ctx.topics)
    for ns, n in (("alpha", 30), ("beta", 12)):
        mine = [r for r in records if r.namespace == ns]
        assert sum(r.trace_count for r in mine) == n
        assert [r.version for r in mine] == list(range(1, len(mine) + 1))
        assert ctx.snapshots.get(ns).playbook.version == len(mine)  # type: ignore[union-attr]
        assert len(ctx.snapshots.get(ns).playbook.bullets) == n  # type: ignore[union-attr]  # echo keeps all
    # every record of every stage was acked, each once, in offset order per partition
    assert len(stream.acked) == len(set(stream.acked))
    by_tp: dict[tuple[str, int], list[int]] = {}
    for topic, part, offset in stream.acked:
        by_tp.setdefault((topic, part), []).append(offset)
    assert all(offs == sorted(offs) for offs in by_tp.values())
    assert ctx.acks.pending() == 0
    assert sorted(ctx.publisher.offers) == sorted((r.namespace, r.version) for r in records)


async def test_redelivered_records_change_nothing() -> None:
    kafka, stream, seen = MemoryKafka(), Stream(), set()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    await feed_traces(ctx, kafka, stream, "alpha", 20)
    await run_until_quiet(ctx, kafka, stream, seen)
    before = deltas(kafka, ctx.topics)
    # Kafka redelivers everything (e.g. offsets not committed before a crash): windows, groups, partials
    await run_until_quiet(ctx, kafka, stream, set())
    assert deltas(kafka, ctx.topics) == before


async def test_restart_replays_the_log_tail_onto_the_snapshot() -> None:
    kafka, stream, seen = MemoryKafka(), Stream(), set()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    await feed_traces(ctx, kafka, stream, "alpha", 20)
    await run_until_quiet(ctx, kafka, stream, seen)
    final = ctx.snapshots.get("alpha")
    assert final is not None
    # crash between logging the last delta and writing its snapshot: drop the last snapshot + checkpoint
    part = ctx.home_partition("alpha")
    log = kafka.logs[(ctx.topics.playbooks, part)]
    del log[-2:]
    restarted = learner(kafka, ScriptedLLM(echo_script))
    from workers.combine import ensure_ready

    await ensure_ready(restarted, part)
    recovered = restarted.snapshots.get("alpha")
    assert recovered is not None and recovered.playbook == final.playbook
    assert recovered.applied == final.applied and recovered.next_seq == final.next_seq
    # and the redelivered records of the last window are recognised as applied
    await run_until_quiet(restarted, kafka, Stream(), set())
    assert [r.version for r in deltas(kafka, ctx.topics)] == list(range(1, final.playbook.version + 1))


async def test_undecodable_records_are_dead_lettered() -> None:
    kafka, stream = MemoryKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    for i, raw in enumerate([b"{", b'{"namespace": "alpha"}', b'{"namespace": "a b", "task": "t"}']):
        await handle_trace(ctx, stream, Event(Msg(ctx.topics.traces, 0, i, b"alpha", raw)))
    letters = [decode(m.value or b"") for m in kafka.records(ctx.topics.deadletter)]
    assert [type(x).__name__ for x in letters] == ["DeadLetter"] * 3
    assert len(stream.acked) == 3


async def test_records_of_the_wrong_kind_on_the_stage_topics_are_dead_lettered_and_acked() -> None:
    kafka, stream = MemoryKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    answer = encode(Reflected(window_id="alpha/p0/0-0", namespace="alpha", index=0, base_version=0, reflections=()))
    task = encode(
        ReflectTask(
            window_id="alpha/p0/0-0", namespace="alpha", seq=0, index=0, playbook=Playbook(namespace="alpha"),
            traces=(decode_trace(trace("alpha", 0)),),
        )
    )  # fmt: skip
    topics = (ctx.topics.windows, ctx.topics.reflect, ctx.topics.reflections, ctx.topics.groups, ctx.topics.partials)
    for offset, topic in enumerate(topics):
        wrong = task if topic == ctx.topics.reflections else answer  # a valid envelope, of another topic's kind
        await deliver(ctx, stream, Event(Msg(topic, 0, offset, b"alpha", wrong)), asyncio.Semaphore(1))
        await deliver(ctx, stream, Event(Msg(topic, 1, offset, b"alpha", b"{")), asyncio.Semaphore(1))
    letters = [decode(m.value or b"") for m in kafka.records(ctx.topics.deadletter)]
    assert len(letters) == 2 * len(topics)
    assert sum("expected " in letter.reason for letter in letters) == len(topics)  # type: ignore[union-attr]
    assert sorted(stream.acked) == sorted((t, p, o) for o, t in enumerate(topics) for p in (0, 1))
    assert ctx.acks.pending() == 0


def broken_script(request: ChatRequest) -> str:
    raise RuntimeError("a bug in the stage, not an LLM outage")


async def test_a_pool_task_that_keeps_failing_is_dead_lettered_and_answered_as_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def no_pause(_: float) -> None:
        return None

    monkeypatch.setattr(pool.asyncio, "sleep", no_pause)
    kafka, stream = MemoryKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(broken_script))
    traces = tuple(decode_trace(trace("alpha", i)) for i in range(3))
    task = ReflectTask(
        window_id="alpha/p0/0-2", namespace="alpha", seq=0, index=0, playbook=Playbook(namespace="alpha"), traces=traces
    )
    msg = Msg(ctx.topics.reflect, 0, 0, b"alpha/p0/0-2/0", encode(task))
    await handle_reflect_task(ctx, stream, Event(msg), asyncio.Semaphore(1))
    await settle(ctx)

    assert len(ctx.llm.requests) == pool.MAX_UNEXPECTED_FAILURES * len(traces)  # type: ignore[attr-defined]
    letters = [decode(m.value or b"") for m in kafka.records(ctx.topics.deadletter)]
    assert len(letters) == 1 and letters[0].reason.startswith("traces could not be reflected: RuntimeError")  # type: ignore[union-attr]
    answers = [decode(m.value or b"") for m in kafka.records(ctx.topics.reflections)]
    assert len(answers) == 1 and answers[0].reflections == (None, None, None)  # type: ignore[union-attr]
    assert stream.acked == [(ctx.topics.reflect, 0, 0)] and ctx.in_flight_tasks == 0


async def test_a_record_the_stream_skipped_is_read_directly_and_learned() -> None:
    """faust-streaming can hand an agent offsets 0, 1, 3 and commit past 2: the stage backfills 2."""
    kafka, stream = MemoryKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    part = ctx.home_partition("alpha")
    msgs = []
    for i in range(4):
        offset = await kafka.send(ctx.topics.traces, b"alpha", trace("alpha", i), part)
        msgs.append(Msg(ctx.topics.traces, part, offset, b"alpha", trace("alpha", i)))
    delivered = [msgs[0], msgs[1], msgs[3]]  # offset 2 never reaches the agent
    for msg in delivered:
        for e in await with_backfill(ctx.acks, ctx.io, Event(msg)):
            await handle_trace(ctx, stream, e)
    rt = ctx.runtime("alpha")
    assert [b.offset for b in rt.buffers[part]] == [0, 1, 2, 3]
    assert ctx.acks.backfilled == 1
    await close_due_windows(ctx)
    # the real events are acked to Faust in order; the backfilled one has nothing to ack
    assert stream.acked == [(ctx.topics.traces, part, o) for o in (0, 1, 3)]
    assert ctx.acks.pending() == 0


async def redeliver_traces(ctx: StageContext, kafka: MemoryKafka, stream: Stream, ns: str) -> None:
    """Hand every trace record of ``ns``'s partition to the window stage again (offsets never committed)."""
    part = ctx.home_partition(ns)
    for offset, (key, value) in enumerate(kafka.logs[(ctx.topics.traces, part)]):
        await handle_trace(ctx, stream, Event(Msg(ctx.topics.traces, part, offset, key, value)))


async def test_a_restarted_worker_that_rereads_windowed_traces_does_not_stall_the_namespace() -> None:
    """Issue 9: the learner applied windows, died before committing its traces' offsets, and its successor
    re-read those traces. The windows it re-forms are duplicates the map stage drops; each must release the
    in-flight slot its closing took, or with max_inflight = 1 no later window of the namespace ever closes."""
    kafka, seen = MemoryKafka(), set()
    first = learner(kafka, ScriptedLLM(echo_script))
    await feed_traces(first, kafka, Stream(), "alpha", 8)
    await run_until_quiet(first, kafka, Stream(), seen)
    assert sum(r.trace_count for r in deltas(kafka, first.topics)) == 8

    restarted = learner(kafka, ScriptedLLM(echo_script))
    stream = Stream()
    await redeliver_traces(restarted, kafka, stream, "alpha")  # offsets 0..7 again: already windowed
    part = restarted.home_partition("alpha")
    for i in range(8, 20):  # and new traces behind them
        offset = await kafka.send(restarted.topics.traces, b"alpha", trace("alpha", i), part)
        await handle_trace(
            restarted, stream, Event(Msg(restarted.topics.traces, part, offset, b"alpha", trace("alpha", i)))
        )
    await run_until_quiet(restarted, kafka, stream, seen)

    records = deltas(kafka, restarted.topics)
    assert sum(r.trace_count for r in records) == 20  # the 12 new traces were learned, none twice
    assert [r.version for r in records] == list(range(1, len(records) + 1))
    rt = restarted.runtime("alpha")
    assert rt.closed_pending == 0 and rt.buffered() == 0
    assert rt.closed_at == {}  # no closing time left behind by a dropped or applied window
    assert restarted.acks.pending() == 0


@dataclass
class RefusesFirstMerge(MemoryKafka):
    """Kafka refusing the first merge partial once (a broker restart, say)."""

    refused: int = 0

    async def send(self, topic: str, key: bytes, value: bytes, partition: int) -> int:
        if self.refused == 0 and topic.endswith("partials"):
            env = decode(value)
            if getattr(env, "level", 1) >= 2:
                self.refused += 1
                raise ConnectionError("broker not available")
        return await super().send(topic, key, value, partition)


async def test_a_merge_whose_partial_kafka_refused_is_offered_again_without_new_records() -> None:
    """All level-1 partials are in, the one merge fails on a send: nothing else will arrive for the namespace,
    so the combiner must offer the merge again by itself, or the window (and the namespace) stalls."""
    kafka, stream, seen = RefusesFirstMerge(), Stream(), set()
    ctx = learner(kafka, ScriptedLLM(echo_script), method=MethodConfig(shuffle_key="none"))  # a merge call
    await feed_traces(ctx, kafka, stream, "alpha", 4)
    await run_until_quiet(ctx, kafka, stream, seen)
    assert kafka.refused == 1
    records = deltas(kafka, ctx.topics)
    assert sum(r.trace_count for r in records) == 4
    assert ctx.acks.pending() == 0


@dataclass
class EagerWindows(MemoryKafka):
    """Kafka whose consumer is faster than the producer's ack: a window reaches the map stage (another task of
    the same process) before `send` returns to the window stage that closed it."""

    ctx: StageContext | None = None
    stream: Stream = field(default_factory=Stream)
    delivered: set[tuple[str, int, int]] = field(default_factory=set)

    async def send(self, topic: str, key: bytes, value: bytes, partition: int) -> int:
        offset = await super().send(topic, key, value, partition)
        if self.ctx is not None and topic == self.ctx.topics.windows:
            self.delivered.add((topic, partition, offset))
            await handle_window(self.ctx, self.stream, Event(Msg(topic, partition, offset, key, value)))
        return offset


async def test_a_window_the_map_stage_sees_before_its_send_returns_still_releases_its_slot() -> None:
    kafka = EagerWindows()
    first = learner(kafka, ScriptedLLM(echo_script))
    kafka.ctx = first
    await feed_traces(first, kafka, Stream(), "alpha", 8)
    await run_until_quiet(first, kafka, Stream(), set(kafka.delivered))
    restarted = learner(kafka, ScriptedLLM(echo_script))
    kafka.ctx = restarted
    stream = Stream()
    seen = {(m.topic, m.partition, m.offset) for m in kafka.records(restarted.topics.windows)}
    rt = restarted.runtime("alpha")

    async def settle() -> None:
        for _ in range(100):
            await asyncio.sleep(0.02)  # past max_wait
            closed = await close_due_windows(restarted)
            seen.update(kafka.delivered)
            if not closed and not await pump(restarted, kafka, stream, seen) and not rt.buffered():
                return

    await redeliver_traces(restarted, kafka, stream, "alpha")  # already windowed: dropped while being sent
    await settle()
    assert rt.closed_pending == 0 and rt.buffered() == 0
    assert rt.windows_closed >= 1 and sum(r.trace_count for r in deltas(kafka, restarted.topics)) == 8
    part = restarted.home_partition("alpha")
    for i in range(8, 14):
        offset = await kafka.send(restarted.topics.traces, b"alpha", trace("alpha", i), part)
        await handle_trace(
            restarted, stream, Event(Msg(restarted.topics.traces, part, offset, b"alpha", trace("alpha", i)))
        )
    await settle()
    assert sum(r.trace_count for r in deltas(kafka, restarted.topics)) == 14
    assert rt.closed_pending == 0


def selective_script(request: ChatRequest) -> str:
    """A model whose answers depend on how the reduce is cut: reflections carry one of three sections; a curator
    writes at most three ADDs; a merge keeps the first four proposals. A stage that grouped, merged or united
    differently from the engine would end with another playbook."""
    if request.role == Role.REFLECTOR:
        task = block_lines(request, "trace")[0]["task"]
        number = int(task.split()[1])
        insight = {"section": f"s{number % 3}", "content": f"lesson {number}"}
        return json.dumps({"diagnosis": "ok", "insights": [insight], "bullet_tags": []})
    if request.role == Role.CURATOR:
        ops = [
            {"op": "ADD", "section": i["section"], "content": i["content"], "bullet_id": None}
            for r in block_lines(request, "reflections")
            for i in r["insights"]
        ]
        return json.dumps({"operations": ops[:3]})
    if request.role == Role.MERGER:
        return json.dumps({"keep": [p["id"] for p in block_lines(request, "proposals")][:4], "combine": []})
    return json.dumps({"answer": "42"})


@pytest.mark.parametrize("shape", ["none", "section", "section-union"])
async def test_the_stream_learns_what_the_engine_learns_from_the_same_windows(shape: str) -> None:
    """Determinism across the two executors: every window the stream applied, re-run offline by the engine
    (``combee learn``'s run_window) with the same reduce shape, gives the same playbook, bullet for bullet."""
    method = MethodConfig(shuffle_key=shape, max_group_items=4, max_fan_in=2)
    kafka, stream, seen = MemoryKafka(), Stream(), set()
    llm = ScriptedLLM(selective_script)
    ctx = learner(kafka, llm, method=method)
    await feed_traces(ctx, kafka, stream, "alpha", 40)
    await run_until_quiet(ctx, kafka, stream, seen)
    records = [r for r in deltas(kafka, ctx.topics) if r.namespace == "alpha"]
    assert sum(r.trace_count for r in records) == 40
    assert {r.shape for r in records} == {shape}  # the log says how each window was reduced
    streamed = ctx.snapshots.get("alpha")
    assert streamed is not None
    merges = len(llm.calls(Role.MERGER))
    assert (merges == 0) if shape == "section-union" else (merges > 0)

    raw = {o: v for o, (_, v) in enumerate(kafka.logs[(ctx.topics.traces, ctx.home_partition("alpha"))])}
    offline = Playbook(namespace="alpha")
    engine_llm = ScriptedLLM(selective_script)
    for r in records:
        assert r.source is not None
        window = Window(
            "alpha", r.source, r.offsets[0], r.offsets[-1], tuple(decode_trace(raw[o]) for o in r.offsets), r.seed_key
        )
        offline = (await run_window(window, offline, engine_llm, method)).playbook
    assert streamed.playbook == offline
    assert len(llm.calls(Role.MERGER)) == len(engine_llm.calls(Role.MERGER))
    assert len(llm.calls(Role.CURATOR)) == len(engine_llm.calls(Role.CURATOR))
