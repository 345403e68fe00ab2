"""The owning worker's periodic check (workers/promotion.py) against a real Redis: a canary promotes or rejects,
a live version worse than its predecessor is rolled back, each decision recorded once with its evidence.

Redis only: the worker's context is a stand-in whose ``send`` keeps the control records it would send to Kafka
(the combiner's handling of them is covered by tests/integration/test_promotion.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis.asyncio

from combee.metrics import NoMetrics
from combee.models import Playbook
from combee.promotion import PromotionConfig, Rule
from streams.keys import RedisKeys
from streams.redis_outcomes import RedisOutcomes
from streams.redis_promotion import RedisPromotion
from streams.redis_store import RedisPromptStore
from tests.integration.streams_support import redis_url_or_skip, unique
from workers.promotion import check_namespace
from workers.tenure import Tenure, Tenures

pytestmark = [pytest.mark.integration]
NS = "ns-check"


@pytest.fixture
async def setup() -> AsyncIterator[tuple[Any, Any, RedisPromptStore, RedisPromotion]]:
    client = redis.asyncio.from_url(redis_url_or_skip())
    keys = RedisKeys(unique("it-promo"))
    store, promotion = RedisPromptStore(client, keys), RedisPromotion(client, keys)
    for v in (1, 2, 3):
        pb = Playbook(namespace=NS, version=v)
        await store.publish(NS, v, f"prompt {v}", pb.model_dump_json(), window_id=f"w{v}")
    tenure = Tenure(partition=0, epoch=0, owner="test")
    tenures = Tenures()
    tenures.claimed(tenure)
    sent: list[Any] = []

    async def send(topic: str, key: str, envelope: Any, partition: int | None = None) -> int:
        sent.append(envelope)
        return len(sent)

    ctx = SimpleNamespace(
        serving=promotion,
        outcomes=SimpleNamespace(store=RedisOutcomes(client, keys)),
        store=store,
        config=SimpleNamespace(promotion=PromotionConfig(rule=Rule(min_decided=50)), control_key=None),
        tenures=tenures,
        metrics=NoMetrics(),
        topics=SimpleNamespace(partials="partials"),
        send=send,
        sent=sent,
    )
    rt = SimpleNamespace(namespace=NS, tenure=tenure, combining=tenure.combining(NS), partition=0)
    try:
        yield ctx, rt, store, promotion
    finally:
        await client.aclose()


async def outcomes(client: Any, keys: RedisKeys, version: int, success: int, failure: int) -> None:
    await client.hset(keys.outcomes(NS), mapping={f"{version}|success": success, f"{version}|failure": failure})


async def test_a_canary_promotes_a_candidate_that_does_as_well_once(setup: Any) -> None:
    ctx, rt, store, promotion = setup
    await promotion.set_policy(NS, "canary", 0.2, {"id": "policy/1", "action": "policy"}, set_by="t", at=1.0)
    await store.redis.hset(promotion.keys.serving(NS), "live", "1")  # v2 and v3 are candidates
    assert await check_namespace(ctx, rt, 10.0) is None  # no outcomes yet: undecided
    await outcomes(store.redis, promotion.keys, 1, 80, 20)
    await outcomes(store.redis, promotion.keys, 2, 40, 5)
    await outcomes(store.redis, promotion.keys, 3, 40, 5)
    decision = await check_namespace(ctx, rt, 11.0)
    assert decision is not None and (decision.action, decision.serve) == ("promote", 3)
    state = await promotion.serving(NS)
    assert (state.live, state.previous) == (3, 1)
    recorded = await promotion.decision(NS, "promote/v3")
    assert recorded is not None and recorded["evidence"]["comparison"]["verdict"] == "not_worse"
    assert await check_namespace(ctx, rt, 12.0) is None  # nothing pending any more
    assert ctx.sent == []  # a promotion needs no control record


async def test_a_canary_rejects_a_worse_candidate_and_asks_the_combiner_for_the_live_content(setup: Any) -> None:
    ctx, rt, store, promotion = setup
    await promotion.set_policy(NS, "canary", 0.2, {"id": "policy/1", "action": "policy"}, set_by="t", at=1.0)
    await store.redis.hset(promotion.keys.serving(NS), "live", "2")
    await outcomes(store.redis, promotion.keys, 2, 90, 10)
    await outcomes(store.redis, promotion.keys, 3, 20, 60)
    decision = await check_namespace(ctx, rt, 11.0)
    assert decision is not None and (decision.action, decision.version) == ("reject", 3)
    state = await promotion.serving(NS)
    assert (state.live, state.rejected_through) == (2, 3)
    assert [(c.kind, c.to_version, c.actor) for c in ctx.sent] == [("reject", 3, "combee:canary")]
    assert await check_namespace(ctx, rt, 12.0) is None  # rejected: not decided again
    assert len(ctx.sent) == 1


async def test_direct_rolls_back_a_live_version_worse_than_its_predecessor_once(setup: Any) -> None:
    ctx, rt, store, promotion = setup
    await outcomes(store.redis, promotion.keys, 2, 90, 10)
    await outcomes(store.redis, promotion.keys, 3, 30, 70)
    decision = await check_namespace(ctx, rt, 11.0)
    assert decision is not None and (decision.action, decision.version, decision.serve) == ("rollback", 3, 2)
    assert decision.decided_by == "outcomes"
    assert [(c.kind, c.to_version) for c in ctx.sent] == [("rollback", 2)]
    assert await check_namespace(ctx, rt, 12.0) is None  # recorded: never sent twice
    assert len(ctx.sent) == 1
    assert (await promotion.serving(NS)).policy == "direct"  # direct stays direct: the combiner serves v2's content


async def test_only_the_owner_checks(setup: Any) -> None:
    ctx, rt, store, promotion = setup
    await outcomes(store.redis, promotion.keys, 2, 90, 10)
    await outcomes(store.redis, promotion.keys, 3, 30, 70)
    ctx.tenures.revoke(0)  # the partition is another process's now
    assert await check_namespace(ctx, rt, 11.0) is None and ctx.sent == []
