"""Compatibility probe: kafka-python against the broker deploy/local/ runs.

Checks, each printed as PASS/FAIL: admin create_topics (a plain topic and a compacted one, whose config is read
back with describe_configs), a producer with acks=all, a consumer reading everything back, offsets_for_times,
and a committed consumer-group offset. Exit code 0 only if all pass.

    python -m deploy.local exec -- .venv/bin/python deploy/probes/kafka_python_probe.py
"""

from __future__ import annotations

import os
import sys
import time
import uuid

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic

from deploy.probes import Checks


def main() -> int:
    bootstrap = os.environ["COMBEE_KAFKA_BOOTSTRAP"]
    checks = Checks("kafka-python")
    suffix = uuid.uuid4().hex[:8]
    plain, compacted = f"probe.kp.plain.{suffix}", f"probe.kp.compacted.{suffix}"

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="probe-admin")
    with checks.step("admin create_topics (plain + cleanup.policy=compact)"):
        admin.create_topics(
            [
                NewTopic(plain, num_partitions=2, replication_factor=1),
                NewTopic(
                    compacted,
                    num_partitions=1,
                    replication_factor=1,
                    topic_configs={"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"},
                ),
            ]
        )
        names = set(admin.list_topics())
        assert {plain, compacted} <= names, names
    with checks.step("admin describe_configs shows the compacted policy"):
        result = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, compacted)])
        text = repr(result)
        assert "cleanup.policy" in text and "compact" in text, text[:500]

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    before_ms = int(time.time() * 1000)
    with checks.step("producer acks=all, 100 records"):
        futures = [producer.send(plain, key=f"k{i % 10}".encode(), value=f"v{i}".encode()) for i in range(100)]
        producer.flush(timeout=30)
        metas = [f.get(timeout=30) for f in futures]
        assert all(m.offset >= 0 for m in metas)
        for i in range(3):
            producer.send(compacted, key=b"same", value=f"version-{i}".encode()).get(timeout=30)
    after_ms = int(time.time() * 1000) + 1

    with checks.step("consumer group reads all 100 records and commits"):
        consumer = KafkaConsumer(
            plain,
            bootstrap_servers=bootstrap,
            group_id=f"probe-kp-{suffix}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            consumer_timeout_ms=15000,
        )
        seen = set()
        for record in consumer:
            seen.add(record.value)
            if len(seen) == 100:
                break
        assert len(seen) == 100, len(seen)
        consumer.commit()
        committed = sum(consumer.committed(tp) or 0 for tp in consumer.assignment())
        assert committed == 100, committed
        consumer.close()

    with checks.step("offsets_for_times"):
        reader = KafkaConsumer(bootstrap_servers=bootstrap)
        tps = [TopicPartition(plain, p) for p in (0, 1)]
        early = reader.offsets_for_times(dict.fromkeys(tps, before_ms))
        late = reader.offsets_for_times(dict.fromkeys(tps, after_ms))
        assert all(early[tp] is not None and early[tp].offset == 0 for tp in tps), early
        assert all(late[tp] is None for tp in tps), late
        reader.close()

    producer.close()
    admin.delete_topics([plain, compacted])
    admin.close()
    return checks.report()


if __name__ == "__main__":
    sys.exit(main())
