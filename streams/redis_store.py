"""Redis implementation of the prompt-store port.

:class:`RedisPromptStore` implements :class:`combee.store.PromptStore`. A publish is ONE Lua script
(``EVALSHA``, falling back to ``EVAL`` on ``NOSCRIPT``; no Redis 7 ``FUNCTION`` so Redis 6.2 works) that, in
one atomic step, compares the stored version with the new one and, only if the new one is greater, writes
``current`` and the per-version hash, adds a history entry, trims the history, records the namespace and
announces the version on the ``updates`` channel. Readers (``HMGET`` of one hash) therefore never see a torn
prompt, and the announced versions of a namespace are strictly increasing.

Retention: the newest ``history_limit`` published versions of a namespace (default 1000) each keep a history
entry *and* their per-version hash, so any of them can be read back (rollback, audit). The script deletes a
per-version hash in the same step that trims its history entry, and only those — never one newer than the
trim point — so the two always describe the same set of versions. Nothing here expires except ``status``.

``meta`` is stored whole in the per-version hash (field ``meta``) and, without its ``provenance`` list (the
windows and trace ids a version covers, :mod:`combee.promptdiff`) and its ``evidence`` (per operation, the
traces that taught it and their lessons, :mod:`combee.evidence`), in the history entry, which stays small. The
evidence therefore lives and is trimmed exactly as its version, and a second offer of a version (a
redelivery, a replay of the log) writes nothing: the compare-and-set keeps the first.

The publisher that feeds it is :mod:`streams.redis_publisher`; connections and redaction are
:mod:`streams.redis_connection`; parsing what the script wrote is :mod:`streams.redis_records`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.exceptions
import redis.retry

from combee.errors import ConfigError
from combee.evidence import EVIDENCE_KEY
from combee.models import validate_namespace
from combee.outcomes import OutcomeCounts
from combee.promptdiff import PROVENANCE_KEY, VersionRecord
from combee.redaction import redact
from combee.store import PromptStore, PublishedPrompt
from combee.tokens import estimate_tokens
from streams.keys import RedisKeys
from streams.redis_connection import build_redis, client_secrets
from streams.redis_records import (
    MAX_VERSION,
    RECORD_FIELDS,
    HistoryEntry,
    check_version,
    parse_history,
    parse_prompt_fields,
    parse_version_record,
    reply_text,
)

if TYPE_CHECKING:
    from streams.settings import RedisSettings

__all__ = [
    "DEFAULT_HISTORY_LIMIT",
    "HEALTH_FORGET_S",
    "MAX_TRIM_PER_PUBLISH",
    "PUBLISH_SCRIPT",
    "STATUS_TTL_S",
    "PublishOutcome",
    "RedisPromptStore",
]

DEFAULT_HISTORY_LIMIT: Final = 1000
STATUS_TTL_S: Final = 300
"""Default TTL of the ``status`` key. The learner refreshes it far more often (per window and on a timer);
when the learner dies the status disappears within five minutes instead of claiming health forever."""
HEALTH_FORGET_S: Final = 3600.0
"""A worker's health report older than this is dropped by the next worker that writes one (a worker that stops
cleanly removes its own)."""
MAX_TRIM_PER_PUBLISH: Final = 1000
"""Most per-version hashes one publish deletes, so lowering ``history_limit`` on a long history cannot turn a
publish into a long-running script; the rest is trimmed by the following publishes."""

_FIELDS: Final = ("version", "prompt", "playbook", "window_id", "published_at")
_PER_VERSION: Final = (PROVENANCE_KEY, EVIDENCE_KEY)
"""Keys of ``meta`` kept in the version's hashes only, never in its history entry (they grow with a window)."""

# ---------------------------------------------------------------------------------------------------------
# The publish script
# ---------------------------------------------------------------------------------------------------------

