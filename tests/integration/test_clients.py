"""The agent-side SDK against the real services: PromptClient / AsyncPromptClient on Redis (including a private
redis-server that the test kills and restarts), TracePublisher and ensure_topics on Kafka.

Needs COMBEE_REDIS_URL and COMBEE_KAFKA_BOOTSTRAP (``python -m deploy.local up``); each test uses its own key
or topic prefix. Tests that kill Redis start their own redis-server on a free port and only ever kill that one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kafka import KafkaConsumer
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

from combee.errors import ConfigError, InvalidNamespace, TraceError
from combee.models import Trace
from combee.tracefile import parse_trace
from streams.client import AsyncPromptClient, PromptClient, PromptUnavailable, PromptVersion
from streams.kafka_config import ensure_topics
from streams.keys import RedisKeys
from streams.publisher import TracePublisher
from streams.redis_connection import build_redis
from streams.redis_store import RedisPromptStore
from streams.topics import Topics
from tests.integration.streams_support import (
    PrivateRedis,
    kafka_bootstrap_or_skip,
    redis_url_or_skip,
    unique,
)

pytestmark = pytest.mark.integration

PLAYBOOK = json.dumps({"namespace": "ns", "version": 0, "bullets": []})


def prompt_for(version: int) -> str:
    return f"learned prompt v{version} " + "·" * (version % 11) * 50


async def publish_all(url: str, keys: RedisKeys, versions: list[int], *, connections: int = 4) -> None:
    """Publish ``versions`` concurrently (in the given order) over several connections."""
    clients = [build_redis(url) for _ in range(connections)]
    stores = [RedisPromptStore(c, keys) for c in clients]
    try:
        await asyncio.gather(
            *(stores[i % connections].publish("ns", v, prompt_for(v), PLAYBOOK) for i, v in enumerate(versions))
        )
    finally:
        for c in clients:
            await c.aclose()


def publish_sync(url: str, keys: RedisKeys, version: int) -> None:
    asyncio.run(publish_all(url, keys, [version], connections=1))


@pytest.fixture
def keys() -> Iterator[RedisKeys]:
    keys = RedisKeys(prefix=unique("test-client"))
    yield keys
    url = os.environ.get("COMBEE_REDIS_URL")
    if not url:  # the test used only a private redis-server
        return
    with contextlib.closing(redis.Redis.from_url(url)) as r:
        for key in r.scan_iter(match=f"{keys.prefix}:*", count=500):
            r.delete(key)


class SyncWatcher(threading.Thread):
    """Runs PromptClient.watch in a thread, recording (version, prompt, arrival wall time)."""

    def __init__(self, client: PromptClient, until_version: int, timeout_s: float) -> None:
        super().__init__(daemon=True)
        self.client, self.until_version, self.timeout_s = client, until_version, timeout_s
        self.seen: list[tuple[PromptVersion, float]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for item in self.client.watch(timeout=self.timeout_s):
                self.seen.append((item, time.time()))
                if item.version >= self.until_version:
                    return
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def versions(self) -> list[int]:
        return [v.version for v, _ in self.seen]

    def wait_for(self, version: int, timeout_s: float) -> float:
        """Seconds until ``version`` was seen; fails the test after ``timeout_s``."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if any(v >= version for v in self.versions()):
                return time.monotonic() - start
            assert self.error is None, self.error
            time.sleep(0.01)
        raise AssertionError(f"watcher did not see version {version} within {timeout_s}s; saw {self.versions()}")


def test_watchers_see_strictly_increasing_versions_with_matching_prompts(keys: RedisKeys) -> None:
    url = redis_url_or_skip()
    publish_sync(url, keys, 0)
    sync_client = PromptClient(url, "ns", keys=keys, poll_interval_s=0.5)
    watcher = SyncWatcher(sync_client, until_version=400, timeout_s=60)
    watcher.start()
    watcher.wait_for(0, timeout_s=10)  # subscribed and polled once

    async def scenario() -> list[PromptVersion]:
        async_client = AsyncPromptClient(url, "ns", keys=keys, poll_interval_s=0.5)
        seen: list[PromptVersion] = []
        subscribed = asyncio.Event()

        async def watch() -> None:
            async with contextlib.aclosing(async_client.watch(timeout=60)) as stream:
                async for item in stream:
                    seen.append(item)
                    subscribed.set()
                    if item.version >= 400:
                        return

        task = asyncio.create_task(watch())
        await asyncio.wait_for(subscribed.wait(), 10)
        # 200 versions in random order (the store writes only those newer than everything before them),
        # then 200 more issued in order over 4 connections (nearly all written, racing each other).
        versions = list(range(1, 201))
        random.Random(11).shuffle(versions)
        await publish_all(url, keys, versions)
        await publish_all(url, keys, list(range(201, 401)))
        await asyncio.wait_for(task, 30)
        written.update(e.version for e in await async_client.history(1000))
        await async_client.aclose()
        return seen

    written: set[int] = set()
    async_seen = asyncio.run(scenario())
    watcher.join(timeout=30)
    sync_client.close()
    assert watcher.error is None
    for seen in ([v for v, _ in watcher.seen], async_seen):
        versions = [v.version for v in seen]
        assert versions == sorted(set(versions)), "a watcher yielded a version twice or out of order"
        assert versions[0] == 0 and versions[-1] == 400
        assert set(versions) <= written, "a watcher yielded a version that was never written"
        # With pub/sub working, the poll (which may jump to the newest) stays out of the way of a burst.
        assert len(versions) >= len(written) // 2, f"only {len(versions)} of the {len(written)} written seen"
        for item in seen:
            assert item.prompt == prompt_for(item.version), f"prompt and version disagree at v{item.version}"


