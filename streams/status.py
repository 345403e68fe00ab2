"""``combee status``: per namespace, what Redis and Kafka say — version, the worker's report, consumer lag — and
each worker's health report (its dependencies up or down, since when, what an outage holds up)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

from streams.topics import Topics, partition_for

if TYPE_CHECKING:
    from streams.redis_store import RedisPromptStore
    from streams.settings import KafkaSettings, RedisSettings, StreamSettings

__all__ = ["NamespaceState", "collect_status", "namespace_state", "read_namespace_state", "traces_lag"]

NamespaceState = Literal["published", "learning", "unknown"]


def traces_lag(settings: KafkaSettings, topics: Topics) -> dict[int, int | None]:
    """Per traces partition: end offset minus the learner group's committed offset (None if unknown).
    Raises KafkaUnreachable at once when no bootstrap address answers."""
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    from streams.kafka_config import kafka_security_kwargs, require_kafka

    require_kafka(settings)
    security = kafka_security_kwargs(settings)
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, **security)
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, **security)
    try:
        group = f"{topics.prefix}-worker"
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


async def namespace_state(store: RedisPromptStore, namespace: str) -> NamespaceState:
    """``published`` (a version is in Redis), ``learning`` (a worker has received its traces, or reports on it,
    but nothing is published yet) or ``unknown`` (no worker has seen a trace of it)."""
    if await store.current(namespace) is not None:
        return "published"
    if namespace in await store.seen_namespaces() or await store.get_status(namespace) is not None:
        return "learning"
    return "unknown"


async def read_namespace_state(settings: RedisSettings, namespace: str) -> tuple[NamespaceState, dict[str, Any] | None]:
    """:func:`namespace_state` of ``namespace`` with its worker's report (None: none), over a connection of its
    own. Raises redis-py's errors when Redis cannot be read."""
    from streams.redis_store import RedisPromptStore

    store = RedisPromptStore.from_settings(settings)
    redis = store.redis
    try:
        return await namespace_state(store, namespace), await store.get_status(namespace)
    finally:
        await redis.aclose()


async def collect_status(settings: StreamSettings, namespace: str | None = None) -> dict[str, Any]:
    """``{"namespaces": [row, ...], "workers": [health report, ...], "kafka_error": str | None}``.

    A row per namespace published or seen by a worker (or just ``namespace``): its ``state`` (see
    :func:`namespace_state`), version (None: none yet), traces lag (None: unknown), the worker's report and the
    outcomes per version key, newest first (:func:`combee.outcomes.as_json`; ``unknown``: above the live one),
    and ``promotion``: the policy, the live version, the pending candidate and the newest decisions.
    A worker's health report gains ``age_s`` (seconds since it was written). Kafka unreachable leaves the lag
    unknown and says why in ``kafka_error``; Redis unreachable raises redis-py's error.
    """
    from combee.errors import KafkaUnreachable
    from combee.outcomes import as_json, version_order
    from streams.redis_outcomes import RedisOutcomes
    from streams.redis_promotion import RedisPromotion, promotion_summary
    from streams.redis_store import RedisPromptStore

    topics = settings.topics()
    store = RedisPromptStore.from_settings(settings)
    redis = store.redis
    outcomes = RedisOutcomes(redis, store.keys)
    promotion = RedisPromotion(redis, store.keys)
    try:
        known = set(await store.namespaces()) | set(await store.seen_namespaces())
        names = [namespace] if namespace else sorted(known)
        kafka_error = None
        try:
            lag = traces_lag(settings, topics)
        except KafkaUnreachable as exc:
            lag, kafka_error = {}, str(exc)
        except Exception as exc:  # Kafka answering badly: still report what Redis knows
            lag, kafka_error = {}, f"{type(exc).__name__}: {exc}"[:300]
        rows = []
        for ns in names:
            current = await store.current(ns)
            counts = await outcomes.counts(ns)
            rows.append(
                {
                    "namespace": ns,
                    "state": await namespace_state(store, ns),
                    "version": current.version if current else None,
                    "lag": lag.get(partition_for(ns.encode(), topics.partitions)),
                    "worker_status": await store.get_status(ns),
                    "outcomes": {k: as_json(counts[k]) for k in sorted(counts, key=version_order)},
                    "promotion": await promotion_summary(promotion, ns, current.version if current else None),
                }
            )
        now = time.time()
        workers = await store.health_reports()
        for report in workers:
            updated = report.get("updated_at")
            report["age_s"] = round(now - updated, 1) if isinstance(updated, int | float) else None
        return {"namespaces": rows, "workers": workers, "kafka_error": kafka_error}
    finally:
        await redis.aclose()
