"""``combee status``: per namespace, what Redis and Kafka say — version, the worker's report, consumer lag."""

from __future__ import annotations

from typing import Any

from combee.settings import Settings
from streams.keys import RedisKeys
from streams.topics import Topics, partition_for

__all__ = ["collect_status", "traces_lag"]


def traces_lag(settings: Settings, topics: Topics) -> dict[int, int | None]:
    """Per traces partition: end offset minus the learner group's committed offset (None if unknown)."""
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    from streams.kafka_config import kafka_security_kwargs

    security = kafka_security_kwargs(settings)
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, **security)
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, **security)
    try:
        group = f"{settings.topic_prefix}-worker"
        tps = [TopicPartition(topics.traces, p) for p in range(topics.partitions)]
        committed = admin.list_group_offsets({group: tps}).get(group, {})
        ends = consumer.end_offsets(tps)
        out: dict[int, int | None] = {}
        for tp in tps:
            meta = committed.get(tp)
            out[tp.partition] = None if meta is None or meta.offset < 0 else max(0, ends[tp] - meta.offset)
        return out
    finally:
        admin.close()
        consumer.close()


async def collect_status(settings: Settings, namespace: str | None = None) -> list[dict[str, Any]]:
    from streams.redis_connection import build_redis
    from streams.redis_store import RedisPromptStore

    topics = Topics(prefix=settings.topic_prefix, partitions=settings.partitions)
    redis = build_redis(settings)
    store = RedisPromptStore(redis, RedisKeys(settings.key_prefix))
    try:
        names = [namespace] if namespace else sorted(await store.namespaces())
        try:
            lag = traces_lag(settings, topics)
        except Exception:  # Kafka unreachable: still report what Redis knows
            lag = {}
        rows = []
        for ns in names:
            current = await store.current(ns)
            rows.append(
                {
                    "namespace": ns,
                    "version": current.version if current else None,
                    "lag": lag.get(partition_for(ns.encode(), topics.partitions)),
                    "worker_status": await store.get_status(ns),
                }
            )
        return rows
    finally:
        await redis.aclose()
