"""Version numbers are bounded (issue 26 item 1): the publish script refuses a version above 2**53 - 1, a stored
one written outside Combee blocks publishes with an error naming the repair, clients never adopt it, and
``combee prompt repair NS`` resets the current version to the highest valid one.

Needs COMBEE_REDIS_URL (``python -m deploy.local up``). Every test uses its own key prefix.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio
import redis.exceptions

from combee.cli.main import main
from streams import redis_store
from streams.client import PromptClient
from streams.keys import RedisKeys
from streams.redis_connection import build_redis
from streams.redis_records import MAX_VERSION
from streams.redis_repair import repair_namespace
from streams.redis_store import RedisPromptStore
from tests.integration.streams_support import redis_url_or_skip, unique

pytestmark = pytest.mark.integration

NS = "tampered"
PLAYBOOK = json.dumps({"namespace": NS, "version": 0, "bullets": []})
HUGE = 2**60


@pytest.fixture
async def client() -> AsyncIterator[redis.asyncio.Redis]:
    r = build_redis(redis_url_or_skip())
    yield r
    await r.aclose()


@pytest.fixture
async def keys(client: redis.asyncio.Redis) -> AsyncIterator[RedisKeys]:
    k = RedisKeys(prefix=unique("test-tamper"))
    yield k
    async for key in client.scan_iter(match=f"{k.prefix}:*", count=500):
        await client.delete(key)


async def _publish(store: RedisPromptStore, version: int) -> bool:
    return await store.publish(NS, version, f"prompt v{version}", PLAYBOOK, window_id=f"{NS}/p0/{version}")


async def _tamper(client: redis.asyncio.Redis, keys: RedisKeys) -> None:
    """What someone with write access to Redis can do: a huge version in ``current`` and in the history."""
    await client.hset(keys.current(NS), mapping={"version": str(HUGE), "prompt": "pwned"})
    await client.zadd(keys.history(NS), {json.dumps({"version": HUGE}): HUGE})


async def test_the_publish_script_refuses_a_version_above_the_largest(
    client: redis.asyncio.Redis, keys: RedisKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RedisPromptStore(client, keys)
    assert await _publish(store, 1)
    monkeypatch.setattr(redis_store, "check_version", lambda v: v)  # another writer, without the Python check
    with pytest.raises(redis.exceptions.ResponseError, match="above the largest version 2\\*\\*53 - 1"):
        await _publish(store, MAX_VERSION + 1)
    assert (await store.current(NS)).version == 1  # type: ignore[union-attr]
    assert await _publish(store, MAX_VERSION)  # the largest itself is a version


async def test_a_tampered_version_blocks_publishes_clients_ignore_it_and_repair_recovers(
    client: redis.asyncio.Redis, keys: RedisKeys
) -> None:
    store = RedisPromptStore(client, keys)
    assert await _publish(store, 1) and await _publish(store, 2)
    now = [0.0]
    with PromptClient(redis_url_or_skip(), NS, keys=keys, max_age_s=1.0, clock=lambda: now[0]) as reader:
        assert reader.get().version == 2
        await _tamper(client, keys)
        now[0] += 5
        assert reader.get().version == 2  # the running client does not adopt the tampered version
        with pytest.raises(redis.exceptions.ResponseError, match=f"combee prompt repair {NS}"):
            await _publish(store, 3)

        outcome = await repair_namespace(client, keys, NS)
        assert (outcome.reset, outcome.version, outcome.removed) == (True, 2, 1)
        current = await store.current(NS)
        assert current is not None and (current.version, current.prompt) == (2, "prompt v2")
        assert await _publish(store, 3)  # learning goes on where it was
        now[0] += 5
        assert reader.get().version == 3  # ... and the running client follows it


def test_combee_prompt_repair_says_what_it_did(capsys: pytest.CaptureFixture[str]) -> None:
    url, keys = redis_url_or_skip(), RedisKeys(prefix=unique("test-tamper"))

    async def run(step: Callable[[redis.asyncio.Redis], Awaitable[Any]]) -> Any:
        r = build_redis(url)
        try:
            return await step(r)
        finally:
            await r.aclose()

    assert asyncio.run(run(lambda r: _publish(RedisPromptStore(r, keys), 1)))
    argv = ["prompt", "repair", NS, "--redis-url", url, "--prefix", keys.prefix]
    assert main(argv) == 0
    assert "current version 1 is valid, nothing to reset" in capsys.readouterr().out
    asyncio.run(run(lambda r: r.hset(keys.current(NS), "version", "not a number")))
    assert main(argv) == 0
    assert "current version reset to 1, the highest valid one stored" in capsys.readouterr().out
    assert asyncio.run(run(lambda r: _publish(RedisPromptStore(r, keys), 2)))
    asyncio.run(
        run(
            lambda r: r.delete(
                keys.current(NS), keys.history(NS), keys.version(NS, 1), keys.version(NS, 2), keys.namespaces
            )
        )
    )