PUBLISH_SCRIPT: Final = """
-- Combee: publish one playbook version of one namespace, atomically, only if it is newer.
-- KEYS[1] current hash  KEYS[2] per-version hash of ARGV[1]  KEYS[3] history zset  KEYS[4] namespaces set
-- ARGV[1] version  ARGV[2] prompt  ARGV[3] playbook JSON  ARGV[4] window id ('' = none)  ARGV[5] published_at
-- ARGV[6] meta JSON  ARGV[7] history entry JSON  ARGV[8] namespace  ARGV[9] updates channel
-- ARGV[10] history limit (>= 1)  ARGV[11] per-version key prefix (prefix .. N = key of version N)
-- ARGV[12] most per-version hashes to delete in this call  ARGV[13] the largest version (2**53 - 1)
-- Returns {1, version, trimmed} when written, {0, stored_version, 0} when not newer (nothing written).
-- A version above ARGV[13], offered or stored (someone wrote Redis by hand), is an error: nothing is written.
-- Per-version keys of trimmed entries are derived from ARGV[11]; they share the namespace's {hash tag}, so
-- they live in the same cluster slot as KEYS[1..3].
local version = tonumber(ARGV[1])
local max_version = tonumber(ARGV[13])
if version == nil or version > max_version then
  return redis.error_reply('ERR combee: version ' .. ARGV[1] .. ' is above the largest version 2**53 - 1')
end
local tampered = 'ERR combee: the stored version of ' .. ARGV[8] .. ' is not a version number in 0..2**53 - 1 '
  .. '(Redis was written outside Combee); `combee prompt repair ' .. ARGV[8] .. '` resets it'
local stored = -1
local raw = redis.call('HGET', KEYS[1], 'version')
if raw then
  stored = tonumber(raw)
  if stored == nil or stored > max_version then
    return redis.error_reply(tampered)
  end
end
-- The history's newest score also counts, so losing `current` alone cannot let an older version back in.
local top = redis.call('ZREVRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if top[2] and tonumber(top[2]) > stored then
  stored = tonumber(top[2])
  if stored > max_version then
    return redis.error_reply(tampered)
  end
end
if stored >= version then
  return {0, stored, 0}
end
local fields = {'version', ARGV[1], 'prompt', ARGV[2], 'playbook', ARGV[3], 'window_id', ARGV[4],
                'published_at', ARGV[5], 'meta', ARGV[6]}
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], unpack(fields))
redis.call('ZADD', KEYS[3], ARGV[1], ARGV[7])
local trimmed = 0
local excess = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[10])
if excess > 0 then
  local n = math.min(excess, tonumber(ARGV[12]))
  local old = redis.call('ZRANGE', KEYS[3], 0, n - 1, 'WITHSCORES')
  for i = 2, #old, 2 do
    redis.call('DEL', ARGV[11] .. string.format('%d', tonumber(old[i])))
  end
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, n - 1)
  trimmed = n
end
redis.call('SADD', KEYS[4], ARGV[8])
redis.call('PUBLISH', ARGV[9], ARGV[1])
return {1, version, trimmed}
"""


