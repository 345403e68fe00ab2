"""The stack deploy/local/ starts is real and usable: a Kafka produce/consume round trip and Redis PING.

Uses the services named by COMBEE_KAFKA_BOOTSTRAP / COMBEE_REDIS_URL (exported by
`python -m deploy.local exec -- ...`, which `make test` uses); skipped when they are not set.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.integration

KAFKA = os.environ.get("COMBEE_KAFKA_BOOTSTRAP")
REDIS = os.environ.get("COMBEE_REDIS_URL")

needs_kafka = pytest.mark.skipif(
    not KAFKA, reason="COMBEE_KAFKA_BOOTSTRAP unset: run via `python -m deploy.local exec -- pytest`"
)
needs_redis = pytest.mark.skipif(
    not REDIS, reason="COMBEE_REDIS_URL unset: run via `python -m deploy.local exec -- pytest`"
)


@pytest.fixture
def topic() -> Iterator[str]:
    from kafka.admin import KafkaAdminClient, NewTopic

    name = f"test.deploy.{uuid.uuid4().hex[:12]}"
    admin = KafkaAdminClient(bootstrap_servers=KAFKA, client_id="test-deploy")
    # The broker does not auto-create topics (deploy/server.properties): create it like streams/ would.
    admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)])
    yield name
    admin.delete_topics([name])
    admin.close()


@needs_kafka
def test_broker_answers_metadata() -> None:
    from deploy.local import kafka_metadata

    assert KAFKA is not None
    host, port = KAFKA.rsplit(":", 1)
    meta = kafka_metadata(int(port), host)
    assert meta.brokers == ((1, host, int(port)),)
    assert meta.cluster_id


@needs_kafka
def test_kafka_produce_consume_round_trip(topic: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=KAFKA, acks="all")
    sent = {f"key-{i}".encode(): f"value-{i}".encode() for i in range(20)}
    for key, value in sent.items():
        producer.send(topic, key=key, value=value)
    producer.flush(timeout=30)
    producer.close()

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=KAFKA,
        group_id=f"test-deploy-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        consumer_timeout_ms=20_000,
    )
    received: dict[bytes, bytes] = {}
    for record in consumer:
        assert record.key is not None and record.value is not None
        received[record.key] = record.value
        if len(received) == len(sent):
            break
    consumer.close()
    assert received == sent


@needs_redis
def test_redis_ping_and_set_get() -> None:
    import redis

    assert REDIS is not None
    client = redis.Redis.from_url(REDIS)
    try:
        assert client.ping() is True
        key = f"test:deploy:{uuid.uuid4().hex}"
        assert client.set(key, b"ok", ex=60)
        assert client.get(key) == b"ok"
        client.delete(key)
    finally:
        client.close()
