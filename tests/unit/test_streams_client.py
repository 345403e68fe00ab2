"""PromptClient's cache policy with a fake Redis and a fake clock: fresh copies need no Redis, failures fall back
to the copy and back off, versions never go backwards, and PromptUnavailable only without any copy."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.exceptions

from combee.errors import InvalidNamespace
from streams.client import AsyncPromptClient, PromptClient, PromptUnavailable
from streams.keys import RedisKeys

KEYS = RedisKeys(prefix="t")


@dataclass
class FakeRedis:
    hashes: dict[str, dict[str, str]] = field(default_factory=dict)
    down: bool = False
    reads: int = 0

    def put(self, version: int, prompt: str) -> None:
        fields = {"version": str(version), "prompt": prompt, "window_id": f"w{version}", "published_at": "1.5"}
        self.hashes[KEYS.current("ns")] = fields
        self.hashes[KEYS.version("ns", version)] = fields

    def hmget(self, key: str, names: Any) -> list[str | None]:
        self.reads += 1
        if self.down:
            raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        row = self.hashes.get(key, {})
        return [row.get(n) for n in names]

    def pipeline(self, transaction: bool = True) -> FakePipeline:
        return FakePipeline(self)


@dataclass
class FakePipeline:
    """Buffers HMGETs and answers them in one round trip (one ``read``), as redis-py's pipeline does."""

    redis: FakeRedis
    queued: list[tuple[str, Any]] = field(default_factory=list)

    def hmget(self, key: str, names: Any) -> FakePipeline:
        self.queued.append((key, names))
        return self

    def execute(self) -> list[list[str | None]]:
        self.redis.reads += 1
        if self.redis.down:
            raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        return [[self.redis.hashes.get(k, {}).get(n) for n in names] for k, names in self.queued]


class AsyncFakePipeline(FakePipeline):
    async def execute(self) -> list[list[str | None]]:  # type: ignore[override]
        return FakePipeline.execute(self)

    async def __aenter__(self) -> AsyncFakePipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class AsyncFakeRedis(FakeRedis):
    async def hmget(self, key: str, names: Any) -> list[str | None]:  # type: ignore[override]
        return FakeRedis.hmget(self, key, names)

    def pipeline(self, transaction: bool = True) -> AsyncFakePipeline:  # type: ignore[override]
        return AsyncFakePipeline(self)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(fake: Any, clock: Clock, **kwargs: Any) -> PromptClient:
    return PromptClient(fake, "ns", keys=KEYS, clock=clock, rng=random.Random(1), **kwargs)


def test_a_fresh_copy_is_served_without_asking_redis() -> None:
    fake, clock = FakeRedis(), Clock()
    fake.put(1, "one")
    client = make(fake, clock, max_age_s=1.0)
    first = client.get()
    assert (first.version, first.prompt, first.window_id, first.published_at) == (1, "one", "w1", 1.5)
    clock.now += 0.5
    fake.put(2, "two")
    assert client.get().version == 1 and fake.reads == 1
    clock.now += 0.6
    assert client.get().version == 2 and fake.reads == 2


def test_redis_down_serves_the_stale_copy_and_backs_off() -> None:
    fake, clock = FakeRedis(), Clock()
    fake.put(3, "three")
    client = make(fake, clock, max_age_s=1.0, backoff_base_s=0.5, backoff_cap_s=4.0)
    client.get()
    fake.down = True
    reads = fake.reads
    clock.now += 10
    assert client.get().prompt == "three"
    assert fake.reads == reads + 1
    for _ in range(100):  # a hot loop does not hammer a dead Redis
        assert client.get().version == 3
    assert fake.reads == reads + 1
    clock.now += 4.1  # past the (capped) backoff
    assert client.get().version == 3 and fake.reads == reads + 2
    fake.down = False
    fake.put(4, "four")
    clock.now += 10
    assert client.get().version == 4


def test_no_copy_and_no_redis_raises_prompt_unavailable() -> None:
    fake, clock = FakeRedis(down=True), Clock()
    client = make(fake, clock)
    with pytest.raises(PromptUnavailable, match="no copy is cached"):
        client.get()
    fake.down = False
    with pytest.raises(PromptUnavailable, match="no published prompt"):
        client.get()


def test_versions_never_go_backwards_even_if_redis_does() -> None:
    fake, clock = FakeRedis(), Clock()
    fake.put(5, "five")
    client = make(fake, clock, max_age_s=0)
    assert client.get().version == 5
    fake.put(2, "two")  # e.g. Redis restored from an old snapshot
    assert client.get().version == 5
    fake.hashes.clear()  # Redis lost everything
    assert client.get().version == 5


