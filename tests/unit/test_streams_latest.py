"""LatestVersionPublisher: never blocks the learner, coalesces to the newest version, backs off while Redis is
down. A fake store (compare-and-set in memory, switchable outage) and a fake sleep make it deterministic."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.exceptions

from combee.errors import InvalidNamespace
from streams.redis_connection import is_retryable
from streams.redis_publisher import LatestVersionPublisher


@dataclass
class FakeStore:
    """In-memory compare-and-set store; raises ``failure`` while ``down`` is positive (counting down per call)."""

    down: int = 0
    failure: Exception = field(default_factory=lambda: redis.exceptions.ConnectionError("Connection refused"))
    versions: dict[str, int] = field(default_factory=dict)
    calls: list[tuple[str, int]] = field(default_factory=list)
    written: list[tuple[str, int, str]] = field(default_factory=list)
    gate: asyncio.Event | None = None
    entered: asyncio.Event = field(default_factory=asyncio.Event)

    async def publish(
        self,
        namespace: str,
        version: int,
        prompt: str,
        playbook_json: str,
        *,
        window_id: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> bool:
        self.calls.append((namespace, version))
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.down > 0:
            self.down -= 1
            raise self.failure
        if self.versions.get(namespace, -1) >= version:
            return False
        self.versions[namespace] = version
        self.written.append((namespace, version, prompt))
        return True


class FakeSleep:
    """Records delays and returns at once (after yielding to the loop), like time passing instantly."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.third = asyncio.Event()

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        if len(self.delays) >= 3:
            self.third.set()
        await asyncio.sleep(0)


def make(store: FakeStore, **kwargs: Any) -> tuple[LatestVersionPublisher, FakeSleep]:
    sleep = FakeSleep()
    return LatestVersionPublisher(store, sleep=sleep, rng=random.Random(7), **kwargs), sleep


async def test_offers_are_published_and_counted() -> None:
    store = FakeStore()
    pub, _ = make(store)
    assert pub.offer("a", 1, "p1", "{}") is True
    assert pub.pending == 1
    await pub.run(until_idle=True)
    assert store.written == [("a", 1, "p1")]
    stats = pub.stats()
    assert (stats.published, stats.pending, stats.failures, stats.last_error) == (1, 0, 0, None)


async def test_only_the_newest_pending_version_is_kept() -> None:
    store = FakeStore()
    pub, _ = make(store)
    for v in range(1, 11):
        pub.offer("a", v, f"p{v}", "{}")
    assert pub.pending == 1 and pub.pending_version("a") == 10
    assert pub.offer("a", 4, "late", "{}") is False  # older than what is pending
    await pub.run(until_idle=True)
    assert store.written == [("a", 10, "p10")]
    assert pub.superseded == 10  # 9 replaced + 1 refused on arrival
    assert pub.offer("a", 10, "again", "{}") is False  # not newer than what was published


async def test_while_redis_is_down_the_newest_version_wins_once_it_is_back() -> None:
    store = FakeStore(down=5)
    pub, sleep = make(store)
    pub.offer("a", 1, "p1", "{}")
    task = asyncio.create_task(pub.run())
    await asyncio.wait_for(sleep.third.wait(), 5)  # Redis is down: the loop has retried v1 with backoff
    for v in (2, 3, 4):  # learning goes on; offer() does not wait
        pub.offer("a", v, f"p{v}", "{}")
    assert await pub.flush(timeout=5)
    task.cancel()
    assert store.written == [("a", 4, "p4")]
    assert pub.failures == 5 and pub.published == 1
    assert pub.last_error is not None and "ConnectionError" in pub.last_error
    assert all(version <= 4 for _, version in store.calls)


async def test_backoff_is_capped_exponential_with_jitter_and_resets_after_success() -> None:
    store = FakeStore(down=12)
    pub, sleep = make(store, backoff_base_s=0.1, backoff_cap_s=2.0)
    pub.offer("a", 1, "p", "{}")
    await pub.run(until_idle=True)
    assert len(sleep.delays) == 12
    for n, delay in enumerate(sleep.delays, start=1):
        ceiling = min(2.0, 0.1 * 2 ** (n - 1))
        assert ceiling / 2 <= delay <= ceiling, (n, delay)
    assert max(sleep.delays) <= 2.0
    assert len(set(sleep.delays)) == len(sleep.delays)  # jittered, not lock-step
    store.down = 1
    pub.offer("a", 2, "p", "{}")
    await pub.run(until_idle=True)
    assert sleep.delays[-1] <= 0.1  # the streak was reset by the success


