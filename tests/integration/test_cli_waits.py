"""The command line's wait for a new version (``combee prompt rollback``, ``combee bullet pin|remove|…``) and the
forget rules' blocking store, against a real redis-server of the test's own (no Kafka, no worker)."""

from __future__ import annotations

import asyncio
import threading

from combee.cli.base import prompt_client, wait_for_version
from combee.forget import ForgetRule
from combee.models import Playbook
from combee.settings import Settings
from streams.forget import ForgetRuleStore, add_rule, read_rules
from streams.redis_store import RedisPromptStore
from tests.integration.streams_support import PrivateRedis, unique

NS = "ns-wait"


def _publish(settings: Settings, version: int) -> None:
    async def publish() -> None:
        store = RedisPromptStore.from_settings(settings)
        try:
            playbook = Playbook(namespace=NS, version=version)
            assert await store.publish(NS, version, f"prompt v{version}", playbook.model_dump_json())
        finally:
            await store.aclose()

    asyncio.run(publish())


def _publish_later(settings: Settings, version: int, delay_s: float) -> threading.Timer:
    timer = threading.Timer(delay_s, _publish, args=(settings, version))
    timer.start()
    return timer


def test_the_wait_goes_through_nothing_published_and_returns_the_first_newer_version(
    private_redis: PrivateRedis,
) -> None:
    settings = Settings(redis_url=private_redis.url, key_prefix=unique("wait"))
    with prompt_client(settings, NS) as client:
        assert wait_for_version(client, 0, 0.5) is None  # nothing published: waited through, not an error
        later = _publish_later(settings, 1, 0.3)
        assert wait_for_version(client, 0, 30) == 1
        later.join()
        assert wait_for_version(client, 1, 0.5) is None  # v1 is not above 1
        later = _publish_later(settings, 2, 0.3)
        assert wait_for_version(client, 1, 30) == 2
        later.join()


def test_forget_rules_are_kept_under_the_settings_key_prefix(private_redis: PrivateRedis) -> None:
    settings = Settings(redis_url=private_redis.url, key_prefix=unique("forget"))
    other = Settings(redis_url=private_redis.url, key_prefix=unique("forget"))
    rule = ForgetRule(namespace="a", producer="x")
    assert add_rule(settings, rule) == (rule,)
    assert add_rule(settings, rule) == (rule,)  # idempotent
    with ForgetRuleStore.from_settings(settings) as store:
        assert store.keys.forget == f"{settings.key_prefix}:forget"
        assert store.rules() == (rule,) == read_rules(settings)
    assert read_rules(other) == ()
