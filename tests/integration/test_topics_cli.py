"""``combee topics create|describe`` and ``combee publish`` before any worker, against the real Kafka (issue 15,
item 5): publishing to a cluster without the topics is one line naming the topic and the command that creates
it; after ``topics create`` (idempotent) the traces land."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer
from kafka.admin import KafkaAdminClient

from combee.sim.world import generate_traces
from streams.topics import Topics
from tests.integration.streams_support import kafka_bootstrap_or_skip, unique

pytestmark = [pytest.mark.integration]

PARTITIONS = 2


@pytest.fixture
def topics() -> Iterator[Topics]:
    bootstrap = kafka_bootstrap_or_skip()
    topics = Topics(prefix=unique("test-topics-cli"), partitions=PARTITIONS)
    yield topics
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="test-cleanup")
    try:
        doomed = [s.name for s in topics.specs() if s.name in set(admin.list_topics())]
        if doomed:
            admin.delete_topics(doomed)
    finally:
        admin.close()


def combee(topics: Topics, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "COMBEE_KAFKA_BOOTSTRAP": kafka_bootstrap_or_skip(),
        "COMBEE_TOPIC_PREFIX": topics.prefix,
        "COMBEE_PARTITIONS": str(topics.partitions),
    }
    return subprocess.run(
        [sys.executable, "-m", "combee.cli", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_publish_before_any_worker_names_the_missing_topic_then_lands_after_topics_create(
    topics: Topics, tmp_path: Path
) -> None:
    bootstrap = kafka_bootstrap_or_skip()
    traces = [{**t, "trace_id": f"tc-{i}"} for i, t in enumerate(generate_traces(12, 3, namespace="ns-topics")[0])]
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in traces))

    described = combee(topics, "topics", "describe")
    assert described.returncode == 1
    assert re.search(rf"^{re.escape(topics.traces)}\s+-\s+-\s+missing", described.stdout, re.MULTILINE)

    # The message is the fast path's own (the publisher looks the topic up before its first send); without it the
    # send would block on metadata for max_block_ms and end in kafka-python's KafkaTimeoutError. No wall-clock
    # bound: on a loaded machine starting the process alone takes seconds.
    refused = combee(topics, "publish", "--traces", str(path))
    assert refused.returncode == 4, refused.stderr
    assert refused.stderr == (
        f"combee: error: Kafka topic {topics.traces} does not exist; create it with: "
        f"combee topics create --bootstrap {bootstrap} --prefix {topics.prefix} --partitions {PARTITIONS}\n"
    )

    first = combee(topics, "topics", "create")
    assert first.returncode == 0, first.stderr
    names = [s.name for s in topics.specs()]
    assert [line.split()[1] for line in first.stdout.splitlines() if line.startswith("created")] == names
    again = combee(topics, "topics", "create")
    assert again.returncode == 0, again.stderr
    assert f"0 created, {len(names)} already there" in again.stdout
    assert not any(line.startswith(("created", "drift")) for line in again.stdout.splitlines())

    described = combee(topics, "topics", "describe")
    assert described.returncode == 0, described.stderr
    rows = {line.split()[0]: line.split()[1:4] for line in described.stdout.splitlines()[1:]}
    assert rows[topics.traces] == [str(PARTITIONS), "1", "ok"]
    assert rows[topics.deadletter] == ["1", "1", "ok"]
    assert set(rows) == set(names)

    published = combee(topics, "publish", "--traces", str(path))
    assert published.returncode == 0, published.stderr
    assert f"published 12 traces to {topics.traces}" in published.stdout

    consumer = KafkaConsumer(
        topics.traces, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=20_000
    )
    try:
        landed = []
        for record in consumer:
            landed.append(json.loads(record.value)["trace_id"])
            if len(landed) >= len(traces):
                break
    finally:
        consumer.close()
    assert sorted(landed) == sorted(t["trace_id"] for t in traces)