def test_watch_falls_back_to_polling_when_an_announcement_is_missed(keys: RedisKeys) -> None:
    url = redis_url_or_skip()
    publish_sync(url, keys, 1)
    client = PromptClient(url, "ns", keys=keys, poll_interval_s=0.3)
    watcher = SyncWatcher(client, until_version=2, timeout_s=20)
    watcher.start()
    watcher.wait_for(1, timeout_s=10)
    # Write version 2 the way the script does but without PUBLISH: an announcement that never arrives.
    with contextlib.closing(redis.Redis.from_url(url)) as r:
        r.hset(
            keys.current("ns"),
            mapping={"version": "2", "prompt": prompt_for(2), "playbook": PLAYBOOK, "window_id": "", "meta": "{}"},
        )
    watcher.wait_for(2, timeout_s=5)  # only the poll can find it: no announcement was sent
    watcher.join(timeout=5)
    client.close()
    assert watcher.versions() == [1, 2]
    assert watcher.seen[-1][0].prompt == prompt_for(2)


def test_prompt_client_cache_survives_redis_going_away(keys: RedisKeys, private_redis: PrivateRedis) -> None:
    url = private_redis.url
    publish_sync(url, keys, 1)
    now = [0.0]  # the client's clock, moved by the test: no sleeping, no timing of the machine
    client = PromptClient(url, "ns", keys=keys, max_age_s=0.2, backoff_base_s=0.05, backoff_cap_s=0.5,
                          clock=lambda: now[0])  # fmt: skip
    reads = 0
    read = client._read_served  # one round trip: the serving state and the head

    def counted(announced: int | None = None) -> tuple[int, PromptVersion | None]:
        nonlocal reads
        reads += 1
        return read(announced)

    client._read_served = counted  # type: ignore[method-assign]
    assert client.get().version == 1 and reads == 1

    private_redis.stop()
    now[0] += 0.3  # the copy is now older than max_age_s
    answers = [client.get() for _ in range(200)]
    assert {a.version for a in answers} == {1} and answers[0].prompt == prompt_for(1)
    assert reads == 2, f"{reads - 1} of 200 get() calls with Redis down asked Redis (the backoff lets one)"
    with PromptClient(url, "ns", keys=keys) as newcomer, pytest.raises(PromptUnavailable):
        newcomer.get()  # no copy at all: the only case that raises

    private_redis.start()  # back, empty (no persistence); the learner publishes its next version
    publish_sync(url, keys, 2)
    deadline = time.monotonic() + 5
    while client.get().version != 2:
        assert time.monotonic() < deadline, "the client never refreshed after Redis came back"
        now[0] += 1.0  # past the backoff's cap: the next get() asks Redis again
        time.sleep(0.05)
    assert client.get().prompt == prompt_for(2)
    assert [e.version for e in client.history(5)] == [2]
    client.close()


def test_watch_survives_a_redis_restart(keys: RedisKeys, private_redis: PrivateRedis) -> None:
    url = private_redis.url
    publish_sync(url, keys, 1)
    client = PromptClient(url, "ns", keys=keys, poll_interval_s=0.5, backoff_base_s=0.05, backoff_cap_s=0.5)
    watcher = SyncWatcher(client, until_version=3, timeout_s=30)
    watcher.start()
    watcher.wait_for(1, timeout_s=10)
    private_redis.stop()
    time.sleep(1.0)  # the watcher is now reconnecting with backoff
    private_redis.start()
    publish_sync(url, keys, 2)
    watcher.wait_for(2, timeout_s=5)
    publish_sync(url, keys, 3)
    watcher.wait_for(3, timeout_s=5)
    watcher.join(timeout=5)
    client.close()
    assert watcher.error is None and watcher.versions() == [1, 2, 3]


