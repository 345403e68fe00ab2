"""``combee prompt repair NS``: undo a version number written to Redis outside Combee.

Someone with write access to Redis can store a version above 2**53 - 1 (or one that is not a number) in a
namespace's ``current`` hash or history. The publish script then refuses every later publish and rollback
(:mod:`streams.redis_store`), and clients do not adopt it (:mod:`streams.client`). :func:`repair_namespace`
removes the history entries above the largest version and, in the same atomic step, makes ``current`` the
highest valid version still stored (a copy of its per-version hash), or deletes it when there is none. A
valid ``current`` at or above that version is left as it is. Nothing is announced: clients already hold a
version at least as new.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import redis.asyncio

from streams.keys import RedisKeys
from streams.redis_records import MAX_VERSION

__all__ = ["REPAIR_SCRIPT", "RepairOutcome", "repair_namespace"]

REPAIR_SCRIPT: Final = """
-- Combee: reset a namespace's current version to the highest valid one stored.
-- KEYS[1] current hash  KEYS[2] history zset  ARGV[1] the largest version  ARGV[2] per-version key prefix
-- Returns {reset (0/1), version now current (-1: none), history entries removed}.
local max_version = tonumber(ARGV[1])
local removed = redis.call('ZREMRANGEBYSCORE', KEYS[2], '(' .. ARGV[1], '+inf')
local best, best_key = -1, nil
local held = redis.call('ZREVRANGEBYSCORE', KEYS[2], ARGV[1], 0, 'WITHSCORES')
for i = 2, #held, 2 do
  local v = tonumber(held[i])
  local key = ARGV[2] .. string.format('%d', v)
  if v == math.floor(v) and tonumber(redis.call('HGET', key, 'version')) == v then
    best, best_key = v, key
    break
  end
end
local current = tonumber(redis.call('HGET', KEYS[1], 'version') or '')
if current ~= nil and current >= 0 and current <= max_version and current == math.floor(current)
   and current >= best then
  return {0, current, removed}
end
redis.call('DEL', KEYS[1])
if best_key == nil then
  return {1, -1, removed}
end
redis.call('HSET', KEYS[1], unpack(redis.call('HGETALL', best_key)))
return {1, best, removed}
"""


@dataclass(frozen=True)
class RepairOutcome:
    """What a repair did: ``reset`` when ``current`` was rewritten (or deleted), ``version`` the version now
    current (None: no valid version is stored), ``removed`` the history entries above the largest version."""

    reset: bool
    version: int | None
    removed: int


async def repair_namespace(redis_client: redis.asyncio.Redis, keys: RedisKeys, namespace: str) -> RepairOutcome:
    """Reset ``namespace``'s current version to the highest valid stored one (module docstring), atomically.
    Raises InvalidNamespace for a bad namespace, redis-py errors when Redis fails."""
    prefix = keys.version(namespace, 0)[:-1]  # the store checks that RedisKeys.version(ns, N) ends in N
    reply: Any = await redis_client.eval(
        REPAIR_SCRIPT, 2, keys.current(namespace), keys.history(namespace), str(MAX_VERSION), prefix
    )
    reset, version, removed = (int(x) for x in reply)
    return RepairOutcome(reset=bool(reset), version=version if version >= 0 else None, removed=removed)
