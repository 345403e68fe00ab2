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
    from streams.settings import RedisSettings

__all__ = ["READ_TIMEOUT_S", "RULES_TTL_S", "CachedRules", "add_rule", "read_rules"]

RULES_TTL_S = 10.0
READ_TIMEOUT_S = 1.0

log = logging.getLogger("combee.forget")


def add_rule(settings: RedisSettings, rule: ForgetRule) -> tuple[ForgetRule, ...]:
    """Record ``rule`` (idempotent) and return every rule now kept."""
    client = build_sync_redis(settings, client_name="combee-forget")
    try:
        key = RedisKeys(settings.key_prefix).forget
        client.sadd(key, rule.encode())
        return parse_rules(cast(set[bytes], client.smembers(key)))
    finally:
        client.close()


def read_rules(settings: RedisSettings) -> tuple[ForgetRule, ...]:
    """Every rule kept under the settings' key prefix."""
    client = build_sync_redis(settings, client_name="combee-forget")
    try:
        return parse_rules(cast(set[bytes], client.smembers(RedisKeys(settings.key_prefix).forget)))
    finally:
        client.close()


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
