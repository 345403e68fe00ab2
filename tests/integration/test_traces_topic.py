"""The traces topic as the real broker creates it: records over the trace limit (plus framing room) are refused
by the broker itself, and the topic's retention is the configured one (issue 26, item 3)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kafka import KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.errors import KafkaError

from combee.models import LIMITS
from streams.kafka_config import ensure_topics
from streams.topics import TRACES_MAX_MESSAGE_BYTES, Topics
from tests.integration.streams_support import kafka_bootstrap_or_skip, unique

pytestmark = pytest.mark.integration

RETENTION_MS = 3 * 24 * 3600 * 1000


@pytest.fixture
def topics() -> Iterator[Topics]:
    bootstrap = kafka_bootstrap_or_skip()
    made = Topics(prefix=unique("test-retention"), partitions=1, traces_retention_ms=RETENTION_MS)
    ensure_topics(bootstrap, made)
    yield made
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([s.name for s in made.specs()])
    finally:
        admin.close()


def test_the_broker_refuses_a_record_over_the_trace_limit_and_keeps_the_configured_retention(topics: Topics) -> None:
    bootstrap = kafka_bootstrap_or_skip()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        resource = ConfigResource(ConfigResourceType.TOPIC, topics.traces)
        described = admin.describe_configs([resource], config_filter="all").get("topic", {})
    finally:
        admin.close()
    configs = {key: entry.get("value") for key, entry in described[topics.traces].items()}
    assert configs["retention.ms"] == str(RETENTION_MS)
    assert configs["max.message.bytes"] == str(TRACES_MAX_MESSAGE_BYTES)

    producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=4 * 1024 * 1024, linger_ms=0)
    try:
        just_over = json.dumps({"namespace": "ns", "task": "x" * LIMITS.trace_bytes}).encode()
        producer.send(topics.traces, key=b"ns", value=just_over).get(timeout=30)  # the workers dead-letter it
        far_over = json.dumps({"namespace": "ns", "task": "x" * (LIMITS.trace_bytes * 2)}).encode()
        with pytest.raises(KafkaError, match=r"MessageSizeTooLarge|RecordTooLarge|too large"):
            producer.send(topics.traces, key=b"ns", value=far_over).get(timeout=30)
    finally:
        producer.close()


def test_forget_a_producer_then_replay_relearns_without_its_traces(topics: Topics) -> None:
    import os
    import subprocess
    import sys

    from kafka import KafkaConsumer

    from combee.settings import Settings
    from streams.codec import decode
    from streams.envelopes import WindowEnvelope
    from streams.forget import read_rules
    from streams.replay import replay
    from tests.integration.streams_support import redis_url_or_skip

    bootstrap, redis_url = kafka_bootstrap_or_skip(), redis_url_or_skip()
    env = {**os.environ, "COMBEE_KAFKA_BOOTSTRAP": bootstrap, "COMBEE_REDIS_URL": redis_url}
    env.update(COMBEE_TOPIC_PREFIX=topics.prefix, COMBEE_KEY_PREFIX=topics.prefix, COMBEE_PARTITIONS="1")
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        for i in range(9):
            who = "mallory" if i % 3 == 0 else "alice"
            trace = {"namespace": "ns", "trace_id": f"{who}-{i}", "task": f"t{i}", "metadata": {"producer": who}}
            producer.send(topics.traces, key=b"ns", value=json.dumps(trace).encode())
        producer.flush(30)
    finally:
        producer.close()

    done = subprocess.run(
        [sys.executable, "-m", "combee.cli", "traces", "forget", "--producer", "mallory"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    settings = Settings(
        kafka_bootstrap=bootstrap, redis_url=redis_url, topic_prefix=topics.prefix, key_prefix=topics.prefix,
        partitions=1,
    )  # fmt: skip
    rules = read_rules(settings)
    report = replay(settings, namespace="ns", into="ns-clean", windows="fresh", batch_size=4, rules=rules)
    assert (report.traces, report.forgotten) == (6, 3)

    consumer = KafkaConsumer(topics.windows, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=10_000)  # fmt: skip
    try:
        envelopes = [decode(m.value) for m in consumer]
    finally:
        consumer.close()
    replayed = [t.trace_id for e in envelopes if isinstance(e, WindowEnvelope) for t in e.traces]
    assert sorted(replayed) == sorted(f"alice-{i}" for i in range(9) if i % 3)