def _float_or_zero(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _age(report: Mapping[str, Any], now: float) -> float:
    return now - _float_or_zero(report.get("updated_at"))


_PUBLISH_SHA: Final = hashlib.sha1(PUBLISH_SCRIPT.encode("utf-8")).hexdigest()


def _bullet_count(playbook: Any) -> int | None:
    bullets = playbook.get("bullets") if isinstance(playbook, dict) else None
    return len(bullets) if isinstance(bullets, list) else None


# ---------------------------------------------------------------------------------------------------------
# The store
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublishOutcome:
    """What one publish did. ``stored_version`` is the namespace's version after the call: the new one when
    ``written``, otherwise the (equal or newer) version that was already there. ``trimmed`` counts the old
    versions whose history entry and per-version hash this publish deleted."""

    written: bool
    stored_version: int
    trimmed: int = 0


class RedisPromptStore(PromptStore):
    """:class:`combee.store.PromptStore` on Redis (6.2 or newer, standalone or cluster).

    Key names come from :class:`streams.keys.RedisKeys`; every key of a namespace shares the ``{namespace}``
    hash tag, so the publish script is valid on Redis Cluster. Methods raise
    :class:`~combee.errors.InvalidNamespace` for a bad namespace, ValueError for bad arguments, and
    redis-py's exceptions (``ConnectionError``, ``TimeoutError``, ...; see :func:`is_retryable`) when Redis
    fails — their messages are redacted before they leave this class.
    """

    def __init__(
        self,
        redis: redis.asyncio.Redis,
        keys: RedisKeys | None = None,
        *,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
        status_ttl_s: int = STATUS_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if history_limit < 1:
            raise ValueError("history_limit must be at least 1 (the newest version always stays addressable)")
        if status_ttl_s < 1:
            raise ValueError("status_ttl_s must be at least 1 second")
        self._redis = redis
        self.keys = keys or RedisKeys()
        self.history_limit = history_limit
        self.status_ttl_s = status_ttl_s
        self._clock = clock
        self._secrets = client_secrets(redis)
        if self.keys.version("ns", 0)[:-1] + "1234" != self.keys.version("ns", 1234):
            raise ConfigError("RedisKeys.version(ns, N) must end in N for the publish script to trim old versions")

    @classmethod
    def from_settings(
        cls, settings: RedisSettings, *, client_name: str = "combee", history_limit: int = DEFAULT_HISTORY_LIMIT
    ) -> RedisPromptStore:
        """The store under the settings' key prefix, on an asyncio client of its own (the one way settings become
        a store); :meth:`aclose` closes that client."""
        return cls(
            build_redis(settings, client_name=client_name), RedisKeys(settings.key_prefix), history_limit=history_limit
        )

    @property
    def redis(self) -> redis.asyncio.Redis:
        """The client the store reads and writes with."""
        return self._redis

    async def aclose(self) -> None:
        """Close the store's client (its connection pool)."""
        await self._redis.aclose()

    def __repr__(self) -> str:
        return f"RedisPromptStore(prefix={self.keys.prefix!r}, history_limit={self.history_limit})"

    # -- helpers --------------------------------------------------------------------------------------------

    async def _call(self, awaitable: Awaitable[Any]) -> Any:
        """Await a Redis command; re-raise a Redis failure as the same type with a redacted message."""
        try:
            return await awaitable
        except redis.exceptions.RedisError as exc:
            message = redact(str(exc), self._secrets)
            if message == str(exc):
                raise
            try:
                clean = type(exc)(message)
            except Exception:
                clean = redis.exceptions.RedisError(message)
            raise clean from None

    def _version_key_prefix(self, namespace: str) -> str:
        # The script derives the keys of trimmed versions as prefix .. N; __init__ checked that this matches
        # RedisKeys.version.
        return self.keys.version(namespace, 0)[:-1]

    # -- writes ---------------------------------------------------------------------------------------------

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
        """Store ``version`` if it is newer than the stored one. True when written, False when not newer
        (equal or older: nothing is written, nothing announced — replaying a publish is a no-op).

        Raises ValueError if ``playbook_json`` is not a JSON object, ``meta`` is not JSON-serialisable or the
        version is out of range; InvalidNamespace for a bad namespace; redis-py errors when Redis fails.
        A call that redis-py retried after a lost reply may report False for a write its first attempt made:
        the version is stored either way (:meth:`publish_outcome` tells which version is stored).
        An empty ``window_id`` is recorded as none.
        """
        outcome = await self.publish_outcome(namespace, version, prompt, playbook_json, window_id=window_id, meta=meta)
        return outcome.written

    async def publish_outcome(
        self,
        namespace: str,
        version: int,
        prompt: str,
        playbook_json: str,
        *,
        window_id: str | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> PublishOutcome:
        """:meth:`publish`, telling also which version is stored afterwards and how many old ones were trimmed."""
        validate_namespace(namespace)
        check_version(version)
        try:
            playbook = json.loads(playbook_json)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"playbook_json is not valid JSON: {exc}") from None
        if not isinstance(playbook, dict):
            raise ValueError("playbook_json must encode a JSON object")
        meta = dict(meta or {})
        try:
            meta_json = json.dumps(meta, separators=(",", ":"), sort_keys=True, allow_nan=False, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"meta is not JSON-serialisable: {exc}") from None
        published_at = float(self._clock())
        entry = HistoryEntry(
            version=version,
            window_id=window_id,
            published_at=published_at,
            bullets=_bullet_count(playbook),
            tokens=estimate_tokens(prompt),
            meta={k: v for k, v in meta.items() if k not in _PER_VERSION},  # trace ids, lessons: not in history
        )
        keys = (
            self.keys.current(namespace),
            self.keys.version(namespace, version),
            self.keys.history(namespace),
            self.keys.namespaces,
        )
        args = (
            str(version),
            prompt,
            playbook_json,
            window_id or "",
            repr(published_at),
            meta_json,
            entry.to_json(),
            namespace,
            self.keys.updates(namespace),
            str(self.history_limit),
            self._version_key_prefix(namespace),
            str(MAX_TRIM_PER_PUBLISH),
            str(MAX_VERSION),
        )
        reply = await self._call(self._eval_publish(keys, args))
        written, stored, trimmed = (int(x) for x in reply)
        return PublishOutcome(written=bool(written), stored_version=stored, trimmed=trimmed)

    async def _eval_publish(self, keys: Sequence[str], args: Sequence[str]) -> Any:
        # EVALSHA first: the script body (prompt-independent, ~2 KB) is not resent on every publish. A server
        # that does not know it (restart, SCRIPT FLUSH, failover) answers NOSCRIPT; EVAL then runs *and* caches
        # it in one round trip, with no window for a flush between a SCRIPT LOAD and the retry.
        try:
            return await self._redis.evalsha(_PUBLISH_SHA, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return await self._redis.eval(PUBLISH_SCRIPT, len(keys), *keys, *args)

    async def set_status(self, namespace: str, status: Mapping[str, Any], *, ttl_s: int | None = None) -> None:
        """Store the learner's status for ``namespace`` as a JSON string that expires after ``ttl_s`` seconds
        (default :data:`STATUS_TTL_S`): a status nobody refreshes disappears rather than going stale.
        Raises ValueError when ``status`` is not JSON-serialisable."""
        validate_namespace(namespace)
        try:
            body = json.dumps(dict(status), separators=(",", ":"), sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"status is not JSON-serialisable: {exc}") from None
        ttl = self.status_ttl_s if ttl_s is None else ttl_s
        if ttl < 1:
            raise ValueError("ttl_s must be at least 1 second")
        await self._call(cast(Awaitable[Any], self._redis.set(self.keys.status(namespace), body, ex=ttl)))

    async def mark_seen(self, namespaces: Sequence[str]) -> None:
        """Record that a worker has received traces of ``namespaces`` (the ``seen`` set; never expires), so readers
        can tell a namespace still learning its first version from one nobody has heard of."""
        names = [validate_namespace(ns) for ns in namespaces]
        if names:
            await self._call(cast(Awaitable[Any], self._redis.sadd(self.keys.seen, *names)))

    async def set_health(
        self, worker: str, report: Mapping[str, Any], *, forget_after_s: float = HEALTH_FORGET_S
    ) -> None:
        """Store ``worker``'s health report (JSON with ``updated_at``, wall clock) in the ``health`` hash, and drop
        other workers' reports older than ``forget_after_s`` (workers that died without clearing theirs)."""
        body = json.dumps(dict(report), separators=(",", ":"), sort_keys=True, allow_nan=False)
        now = self._clock()
        entries = await self._health_entries()
        stale = [w for w, r in entries.items() if w != worker and _age(r, now) > forget_after_s]
        await self._call(cast(Awaitable[Any], self._redis.hset(self.keys.health, worker, body)))
        if stale:
            await self._call(cast(Awaitable[Any], self._redis.hdel(self.keys.health, *stale)))

    async def ping(self) -> None:
        """Raise what redis-py raises when Redis does not answer ``PING``."""
        await self._call(cast(Awaitable[Any], self._redis.ping()))

    async def clear_health(self, worker: str) -> None:
        """Remove ``worker``'s health report (it is stopping)."""
        await self._call(cast(Awaitable[Any], self._redis.hdel(self.keys.health, worker)))

    # -- reads ----------------------------------------------------------------------------------------------

    async def _health_entries(self) -> dict[str, dict[str, Any]]:
        raw = await self._call(cast(Awaitable[Any], self._redis.hgetall(self.keys.health)))
        out: dict[str, dict[str, Any]] = {}
        for field_, value in (raw or {}).items():
            worker, body = reply_text(field_), reply_text(value)
            try:
                obj = json.loads(body) if body else None
            except ValueError:
                obj = None
            if worker and isinstance(obj, dict):
                out[worker] = obj
        return out

    async def health_reports(self) -> list[dict[str, Any]]:
        """Every worker's last health report (a JSON object with ``worker``, ``updated_at`` and ``dependencies``),
        newest first. Reports of workers that stopped without clearing theirs stay until another worker forgets
        them; readers judge their age by ``updated_at``."""
        entries = await self._health_entries()
        for worker, report in entries.items():
            report.setdefault("worker", worker)
        return sorted(entries.values(), key=lambda r: -(_float_or_zero(r.get("updated_at"))))

    async def forget_rules(self) -> set[bytes]:
        """The stored forget rules, raw (``combee.forget.parse_rules`` reads them)."""
        return cast(set[bytes], await self._call(cast(Awaitable[Any], self._redis.smembers(self.keys.forget))))

    async def seen_namespaces(self) -> list[str]:
        """Every namespace a worker has received traces of, sorted (published or not)."""
        members = await self._call(cast(Awaitable[Any], self._redis.smembers(self.keys.seen)))
        return sorted(t for t in (reply_text(m) for m in members) if t)

    async def current(self, namespace: str) -> PublishedPrompt | None:
        """The newest published version (read with one HMGET, so never torn), or None if none was published.
        Raises ValueError if the stored hash is malformed (written by something other than the script)."""
        values = await self._call(cast(Awaitable[Any], self._redis.hmget(self.keys.current(namespace), _FIELDS)))
        return parse_prompt_fields(namespace, values)

    async def get_version(self, namespace: str, version: int) -> PublishedPrompt | None:
        """Version ``version`` if it is still retained (one of the newest ``history_limit``), else None."""
        check_version(version)
        key = self.keys.version(namespace, version)
        values = await self._call(cast(Awaitable[Any], self._redis.hmget(key, _FIELDS)))
        return parse_prompt_fields(namespace, values)

    async def version_record(self, namespace: str, version: int) -> VersionRecord | None:
        """Version ``version``'s playbook and provenance (:mod:`combee.promptdiff`), or None when not retained:
        the read of :meth:`streams.client.PromptClient.version_record`, for asyncio callers. Raises ValueError for
        a malformed playbook."""
        check_version(version)
        key = self.keys.version(namespace, version)
        values = await self._call(cast(Awaitable[Any], self._redis.hmget(key, RECORD_FIELDS)))
        return parse_version_record(namespace, values)

    async def history(self, namespace: str, limit: int = 20) -> list[HistoryEntry]:
        """The newest ``limit`` history entries, newest first."""
        if limit < 1:
            return []
        members = await self._call(
            cast(Awaitable[Any], self._redis.zrevrange(self.keys.history(namespace), 0, limit - 1))
        )
        return parse_history(members)

    async def namespaces(self) -> list[str]:
        """Every namespace ever published under this key prefix, sorted."""
        members = await self._call(cast(Awaitable[Any], self._redis.smembers(self.keys.namespaces)))
        return sorted(t for t in (reply_text(m) for m in members) if t)

    async def outcomes(self, namespace: str) -> dict[str, OutcomeCounts]:
        """The outcomes counted per version key (:mod:`streams.redis_outcomes`; empty when none)."""
        from streams.redis_outcomes import RedisOutcomes

        return cast(dict[str, OutcomeCounts], await self._call(RedisOutcomes(self._redis, self.keys).counts(namespace)))

    async def promotion(self, namespace: str, head: int | None, *, decisions: int = 10) -> dict[str, Any]:
        """The namespace's serving state, pending candidate and newest ``decisions``
        (:func:`streams.redis_promotion.promotion_summary`)."""
        from streams.redis_promotion import RedisPromotion, promotion_summary

        summary = promotion_summary(RedisPromotion(self._redis, self.keys), namespace, head, decisions=decisions)
        return cast(dict[str, Any], await self._call(summary))

    async def get_status(self, namespace: str) -> dict[str, Any] | None:
        """The status last set for ``namespace`` (None when absent or expired, or when it is not a JSON object)."""
        raw = await self._call(cast(Awaitable[Any], self._redis.get(self.keys.status(namespace))))
        if raw is None:
            return None
        try:
            obj = json.loads(raw)
        except ValueError:
            return None
        return obj if isinstance(obj, dict) else None
