"""The serving state and the decision log of a namespace in Redis: three Lua scripts and the readers.

``<prefix>:{NS}:serving`` (a hash; absent means policy ``direct``) says what agents are served
(:class:`combee.serving.Serving`); ``<prefix>:{NS}:decisions`` (a hash, decision id -> JSON) keeps every
decision with its evidence. Each change is one script, so a state change and its record are written together
or not at all, and each bumps ``serial`` and announces the head on the ``updates`` channel so that watching
agents read what they are served again:

* :data:`ENSURE_SCRIPT` writes a default policy when the namespace has none (a worker whose
  ``COMBEE_PROMOTION_POLICY`` is not ``direct`` runs it before every publish: the first candidate never finds
  the namespace without a policy, so it is never served by mistake). The live version is then the head.
* :data:`POLICY_SCRIPT` sets a policy (``combee prompt policy``). Leaving ``direct`` makes the head live.
* :data:`DECIDE_SCRIPT` records a decision and moves the live version / ``rejected_through``, once: a decision
  whose id is recorded already is not applied again, and a decision taken against a live version that has
  changed since (``expect_live``) is refused as stale.

The combiner's publish script (streams/redis_store.py) is untouched: every version is still published, exactly
once, by compare-and-set on the version; only what agents are served moves here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Literal, Protocol, cast

import redis.asyncio
import redis.exceptions

from combee.serving import POLICIES, Policy, Serving, pending_candidate
from streams.keys import RedisKeys
from streams.redis_records import reply_text

__all__ = [
    "DECIDE_SCRIPT",
    "ENSURE_SCRIPT",
    "HOLDOUT_SCRIPT",
    "POLICY_SCRIPT",
    "SERVING_FIELDS",
    "DecideResult",
    "RedisPromotion",
    "WithDefaultPolicy",
    "parse_decisions",
    "parse_serving",
    "promotion_summary",
]

SERVING_FIELDS: Final = ("policy", "live", "previous", "fraction", "rejected_through", "serial")
DecideResult = Literal["done", "exists", "stale"]

ENSURE_SCRIPT: Final = """
-- Combee: give a namespace its default promotion policy if it has none. KEYS[1] serving  KEYS[2] current
-- ARGV[1] policy  ARGV[2] fraction  ARGV[3] set_by  ARGV[4] set_at.  Returns 1 when written, 0 when present.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local head = redis.call('HGET', KEYS[2], 'version') or ''
redis.call('HSET', KEYS[1], 'policy', ARGV[1], 'fraction', ARGV[2], 'live', head, 'previous', '',
           'rejected_through', '0', 'serial', '1', 'set_by', ARGV[3], 'set_at', ARGV[4])
return 1
"""

POLICY_SCRIPT: Final = """
-- Combee: set a namespace's promotion policy.  KEYS[1] serving  KEYS[2] current  KEYS[3] decisions
-- ARGV[1] policy  ARGV[2] fraction  ARGV[3] set_by  ARGV[4] set_at  ARGV[5] decision id  ARGV[6] decision JSON
-- ARGV[7] updates channel.  Leaving 'direct' (or having no state) makes the head live.  Returns the live version.
local head = redis.call('HGET', KEYS[2], 'version') or ''
local was = redis.call('HGET', KEYS[1], 'policy') or 'direct'
local live = redis.call('HGET', KEYS[1], 'live') or ''
if was == 'direct' or ARGV[1] == 'direct' then live = head end
redis.call('HSET', KEYS[1], 'policy', ARGV[1], 'fraction', ARGV[2], 'live', live, 'set_by', ARGV[3],
           'set_at', ARGV[4])
if redis.call('HEXISTS', KEYS[1], 'rejected_through') == 0 then
  redis.call('HSET', KEYS[1], 'rejected_through', '0', 'previous', '')
end
redis.call('HINCRBY', KEYS[1], 'serial', 1)
redis.call('HSET', KEYS[3], ARGV[5], ARGV[6])
if head ~= '' then redis.call('PUBLISH', ARGV[7], head) end
return live
"""

DECIDE_SCRIPT: Final = """
-- Combee: record one decision and apply it to the serving state, once.
-- KEYS[1] serving  KEYS[2] decisions  KEYS[3] current
-- ARGV[1] decision id  ARGV[2] decision JSON  ARGV[3] updates channel  ARGV[4] expected live ('*' = any)
-- ARGV[5] new live ('' = unchanged)  ARGV[6] new rejected_through ('' = unchanged)
-- ARGV[7] a version that must still be above rejected_through ('' = no check)
-- Returns 'exists' (recorded before: nothing done), 'stale' (the state moved on: nothing done) or 'done'.
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 'exists' end
local live = redis.call('HGET', KEYS[1], 'live') or ''
if ARGV[4] ~= '*' and live ~= ARGV[4] then return 'stale' end
if ARGV[7] ~= '' and tonumber(ARGV[7]) <= tonumber(redis.call('HGET', KEYS[1], 'rejected_through') or '0') then
  return 'stale'
