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
