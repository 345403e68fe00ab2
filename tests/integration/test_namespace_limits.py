"""The live-namespace cap, idle eviction and per-namespace backpressure end to end on the real Kafka and Redis
(combee/namespaces.py decides; workers/tenancy.py and workers/holdback.py apply it in the window stage)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.topics import partition_for
from tests.integration.pipeline import Pipeline, Worker
from tests.integration.streams_support import kafka_bootstrap_or_skip, redis_url_or_skip
from tests.support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(2400)]

#: Generous bounds for a loaded machine: they are how long a test waits, never what it measures.
START_S, LEARN_S = 300.0, 900.0


@pytest.fixture
def pipe(tmp_path: Path) -> Iterator[Pipeline]:
    p = Pipeline(kafka_bootstrap_or_skip(), redis_url_or_skip(), tmp_path)
    p.start_sim(start_timeout_s=START_S)
    try:
        p.create_topics(START_S)  # as a deployment does: a publish before the worker's own creation would fail
        yield p
    finally:
        p.close()


def offsets_of(pipe: Pipeline, namespace: str) -> list[tuple[int, int]]:
    """(partition, offset) of every record of ``namespace`` on the traces topic."""
    return sorted(
        (m.partition, m.offset)
        for m in pipe.read_topic(pipe.topics.traces)
        if json.loads(m.value).get("namespace") == namespace
    )


def learned_offsets(pipe: Pipeline, namespace: str) -> list[tuple[int, int]]:
    return [(int((r.source or "p-1")[1:]), o) for r in pipe.deltas(namespace) for o in r.offsets]


def wait_evicted(pipe: Pipeline, worker: Worker, namespace: str, times: int = 1) -> None:
    line = f"namespace {namespace} idle for"
    wait_until(lambda: worker.log.read_text(errors="replace").count(line) >= times, START_S, f"{namespace} evicted")


def test_an_evicted_namespace_comes_back_and_learns_on_from_its_last_version(pipe: Pipeline) -> None:
    ns, other = "ns-evicted", "ns-between"
    first, _ = pipe.traces(24, 3, ns)
    between, _ = pipe.traces(6, 4, other)
    # One live namespace at a time: "ns-between" is only learned if "ns-evicted" was let go, and vice versa.
    worker = pipe.start_worker(COMBEE_MAX_NAMESPACES="1", COMBEE_NAMESPACE_IDLE_S="2")
    pipe.publish_traces(first[:12])
    pipe.wait_learned({ns: 12}, LEARN_S)
    before = pipe.deltas(ns)
    wait_evicted(pipe, worker, ns)
    pipe.publish_traces(between)
    pipe.wait_learned({other: 6}, LEARN_S)
    wait_evicted(pipe, worker, other)
    pipe.publish_traces(first[12:])
    pipe.wait_learned({ns: 24}, LEARN_S)

    assert not pipe.dead_letters()
    records = pipe.deltas(ns)
    after = records[len(before) :]
    assert after[0].delta.base_version == before[-1].version  # learned on from its last version, not from 0
    assert [r.version for r in records] == list(range(1, len(records) + 1))
    learned = learned_offsets(pipe, ns)
    assert sorted(learned) == offsets_of(pipe, ns)  # every trace learned, none twice, none lost
    assert len(learned) == len(set(learned)) == 24


def test_a_new_namespace_over_the_cap_is_dead_lettered_with_the_reason(pipe: Pipeline) -> None:
    ns, late = "ns-first", "ns-late"
    traces, _ = pipe.traces(10, 5, ns)
    refused, _ = pipe.traces(5, 6, late)
    pipe.start_worker(COMBEE_MAX_NAMESPACES="1")  # and the default idle time: ns-first stays live
    pipe.publish_traces(traces)
    pipe.wait_learned({ns: 10}, LEARN_S)
    pipe.publish_traces(refused)
    wait_until(lambda: len(pipe.dead_letters()) >= 5, LEARN_S, "the late namespace's traces dead-lettered")

    letters = pipe.dead_letters()
    assert len(letters) == 5
    reason = "namespace limit: 'ns-late' is new and this worker already holds its cap of 1 live namespaces"
    assert {d.reason for d in letters} == {reason} and {d.stage for d in letters} == {"window"}
    assert sorted((d.partition, d.offset) for d in letters) == offsets_of(pipe, late)  # where to publish them again
    assert not pipe.deltas(late)


def same_partition(prefix: str, partitions: int) -> tuple[str, str]:
    """Two namespaces whose traces share a partition."""
    first = f"{prefix}-full"
    home = partition_for(first.encode(), partitions)
    other = next(f"{prefix}-{i}" for i in range(1000) if partition_for(f"{prefix}-{i}".encode(), partitions) == home)
    return first, other


def test_a_full_buffer_does_not_stop_another_namespace_on_its_partition(pipe: Pipeline) -> None:
    full, other = same_partition("ns", pipe.partitions)
    crowd, _ = pipe.traces(12, 7, full)
    quiet, _ = pipe.traces(4, 8, other)
    # Windows of 50 close only after max_wait (6 s); "full" may buffer 4, so 3 windows of 4, one after the other.
    pipe.start_worker(
        COMBEE_NAMESPACE_BUFFER="4", COMBEE_BS_MIN="50", COMBEE_BS_MAX="50", COMBEE_BS_DEFAULT="50",
        COMBEE_BS_CANDIDATES="[50]", COMBEE_MAX_WAIT_S="6",
    )  # fmt: skip
    pipe.publish_traces(crowd + quiet)  # "quiet" behind every trace of "full" on the partition
    pipe.wait_learned({full: 12, other: 4}, LEARN_S)

    full_records, other_records = pipe.deltas(full), pipe.deltas(other)
    assert [r.trace_count for r in full_records] == [4, 4, 4]
    # "quiet" was read and windowed while "full" waited: its window closed before the second of "full" (the old
    # stage stopped the partition at the fifth trace of "full" until its windows had drained it)
    assert [r.trace_count for r in other_records] == [4]
    assert other_records[0].closed_at is not None and full_records[1].closed_at is not None
    assert other_records[0].closed_at < full_records[1].closed_at
    full_offsets = [o for r in full_records for o in r.offsets]
    assert full_offsets == sorted(full_offsets) and len(set(full_offsets)) == 12  # in order, each once
    assert sorted(learned_offsets(pipe, full)) == offsets_of(pipe, full)
    assert sorted(learned_offsets(pipe, other)) == offsets_of(pipe, other)
    assert not pipe.dead_letters()