def test_a_malformed_hash_is_treated_like_an_outage() -> None:
    fake, clock = FakeRedis(), Clock()
    fake.put(1, "one")
    client = make(fake, clock, max_age_s=0)
    client.get()
    fake.hashes[KEYS.current("ns")] = {"version": "not-a-number", "prompt": "x"}
    assert client.get().version == 1


async def test_async_client_has_the_same_policy() -> None:
    fake, clock = AsyncFakeRedis(), Clock()
    fake.put(1, "one")
    client = AsyncPromptClient(fake, "ns", keys=KEYS, clock=clock, max_age_s=1.0)  # type: ignore[arg-type]
    assert (await client.get()).version == 1
    fake.down = True
    clock.now += 5
    assert (await client.get()).prompt == "one"
    fresh = AsyncPromptClient(fake, "ns", keys=KEYS, clock=clock)  # type: ignore[arg-type]
    with pytest.raises(PromptUnavailable):
        await fresh.get()


def test_key_prefix_is_a_shortcut_for_keys() -> None:
    fake = FakeRedis()
    fake.put(1, "one")
    assert PromptClient(fake, "ns", key_prefix="t").get().version == 1  # type: ignore[arg-type]
    assert PromptClient("redis://127.0.0.1:1/0", "ns", key_prefix="x").keys == RedisKeys("x")
    with pytest.raises(ValueError, match="not both"):
        PromptClient(fake, "ns", keys=KEYS, key_prefix="t")  # type: ignore[arg-type]
    with pytest.raises(InvalidNamespace):
        PromptClient(fake, "bad ns")  # type: ignore[arg-type]


# -- what a promotion policy serves ------------------------------------------------------------------------------


def serve(fake: FakeRedis, **fields: str) -> None:
    state = fake.hashes.setdefault(KEYS.serving("ns"), {"rejected_through": "0"})
    state.update(fields)
    state["serial"] = str(int(state.get("serial", "0")) + 1)


def in_arm(fraction: float) -> tuple[str, str]:
    """An agent id in the arm at ``fraction`` and one outside it."""
    from combee.serving import in_canary_arm

    ids = [f"agent-{i}" for i in range(200)]
    inside = next(a for a in ids if in_canary_arm("ns", a, fraction))
    outside = next(a for a in ids if not in_canary_arm("ns", a, fraction))
    return inside, outside


def test_under_manual_every_agent_is_served_the_live_version_not_the_candidate() -> None:
    fake, clock = FakeRedis(), Clock()
    fake.put(3, "three")
    fake.put(4, "four (a candidate)")
    serve(fake, policy="manual", live="3", fraction="0")
    assert make(fake, clock, agent_id="a1").get().version == 3
    assert make(fake, clock).get().version == 3


def test_under_canary_only_the_arm_gets_the_candidate_and_a_rejection_takes_it_back() -> None:
    fake, clock = FakeRedis(), Clock()
    fake.put(3, "three")
    fake.put(4, "four (a candidate)")
    serve(fake, policy="canary", live="3", fraction="0.3")
    inside, outside = in_arm(0.3)
    arm, rest = make(fake, clock, agent_id=inside, max_age_s=0), make(fake, clock, agent_id=outside, max_age_s=0)
    assert (arm.get().version, rest.get().version) == (4, 3)
    serve(fake, rejected_through="4")  # the canary dropped it: the arm goes back to the live version
    assert (arm.get().version, rest.get().version) == (3, 3)


def test_a_promotion_reaches_every_agent_and_a_rollback_serves_a_lower_version() -> None:
    fake, clock = FakeRedis(), Clock()
    fake.put(3, "three")
    fake.put(4, "four")
    serve(fake, policy="manual", live="3", fraction="0")
    client = make(fake, clock, max_age_s=0)
    assert client.get().version == 3
    serve(fake, live="4", previous="3")
    assert client.get().version == 4
    serve(fake, live="3", previous="4")  # a recorded decision moved it back: not a stale read
    assert client.get().version == 3


async def test_the_async_client_serves_the_same_arm() -> None:
    fake, clock = AsyncFakeRedis(), Clock()
    fake.put(3, "three")
    fake.put(4, "four (a candidate)")
    serve(fake, policy="canary", live="3", fraction="0.3")
    inside, outside = in_arm(0.3)
    arm = AsyncPromptClient(fake, "ns", keys=KEYS, clock=clock, agent_id=inside)  # type: ignore[arg-type]
    rest = AsyncPromptClient(fake, "ns", keys=KEYS, clock=clock, agent_id=outside)  # type: ignore[arg-type]
    assert ((await arm.get()).version, (await rest.get()).version) == (4, 3)