end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'live', ARGV[5], 'previous', live) end
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'rejected_through', ARGV[6]) end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HINCRBY', KEYS[1], 'serial', 1) end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
local head = redis.call('HGET', KEYS[3], 'version')
if head then redis.call('PUBLISH', ARGV[3], head) end
return 'done'
"""

HOLDOUT_SCRIPT: Final = """
-- Combee: keep held-out traces as gate validation tasks, at most ARGV[1] per namespace.  KEYS[1] holdout
-- ARGV[2..] pairs of (trace id, task JSON).  A trace kept before is left as it is.  Returns how many were added.
local added = 0
for i = 2, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 0 and redis.call('HLEN', KEYS[1]) < tonumber(ARGV[1]) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    added = added + 1
  end
end
return added
"""

_SHAS: Final = {
    s: hashlib.sha1(s.encode("utf-8")).hexdigest()
    for s in (ENSURE_SCRIPT, POLICY_SCRIPT, DECIDE_SCRIPT, HOLDOUT_SCRIPT)
}


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def parse_serving(values: Sequence[Any]) -> Serving:
    """The serving state from an ``HMGET`` of :data:`SERVING_FIELDS` (all None: the namespace has none, policy
    ``direct``). Raises ValueError for a state no Combee wrote (an unknown policy, a fraction outside [0, 1])."""
    policy, live, previous, fraction, rejected, serial = (reply_text(v) for v in values)
    if policy is None:
        return Serving()
    if policy not in POLICIES:
        raise ValueError(f"unknown promotion policy {policy[:40]!r} in Redis")
    return Serving(
        policy=policy,
        live=_int_or_none(live),
        previous=_int_or_none(previous),
        fraction=float(fraction or 0.0),
        rejected_through=_int_or_none(rejected) or 0,
        serial=_int_or_none(serial) or 0,
    )


def parse_decisions(raw: Mapping[Any, Any]) -> list[dict[str, Any]]:
    """The decisions hash (HGETALL) as records, oldest first; entries that are not JSON objects are skipped."""
    out: list[dict[str, Any]] = []
    for value in raw.values():
        try:
            record = json.loads(reply_text(value) or "")
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return sorted(out, key=lambda r: (float(r.get("at") or 0.0), str(r.get("id"))))


async def promotion_summary(
    promotion: RedisPromotion, namespace: str, head: int | None, *, decisions: int = 5
) -> dict[str, Any]:
    """What agents of ``namespace`` are served (the serving state, and the pending candidate given the ``head``)
    and its newest ``decisions``, oldest first (docs/promotion.md): `combee status` and the web page."""
    serving = await promotion.serving(namespace)
    recorded = await promotion.decisions(namespace)
    candidate = pending_candidate(serving, head)
    return {**dataclasses.asdict(serving), "candidate": candidate, "decisions": recorded[-decisions:]}


class RedisPromotion:
    """Serving state and decisions of every namespace under one key prefix (asyncio client). Methods raise
    redis-py's errors when Redis fails (a script then wrote everything or nothing)."""

    def __init__(self, redis: redis.asyncio.Redis, keys: RedisKeys | None = None) -> None:
        self._redis = redis
        self.keys = keys or RedisKeys()

    async def _script(self, script: str, keys: Sequence[str], args: Sequence[str]) -> Any:
        try:
            return await self._redis.evalsha(_SHAS[script], len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return await self._redis.eval(script, len(keys), *keys, *args)

    async def serving(self, namespace: str) -> Serving:
        values = await cast(Awaitable[Sequence[Any]], self._redis.hmget(self.keys.serving(namespace), SERVING_FIELDS))
        return parse_serving(values)

    async def head(self, namespace: str) -> int | None:
        """The newest published version (None: none)."""
        raw = reply_text(await cast(Awaitable[Any], self._redis.hget(self.keys.current(namespace), "version")))
        return _int_or_none(raw)

    async def decisions(self, namespace: str) -> list[dict[str, Any]]:
        raw = await cast(Awaitable[Mapping[Any, Any]], self._redis.hgetall(self.keys.decisions(namespace)))
        return parse_decisions(raw or {})

    async def decision(self, namespace: str, decision_id: str) -> dict[str, Any] | None:
        raw = await cast(Awaitable[Any], self._redis.hget(self.keys.decisions(namespace), decision_id))
        found = parse_decisions({decision_id: raw}) if raw is not None else []
        return found[0] if found else None

    async def validation(self, namespace: str) -> str | None:
        """The namespace's own validation set for the gate (JSON-lines text), or None: it has none."""
        return reply_text(await cast(Awaitable[Any], self._redis.get(self.keys.validation(namespace))))

    async def set_validation(self, namespace: str, text: str | None) -> None:
        """Keep ``text`` as the namespace's validation set (None: drop it; the workers' default applies)."""
        if text is None:
            await cast(Awaitable[Any], self._redis.delete(self.keys.validation(namespace)))
        else:
            await cast(Awaitable[Any], self._redis.set(self.keys.validation(namespace), text))

    async def hold_out(self, namespace: str, tasks: Mapping[str, str], *, cap: int) -> int:
        """Keep ``tasks`` (trace id -> task JSON) as held-out validation tasks, at most ``cap`` per namespace, each
        once; returns how many were added."""
        if not tasks:
            return 0
        args = [str(cap), *(part for item in sorted(tasks.items()) for part in item)]
        return int(await self._script(HOLDOUT_SCRIPT, (self.keys.holdout(namespace),), args))

    async def held_out(self, namespace: str) -> list[str]:
        """The held-out tasks' JSON, ordered by trace id."""
        raw = await cast(Awaitable[Mapping[Any, Any]], self._redis.hgetall(self.keys.holdout(namespace)))
        return [reply_text(v) or "" for _, v in sorted((reply_text(k) or "", v) for k, v in (raw or {}).items())]

    async def ensure(self, namespace: str, policy: Policy, fraction: float, *, at: float) -> bool:
        """Write ``policy`` as ``namespace``'s policy unless it has one; True when written."""
        keys = (self.keys.serving(namespace), self.keys.current(namespace))
        return bool(await self._script(ENSURE_SCRIPT, keys, (policy, repr(fraction), "default", repr(at))))

    async def set_policy(
        self, namespace: str, policy: Policy, fraction: float, decision: Mapping[str, Any], *, set_by: str, at: float
    ) -> int | None:
        """Set ``namespace``'s policy and record ``decision`` (a ``policy`` decision's JSON, with its ``id``).
        Returns the live version afterwards (None: nothing is live)."""
        keys = (self.keys.serving(namespace), self.keys.current(namespace), self.keys.decisions(namespace))
        args = (policy, repr(fraction), set_by, repr(at), str(decision["id"]), _dump(decision))
        live = reply_text(await self._script(POLICY_SCRIPT, keys, (*args, self.keys.updates(namespace))))
        return _int_or_none(live)

    async def decide(
        self,
        namespace: str,
        decision: Mapping[str, Any],
        *,
        expect_live: int | Literal["*"] | None = "*",
        new_live: int | None = None,
        rejected_through: int | None = None,
        above_rejected: int | None = None,
    ) -> DecideResult:
        """Record ``decision`` (its JSON, with its ``id``) and apply it: serve ``new_live``, reject candidates up
        to ``rejected_through``. Refused as ``stale`` when the live version is not ``expect_live`` (None:
        nothing live; ``*``: any) or ``above_rejected`` is rejected already; ``exists`` when recorded before."""
        expect = "*" if expect_live == "*" else ("" if expect_live is None else str(expect_live))
        keys = (self.keys.serving(namespace), self.keys.decisions(namespace), self.keys.current(namespace))
        args = (
            str(decision["id"]),
            _dump(decision),
            self.keys.updates(namespace),
            expect,
            "" if new_live is None else str(new_live),
            "" if rejected_through is None else str(rejected_through),
            "" if above_rejected is None else str(above_rejected),
        )
        return cast(DecideResult, reply_text(await self._script(DECIDE_SCRIPT, keys, args)))


class _Publishes(Protocol):
    async def publish(
        self,
        namespace: str,
        version: int,
        prompt: str,
        playbook_json: str,
        *,
        window_id: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> bool: ...


class WithDefaultPolicy:
    """A store whose publish first gives the namespace ``policy`` when it has none (:data:`ENSURE_SCRIPT`), so a
    worker whose default policy is not ``direct`` never publishes a first candidate that agents would be served.
    A failure of either step raises, and the publisher retries both."""

    def __init__(
        self, store: _Publishes, promotion: RedisPromotion, policy: Policy, fraction: float,
        clock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self._store, self._promotion, self._policy, self._fraction, self._clock = (
            store, promotion, policy, fraction, clock,
        )  # fmt: skip

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
        await self._promotion.ensure(namespace, self._policy, self._fraction, at=self._clock())
        return await self._store.publish(namespace, version, prompt, playbook_json, window_id=window_id, meta=meta)


def _dump(record: Mapping[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), sort_keys=True, allow_nan=False, default=str)