async def test_backoff_is_deterministic_for_a_seeded_rng() -> None:
    a, _ = make(FakeStore())
    b, _ = make(FakeStore())
    assert [a.backoff_s(n) for n in range(1, 20)] == [b.backoff_s(n) for n in range(1, 20)]


@pytest.mark.parametrize(
    "failure",
    [
        redis.exceptions.ConnectionError("refused"),
        redis.exceptions.TimeoutError("timed out"),
        redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
        redis.exceptions.ResponseError("BUSY Redis is busy running a script."),
        OSError("network unreachable"),
        TimeoutError(),
    ],
)
async def test_retryable_failures_keep_the_version_pending(failure: Exception) -> None:
    assert is_retryable(failure)
    store = FakeStore(down=2, failure=failure)
    pub, sleep = make(store)
    pub.offer("a", 3, "p", "{}")
    await pub.run(until_idle=True)
    assert store.written == [("a", 3, "p")] and len(sleep.delays) == 2 and pub.dropped == 0


async def test_a_non_retryable_error_drops_that_offer_and_the_loop_goes_on() -> None:
    store = FakeStore(down=1, failure=ValueError("playbook_json is not valid JSON"))
    pub, sleep = make(store)
    pub.offer("a", 1, "p", "not json")
    pub.offer("b", 1, "p", "{}")
    await pub.run(until_idle=True)
    assert not is_retryable(store.failure)
    assert store.written == [("b", 1, "p")]
    assert (pub.dropped, pub.failures, sleep.delays) == (1, 1, [])


async def test_a_store_that_already_has_the_version_counts_as_not_newer() -> None:
    store = FakeStore(versions={"a": 9})
    pub, _ = make(store)
    pub.offer("a", 5, "p", "{}")
    await pub.run(until_idle=True)
    assert (pub.published, pub.skipped_not_newer) == (0, 1)


async def test_namespaces_are_independent_and_published_in_sorted_order() -> None:
    store = FakeStore()
    pub, _ = make(store)
    pub.offer("b", 2, "pb", "{}")
    pub.offer("a", 7, "pa", "{}")
    pub.offer("b", 3, "pb3", "{}")
    await pub.run(until_idle=True)
    assert store.written == [("a", 7, "pa"), ("b", 3, "pb3")]


async def test_an_offer_during_an_in_flight_publish_is_published_next() -> None:
    store = FakeStore(gate=asyncio.Event())
    pub, _ = make(store)
    pub.start()
    pub.offer("a", 1, "p1", "{}")
    await asyncio.wait_for(store.entered.wait(), 5)
    pub.offer("a", 2, "p2", "{}")  # v1 is in flight
    assert pub.pending == 1
    assert store.gate is not None
    store.gate.set()
    assert await pub.flush(timeout=5)
    assert [v for _, v, _ in store.written] == [1, 2]
    assert await pub.stop()


async def test_flush_times_out_while_redis_stays_down() -> None:
    store = FakeStore(down=10**9)
    pub, _ = make(store)
    pub.start()
    pub.offer("a", 1, "p", "{}")
    assert await pub.flush(timeout=0.05) is False
    assert pub.pending == 1
    assert await pub.stop() is False


async def test_flush_with_nothing_pending_returns_at_once() -> None:
    pub, _ = make(FakeStore())
    assert await pub.flush(timeout=0)


def test_offer_validates_its_arguments_immediately() -> None:
    pub, _ = make(FakeStore())
    with pytest.raises(InvalidNamespace):
        pub.offer("bad ns", 1, "p", "{}")
    for bad in (-1, 2**53, True, 1.5):
        with pytest.raises(ValueError):
            pub.offer("a", bad, "p", "{}")  # type: ignore[arg-type]
    assert pub.pending == 0


def test_offer_does_not_need_a_running_loop_and_never_awaits() -> None:
    pub, _ = make(FakeStore(down=10**9))
    for v in range(1000):
        pub.offer("a", v, "p", "{}")
    assert pub.pending == 1 and pub.pending_version("a") == 999


async def test_stopping_mid_publish_keeps_the_version_owed() -> None:
    store = FakeStore(gate=asyncio.Event())
    pub, _ = make(store)
    pub.start()
    pub.offer("a", 5, "p5", "{}")
    await asyncio.wait_for(store.entered.wait(), 5)
    assert await pub.stop() is False
    assert pub.pending == 1 and pub.pending_version("a") == 5
    assert store.gate is not None
    store.gate.set()
    await pub.run(until_idle=True)  # a restarted loop publishes it
    assert store.written == [("a", 5, "p5")]
