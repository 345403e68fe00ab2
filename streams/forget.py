"""Where forget rules (:mod:`combee.forget`) are kept: one Redis set, ``<prefix>:forget``, of canonical JSON rules.

Read by the window stage (cached for :data:`RULES_TTL_S`, so a new rule applies within that long) and by replay;
written by ``combee traces forget``. Nothing here deletes records from Kafka: see docs/security.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from combee.forget import ForgetRule, parse_rules
from streams.keys import RedisKeys
from streams.redis_connection import build_sync_redis

if TYPE_CHECKING:
    import redis

    from streams.settings import RedisSettings

__all__ = ["READ_TIMEOUT_S", "RULES_TTL_S", "CachedRules", "ForgetRuleStore", "add_rule", "read_rules"]

RULES_TTL_S = 10.0
READ_TIMEOUT_S = 1.0

log = logging.getLogger("combee.forget")


class ForgetRuleStore:
    """The blocking side of the rules (``combee traces forget``, replay): the set under a key prefix, on a client of
    its own. Build it with :meth:`from_settings`; close it (or use it as a context manager) when done."""

    def __init__(self, client: redis.Redis, keys: RedisKeys) -> None:
        self._client = client
        self.keys = keys

    @classmethod
    def from_settings(cls, settings: RedisSettings, *, client_name: str = "combee-forget") -> ForgetRuleStore:
        """The rules under the settings' key prefix, on a blocking client of their own (the one way settings become
        this store, as :meth:`streams.redis_store.RedisPromptStore.from_settings` is for the asyncio side)."""
        return cls(build_sync_redis(settings, client_name=client_name), RedisKeys(settings.key_prefix))

    def add(self, rule: ForgetRule) -> tuple[ForgetRule, ...]:
        """Record ``rule`` (idempotent) and return every rule now kept."""
        self._client.sadd(self.keys.forget, rule.encode())
        return self.rules()

    def rules(self) -> tuple[ForgetRule, ...]:
        """Every rule kept."""
        return parse_rules(cast(set[bytes], self._client.smembers(self.keys.forget)))

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> ForgetRuleStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def add_rule(settings: RedisSettings, rule: ForgetRule) -> tuple[ForgetRule, ...]:
    """Record ``rule`` (idempotent) and return every rule now kept."""
    with ForgetRuleStore.from_settings(settings) as store:
        return store.add(rule)


def read_rules(settings: RedisSettings) -> tuple[ForgetRule, ...]:
    """Every rule kept under the settings' key prefix."""
    with ForgetRuleStore.from_settings(settings) as store:
        return store.rules()


class CachedRules:
    """The rules as a worker sees them: read through ``load`` at most every ``ttl_s`` seconds (``clock`` is
    injected), each read bounded by ``read_timeout_s`` so an unreachable Redis delays the window stage by at most
    that once per ``ttl_s``. A failed read keeps the rules read last (Redis down must not stop learning) and is
    retried at the next expiry."""

    def __init__(
        self,
        load: Callable[[], Awaitable[Any]],
        clock: Callable[[], float],
        ttl_s: float = RULES_TTL_S,
        read_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self._load = load
        self._clock = clock
        self._ttl_s = ttl_s
        self._read_timeout_s = read_timeout_s
        self._rules: tuple[ForgetRule, ...] = ()
        self._read_at: float | None = None

    async def rules(self) -> tuple[ForgetRule, ...]:
        now = self._clock()
        if self._read_at is None or now - self._read_at >= self._ttl_s:
            self._read_at = now
            try:
                self._rules = parse_rules(await asyncio.wait_for(self._load(), self._read_timeout_s))
            except Exception as exc:  # the rules read last stay in force (Redis down must not stop learning)
                log.warning("could not read the forget rules (%s); keeping the %d read before", exc, len(self._rules))
        return self._rules