async def test_async_watch_survives_a_redis_restart(keys: RedisKeys, private_redis: PrivateRedis) -> None:
    url = private_redis.url
    await publish_all(url, keys, [1], connections=1)
    client = AsyncPromptClient(url, "ns", keys=keys, poll_interval_s=0.5, backoff_base_s=0.05, backoff_cap_s=0.5)
    seen: list[int] = []
    first = asyncio.Event()

    async def watch() -> None:
        async with contextlib.aclosing(client.watch(timeout=30)) as stream:
            async for item in stream:
                assert item.prompt == prompt_for(item.version)
                seen.append(item.version)
                first.set()
                if item.version >= 2:
                    return

    task = asyncio.create_task(watch())
    await asyncio.wait_for(first.wait(), 10)
    await asyncio.to_thread(private_redis.stop)
    await asyncio.sleep(1.0)
    assert (await client.get()).version == 1  # served from the copy while Redis is gone
    await asyncio.to_thread(private_redis.start)
    await publish_all(url, keys, [2], connections=1)
    await asyncio.wait_for(task, 10)
    assert seen == [1, 2]
    assert [e.version for e in await client.history(3)] == [2]
    await client.aclose()


# ----------------------------------------------------------------------------------------------------------
# Kafka
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture
def topics() -> Iterator[Topics]:
    bootstrap = kafka_bootstrap_or_skip()
    topics = Topics(prefix=unique("test-streams"), partitions=2)
    yield topics
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="test-cleanup")
    try:
        existing = set(admin.list_topics())
        doomed = [s.name for s in topics.specs() if s.name in existing]
        if doomed:
            admin.delete_topics(doomed)
    finally:
        admin.close()


def consume(bootstrap: str, topic: str, count: int, timeout_s: float = 20) -> list[Any]:
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=int(timeout_s * 1000)
    )
    records = []
    try:
        for record in consumer:
            records.append(record)
            if len(records) >= count:
                break
    finally:
        consumer.close()
    return records


def test_trace_publisher_round_trip_through_kafka(topics: Topics) -> None:
    bootstrap = kafka_bootstrap_or_skip()
    report = ensure_topics(bootstrap, topics)
    assert topics.traces in report.created
    trace = Trace(
        trace_id="t-1", namespace="support", task="refund order 17", output="done", feedback={"success": True}
    )
    mapping: dict[str, Any] = {
        "namespace": "billing",
        "task": "explain an invoice",
        "trajectory": "looked up the invoice, explained the VAT line",
        "feedback": {"score": 0.5},
    }
    with TracePublisher(bootstrap, topics) as publisher:
        first = publisher.publish(trace)
        second = publisher.publish(mapping)
        more = publisher.publish_many([{**mapping, "trace_id": f"m-{i}"} for i in range(20)])
        with pytest.raises(TraceError):
            publisher.publish({"namespace": "support"})
        with pytest.raises(InvalidNamespace):
            publisher.publish({**mapping, "namespace": "no spaces allowed"})
        publisher.flush(timeout=30)
        metadata = [f.get(timeout=30) for f in (first, second, *more)]
        assert publisher.delivered == 22 and publisher.failed == 0
    assert all(m.topic == topics.traces and m.offset >= 0 for m in metadata)

    records = consume(bootstrap, topics.traces, count=22)
    assert len(records) == 22
    by_id = {parse_trace(r.value).trace_id: r for r in records}
    assert by_id["t-1"].key == b"support" and parse_trace(by_id["t-1"].value) == trace
    derived = [r for r in records if parse_trace(r.value).namespace == "billing" and r.key == b"billing"]
    assert len(derived) == 21
    # The workers decode exactly what the publisher validated, keyed by namespace -> one partition each.
    assert len({r.partition for r in records if r.key == b"billing"}) == 1
    plain = next(r for r in derived if "trace_id" not in json.loads(r.value))
    assert parse_trace(plain.value, default_namespace=plain.key.decode()).steps[0].content.startswith("looked up")


def test_ensure_topics_creates_compacted_playbooks_and_is_idempotent(topics: Topics) -> None:
    bootstrap = kafka_bootstrap_or_skip()
    first = ensure_topics(bootstrap, topics, timeout_s=30)
    assert set(first.created) == {s.name for s in topics.specs()}
    again = ensure_topics(bootstrap, topics, timeout_s=30)
    assert again.created == () and again.config_drift == {}

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="test-verify")
    try:
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topics.playbooks)])
        playbooks = configs["topic"][topics.playbooks]
        assert playbooks["cleanup.policy"]["value"] == "compact"
        assert playbooks["min.compaction.lag.ms"]["value"] == "0"
        described = {t["name"]: t for t in admin.describe_topics([s.name for s in topics.specs()])}
        assert len(described[topics.traces]["partitions"]) == 2
        assert len(described[topics.deadletter]["partitions"]) == 1
    finally:
        admin.close()

    wrong = Topics(prefix=topics.prefix, partitions=3)
    with pytest.raises(ConfigError, match=rf"{topics.traces} has 2 partitions, expected 3"):
        ensure_topics(bootstrap, wrong, timeout_s=30)
