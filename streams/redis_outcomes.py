"""Outcomes per version in Redis: one Lua script that counts a batch exactly once, and the readers.

The script is :func:`combee.outcomes.record` done in Redis, in one atomic step: it reads the namespace's live
version and the source partition's mark (the last traces offset counted), counts the observations above the
mark under their version (``unknown`` for a version above the live one), and moves the mark. Offering a batch
again, or one that overlaps what is counted (a restart that re-reads from the committed offset, a zombie's late
write), counts nothing twice. Every key it touches carries the namespace's ``{hash tag}`` (one cluster slot).

Wire format of the ``outcomes`` hash (:class:`streams.keys.RedisKeys`): ``<version>|<field>`` with field one of
``success``, ``failure``, ``unknown`` (integers), ``score_sum`` (a float) and ``score_n`` (an integer).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import redis.asyncio
import redis.exceptions

from combee.outcomes import Observation, OutcomeCounts
from streams.keys import RedisKeys
from streams.redis_records import reply_text

__all__ = ["RECORD_SCRIPT", "RecordResult", "RedisOutcomes", "mark_field", "parse_outcomes"]

RECORD_SCRIPT: Final = """
-- Combee: count a batch of outcome observations of one namespace and one traces partition, exactly once.
-- KEYS[1] outcomes hash  KEYS[2] marks hash  KEYS[3] the namespace's current hash (its live version)
-- ARGV[1] the mark's field (the source partition)  ARGV[2..] per observation, in offset order, four values:
-- offset, version, outcome (success|failure|unknown), score ('' = none)
-- Returns {counted, skipped, mark}. Increments are added up first and written last, so a bad argument leaves
-- nothing half-counted.
local raw = redis.call('HGET', KEYS[3], 'version')
local live = raw and tonumber(raw) or nil
local stored = redis.call('HGET', KEYS[2], ARGV[1])
local mark = stored and tonumber(stored) or -1
local ints, floats = {}, {}
local counted, skipped = 0, 0
for i = 2, #ARGV, 4 do
  local offset, version = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  local outcome, score = ARGV[i + 2], ARGV[i + 3]
  if offset == nil or version == nil or (outcome ~= 'success' and outcome ~= 'failure' and outcome ~= 'unknown') then
    return redis.error_reply('ERR combee: malformed observation at argument ' .. i)
  end
  if offset > mark then
    local key = ARGV[i + 1]
    if live == nil or version > live then key = 'unknown' end
    ints[key .. '|' .. outcome] = (ints[key .. '|' .. outcome] or 0) + 1
    if score ~= '' then
      floats[key .. '|score_sum'] = (floats[key .. '|score_sum'] or 0) + tonumber(score)
      ints[key .. '|score_n'] = (ints[key .. '|score_n'] or 0) + 1
    end
    mark = offset
    counted = counted + 1
  else
    skipped = skipped + 1
  end
end
for f, n in pairs(ints) do redis.call('HINCRBY', KEYS[1], f, n) end
for f, x in pairs(floats) do redis.call('HINCRBYFLOAT', KEYS[1], f, string.format('%.17g', x)) end
if counted > 0 then redis.call('HSET', KEYS[2], ARGV[1], string.format('%d', mark)) end
return {counted, skipped, string.format('%d', mark)}
"""
_RECORD_SHA: Final = hashlib.sha1(RECORD_SCRIPT.encode("utf-8")).hexdigest()
_INT_FIELDS: Final = {"success": "success", "failure": "failure", "unknown": "unknown", "score_n": "score_count"}


def mark_field(partition: int) -> str:
    """The field of the marks hash that holds ``partition``'s last counted offset."""
    return f"p{int(partition)}"


@dataclass(frozen=True)
class RecordResult:
    """What one call counted: ``counted`` observations above the mark, ``skipped`` at or below it (counted
    before), and the partition's mark afterwards."""

    counted: int
    skipped: int
    mark: int


def parse_outcomes(raw: Mapping[Any, Any]) -> dict[str, OutcomeCounts]:
    """The ``outcomes`` hash (HGETALL) as counts per version key. Fields it does not know, or values that are
    not numbers (Redis written by hand), are skipped rather than trusted."""
    fields: dict[str, dict[str, Any]] = {}
    for f, v in raw.items():
        name, value = reply_text(f) or "", reply_text(v) or ""
        key, _, what = name.rpartition("|")
        if not key or (what not in _INT_FIELDS and what != "score_sum"):
            continue
        try:
            number: float | int = float(value) if what == "score_sum" else int(value)
        except ValueError:
            continue
        fields.setdefault(key, {})["score_sum" if what == "score_sum" else _INT_FIELDS[what]] = number
    return {key: OutcomeCounts(**values) for key, values in fields.items()}


def _args(observations: Sequence[Observation]) -> list[str]:
    out: list[str] = []
    for o in sorted(observations, key=lambda o: o.offset):
        out += [str(o.offset), str(o.version), o.outcome, "" if o.score is None else repr(float(o.score))]
    return out


class RedisOutcomes:
    """The outcome counts of every namespace under one key prefix (asyncio client)."""

    def __init__(self, redis: redis.asyncio.Redis, keys: RedisKeys | None = None) -> None:
        self._redis = redis
        self.keys = keys or RedisKeys()

    async def record(self, namespace: str, partition: int, observations: Sequence[Observation]) -> RecordResult:
        """Count ``observations`` (of ``namespace``, from traces partition ``partition``) exactly once.
        Raises redis-py's errors when Redis fails (nothing is counted then, or everything is)."""
        if not observations:
            return RecordResult(0, 0, -1)
        keys = (self.keys.outcomes(namespace), self.keys.outcome_marks(namespace), self.keys.current(namespace))
        args = (mark_field(partition), *_args(observations))
        try:
            reply = await self._redis.evalsha(_RECORD_SHA, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            reply = await self._redis.eval(RECORD_SCRIPT, len(keys), *keys, *args)
        counted, skipped, mark = (int(x) for x in reply)
        return RecordResult(counted, skipped, mark)

    async def counts(self, namespace: str) -> dict[str, OutcomeCounts]:
        """``namespace``'s counts per version key (empty when nothing is counted)."""
        raw = await cast(Awaitable[Any], self._redis.hgetall(self.keys.outcomes(namespace)))
        return parse_outcomes(raw or {})
