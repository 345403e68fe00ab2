"""Redis implementation of the prompt-store port, its connection factory, and a publisher that never blocks.

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

:class:`LatestVersionPublisher` sits between a learner and the store: ``offer()`` returns at once and keeps
only the newest pending version per namespace; a background loop publishes, backing off (capped exponential,
jittered) while Redis is unreachable, so learning never waits for Redis and, once Redis is back, the newest
version lands and the superseded ones are skipped.

:func:`build_redis` / :func:`build_sync_redis` make clients from :class:`combee.settings.Settings` with TLS,
credentials, timeouts and health checks. Secrets never appear in messages this module produces.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, cast
from urllib.parse import unquote

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.exceptions
import redis.retry
from pydantic import SecretStr
from redis.backoff import ExponentialWithJitterBackoff

from combee.errors import ConfigError
from combee.models import validate_namespace
from combee.settings import redact_url
from combee.store import PromptStore, PublishedPrompt
from combee.tokens import estimate_tokens
from streams.keys import RedisKeys

if TYPE_CHECKING:
    from combee.settings import Settings

__all__ = [
    "DEFAULT_HISTORY_LIMIT",
    "MAX_VERSION",
    "PUBLISH_SCRIPT",
    "STATUS_TTL_S",
    "HistoryEntry",
    "LatestVersionPublisher",
    "PublishOutcome",
    "PublisherStats",
    "RedisOptions",
    "RedisPromptStore",
    "SupportsPublish",
    "build_redis",
    "build_sync_redis",
    "is_retryable",
    "redact",
]

log = logging.getLogger(__name__)

DEFAULT_HISTORY_LIMIT: Final = 1000
STATUS_TTL_S: Final = 300
"""Default TTL of the ``status`` key. The learner refreshes it far more often (per window and on a timer);
when the learner dies the status disappears within five minutes instead of claiming health forever."""
MAX_TRIM_PER_PUBLISH: Final = 1000
"""Most per-version hashes one publish deletes, so lowering ``history_limit`` on a long history cannot turn a
publish into a long-running script; the rest is trimmed by the following publishes."""
MAX_VERSION: Final = 2**53 - 1
"""Versions are compared inside Lua, whose numbers are doubles: integers are exact up to 2**53."""

_FIELDS: Final = ("version", "prompt", "playbook", "window_id", "published_at")

# ---------------------------------------------------------------------------------------------------------
# The publish script
# ---------------------------------------------------------------------------------------------------------

PUBLISH_SCRIPT: Final = """
-- Combee: publish one playbook version of one namespace, atomically, only if it is newer.
-- KEYS[1] current hash  KEYS[2] per-version hash of ARGV[1]  KEYS[3] history zset  KEYS[4] namespaces set
-- ARGV[1] version  ARGV[2] prompt  ARGV[3] playbook JSON  ARGV[4] window id ('' = none)  ARGV[5] published_at
-- ARGV[6] meta JSON  ARGV[7] history entry JSON  ARGV[8] namespace  ARGV[9] updates channel
-- ARGV[10] history limit (>= 1)  ARGV[11] per-version key prefix (prefix .. N = key of version N)
-- ARGV[12] most per-version hashes to delete in this call
-- Returns {1, version, trimmed} when written, {0, stored_version, 0} when not newer (nothing written).
-- Per-version keys of trimmed entries are derived from ARGV[11]; they share the namespace's {hash tag}, so
-- they live in the same cluster slot as KEYS[1..3].
local version = tonumber(ARGV[1])
local stored = -1
local raw = redis.call('HGET', KEYS[1], 'version')
if raw then
  stored = tonumber(raw)
  if stored == nil then
    return redis.error_reply('ERR combee: corrupt version field in ' .. KEYS[1])
  end
end
-- The history's newest score also counts, so losing `current` alone cannot let an older version back in.
local top = redis.call('ZREVRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if top[2] and tonumber(top[2]) > stored then
  stored = tonumber(top[2])
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

_PUBLISH_SHA: Final = hashlib.sha1(PUBLISH_SCRIPT.encode("utf-8")).hexdigest()

# ---------------------------------------------------------------------------------------------------------
# Redaction and error classes
# ---------------------------------------------------------------------------------------------------------

_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<creds>[^/@\s]+)@")


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every ``secret`` (non-empty) and every URL password (``scheme://user:pw@``) masked as ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")

    def mask(m: re.Match[str]) -> str:
        creds = m.group("creds")
        user = creds.split(":", 1)[0] if ":" in creds else ""
        return f"{m.group('scheme')}{user}:***@" if user else f"{m.group('scheme')}***@"

    return _URL_CREDENTIALS.sub(mask, text)


def _describe_error(exc: BaseException, secrets: Iterable[str | None] = ()) -> str:
    return redact(f"{type(exc).__name__}: {exc}", secrets)


_RETRYABLE_REPLY_PREFIXES: Final = ("BUSY", "LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "OOM")


def is_retryable(exc: BaseException) -> bool:
    """True for failures that go away by themselves: Redis unreachable, timing out, loading, read-only replica,
    busy with a script, out of memory. False for everything else (bad arguments, a broken script, a bug)."""
    if isinstance(
        exc,
        redis.exceptions.ConnectionError  # includes BusyLoadingError, AuthenticationError, MaxConnectionsError
        | redis.exceptions.TimeoutError
        | redis.exceptions.ReadOnlyError
        | redis.exceptions.OutOfMemoryError
        | OSError,  # includes the builtin ConnectionError and TimeoutError (= asyncio.TimeoutError on 3.11)
    ):
        return True
    if isinstance(exc, redis.exceptions.ResponseError):
        return str(exc).startswith(_RETRYABLE_REPLY_PREFIXES)
    return False


# ---------------------------------------------------------------------------------------------------------
# Connections
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class RedisOptions:
    """Where and how to connect: the Redis fields of :class:`~combee.settings.Settings`, without the rest.

    ``url`` is ``redis://``, ``rediss://`` (TLS) or ``unix://``. Credentials may be in the URL *or* in
    ``username``/``password``, not both. ``ssl_ca_certs`` turns TLS on (and verifies the server against that CA).
    ``repr()`` never shows the password.
    """

    url: str = "redis://127.0.0.1:6379/0"
    username: str | None = None
    password: SecretStr | None = None
    ssl_ca_certs: Path | None = None
    key_prefix: str = "combee"

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisOptions:
        return cls(
            url=settings.redis_url,
            username=settings.redis_username,
            password=settings.redis_password,
            ssl_ca_certs=settings.redis_ssl_ca_certs,
            key_prefix=settings.key_prefix,
        )

    @classmethod
    def coerce(cls, source: Settings | RedisOptions | str) -> RedisOptions:
        """Accept a URL, a Settings object or RedisOptions."""
        if isinstance(source, RedisOptions):
            return source
        if isinstance(source, str):
            return cls(url=source)
        return cls.from_settings(source)

    def __repr__(self) -> str:
        return (
            f"RedisOptions(url={self.safe_url!r}, username={self.username!r}, "
            f"password={'***' if self.password is not None else None}, ssl_ca_certs={self.ssl_ca_certs!r}, "
            f"key_prefix={self.key_prefix!r})"
        )

    @property
    def safe_url(self) -> str:
        """The URL with any password masked: fit for logs and messages."""
        return redact_url(self.url)

    def secrets(self) -> tuple[str, ...]:
        """Every secret these options carry (for redaction): the password field and a password in the URL."""
        out: list[str] = []
        if self.password is not None and self.password.get_secret_value():
            out.append(self.password.get_secret_value())
        m = _URL_CREDENTIALS.search(self.url)
        if m and ":" in m.group("creds"):
            raw = m.group("creds").split(":", 1)[1]
            out.extend(s for s in {raw, unquote(raw)} if s)
        return tuple(out)

    def client_kwargs(
        self,
        *,
        socket_timeout_s: float,
        connect_timeout_s: float,
        health_check_interval_s: int,
        client_name: str,
    ) -> tuple[str, dict[str, Any]]:
        """``(url, kwargs)`` for ``Redis.from_url``; raises ConfigError (with a redacted message) when the
        options contradict each other."""
        url = self.url
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        if scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(f"Redis URL {self.safe_url!r} must start with redis://, rediss:// or unix://")
        tls = scheme == "rediss" or self.ssl_ca_certs is not None
        if tls and scheme == "unix":
            raise ConfigError("a Redis CA certificate (TLS) was given for a unix:// socket URL")
        if tls and scheme == "redis":
            url = "rediss://" + url.split("://", 1)[1]  # a CA means TLS; redis-py picks TLS from the scheme
        m = _URL_CREDENTIALS.search(url)
        url_has_password = bool(m and ":" in m.group("creds"))
        if url_has_password and self.password is not None:
            raise ConfigError(
                "the Redis password is given twice (in COMBEE_REDIS_URL and in COMBEE_REDIS_PASSWORD); keep one"
            )
        kwargs: dict[str, Any] = {
            "socket_timeout": socket_timeout_s,
            "socket_connect_timeout": connect_timeout_s,
            "socket_keepalive": True,
            "health_check_interval": health_check_interval_s,
            "decode_responses": True,
            "client_name": client_name,
            # RESP2 on purpose: works with every Redis >= 2.6 and Redis-compatible server, and the replies this
            # module parses (EVAL arrays, HMGET, ZRANGE) are the same shape either way.
            "protocol": 2,
        }
        if self.username is not None:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password.get_secret_value()
        if tls:
            kwargs["ssl_cert_reqs"] = "required"
            if self.ssl_ca_certs is not None:
                if not self.ssl_ca_certs.is_file():
                    raise ConfigError(f"Redis CA certificate file {str(self.ssl_ca_certs)!r} does not exist")
                kwargs["ssl_ca_certs"] = str(self.ssl_ca_certs)
        return url, kwargs


def build_redis(
    settings: Settings | RedisOptions | str,
    *,
    socket_timeout_s: float = 5.0,
    connect_timeout_s: float = 2.0,
    retries: int = 2,
    health_check_interval_s: int = 30,
    client_name: str = "combee",
) -> redis.asyncio.Redis:
    """An asyncio Redis client for the learner side (the store, the publisher).

    Strings come back decoded (``decode_responses=True``). A command that fails with a connection error or
    timeout is retried ``retries`` times (jittered exponential backoff, 50 ms to 1 s) before it raises; a
    connection idle for ``health_check_interval_s`` is PINGed before reuse. Nothing connects until the first
    command. Raises ConfigError for an unusable URL/TLS/credential combination; the message never holds a secret.
    """
    options = RedisOptions.coerce(settings)
    url, kwargs = options.client_kwargs(
        socket_timeout_s=socket_timeout_s,
        connect_timeout_s=connect_timeout_s,
        health_check_interval_s=health_check_interval_s,
        client_name=client_name,
    )
    kwargs["retry"] = redis.asyncio.retry.Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), retries)
    try:
        return redis.asyncio.Redis.from_url(url, **kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"bad Redis URL {options.safe_url!r}: {redact(str(exc), options.secrets())}") from None


def build_sync_redis(
    settings: Settings | RedisOptions | str,
    *,
    socket_timeout_s: float = 5.0,
    connect_timeout_s: float = 2.0,
    retries: int = 2,
    health_check_interval_s: int = 30,
    client_name: str = "combee",
) -> redis.Redis:
    """The blocking twin of :func:`build_redis` (same options, same guarantees) for agents and tools."""
    options = RedisOptions.coerce(settings)
    url, kwargs = options.client_kwargs(
        socket_timeout_s=socket_timeout_s,
        connect_timeout_s=connect_timeout_s,
        health_check_interval_s=health_check_interval_s,
        client_name=client_name,
    )
    kwargs["retry"] = redis.retry.Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), retries)
    try:
        return redis.Redis.from_url(url, **kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"bad Redis URL {options.safe_url!r}: {redact(str(exc), options.secrets())}") from None


def _client_secrets(client: Any) -> tuple[str, ...]:
    """The password a redis-py client authenticates with, if any (to keep it out of messages)."""
    pool = getattr(client, "connection_pool", None)
    conn_kwargs = getattr(pool, "connection_kwargs", None) or {}
    password = conn_kwargs.get("password")
    return (password,) if isinstance(password, str) and password else ()


# ---------------------------------------------------------------------------------------------------------
# Parsing what the script wrote (shared with streams.client)
# ---------------------------------------------------------------------------------------------------------


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def _float_or_none(value: Any) -> float | None:
    text = _text(value)
    if not text:
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def parse_prompt_fields(namespace: str, values: Sequence[Any]) -> PublishedPrompt | None:
    """A PublishedPrompt from an ``HMGET <hash> version prompt playbook window_id published_at`` reply, or
    None when the hash does not exist. Raises ValueError when the hash exists but is malformed."""
    version, prompt, playbook, window_id, published_at = (_text(v) for v in values)
    if version is None:
        return None
    if prompt is None or playbook is None:
        raise ValueError(f"prompt hash of namespace {namespace!r} version {version} is missing fields")
    return PublishedPrompt(
        namespace=namespace,
        version=int(version),
        prompt=prompt,
        playbook_json=playbook,
        window_id=window_id or None,
        published_at=_float_or_none(published_at),
    )


@dataclass(frozen=True)
class HistoryEntry:
    """One published version as the history remembers it (the compact summary, not the prompt itself).

    ``bullets`` is the playbook's bullet count and ``tokens`` the prompt's estimated token count at publish time
    (None when unknown). ``meta`` is what the publisher passed (window stats, trace counts, ...).
    """

    version: int
    window_id: str | None = None
    published_at: float | None = None
    bullets: int | None = None
    tokens: int | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        body: dict[str, Any] = {"version": self.version}
        if self.window_id is not None:
            body["window_id"] = self.window_id
        if self.published_at is not None:
            body["published_at"] = self.published_at
        if self.bullets is not None:
            body["bullets"] = self.bullets
        if self.tokens is not None:
            body["tokens"] = self.tokens
        if self.meta:
            body["meta"] = dict(self.meta)
        return json.dumps(body, separators=(",", ":"), sort_keys=True, allow_nan=False, ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: str | bytes) -> HistoryEntry:
        """Parse a history member; raises ValueError when it is not a summary this module wrote."""
        obj = json.loads(raw)
        if not isinstance(obj, dict) or not isinstance(obj.get("version"), int):
            raise ValueError("history entry is not an object with an integer version")
        meta = obj.get("meta") or {}
        return cls(
            version=obj["version"],
            window_id=obj.get("window_id"),
            published_at=obj.get("published_at"),
            bullets=obj.get("bullets"),
            tokens=obj.get("tokens"),
            meta=meta if isinstance(meta, dict) else {},
        )


def parse_history(members: Iterable[Any]) -> list[HistoryEntry]:
    """Parse history members in the given order, skipping (and logging) any that are not valid summaries."""
    out: list[HistoryEntry] = []
    for member in members:
        raw = _text(member[0] if isinstance(member, list | tuple) else member) or ""
        try:
            out.append(HistoryEntry.from_json(raw))
        except (ValueError, TypeError):
            log.warning("skipping a malformed history entry: %.120r", raw)
    return out


def _bullet_count(playbook: Any) -> int | None:
    bullets = playbook.get("bullets") if isinstance(playbook, dict) else None
    return len(bullets) if isinstance(bullets, list) else None


def _check_version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= MAX_VERSION:
        raise ValueError(f"version must be an integer in [0, 2**53 - 1], got {version!r}")
    return version


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
        self._secrets = _client_secrets(redis)
        if self.keys.version("ns", 0)[:-1] + "1234" != self.keys.version("ns", 1234):
            raise ConfigError("RedisKeys.version(ns, N) must end in N for the publish script to trim old versions")

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
        _check_version(version)
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
            meta=meta,
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

    # -- reads ----------------------------------------------------------------------------------------------

    async def current(self, namespace: str) -> PublishedPrompt | None:
        """The newest published version (read with one HMGET, so never torn), or None if none was published.
        Raises ValueError if the stored hash is malformed (written by something other than the script)."""
        values = await self._call(cast(Awaitable[Any], self._redis.hmget(self.keys.current(namespace), _FIELDS)))
        return parse_prompt_fields(namespace, values)

    async def get_version(self, namespace: str, version: int) -> PublishedPrompt | None:
        """Version ``version`` if it is still retained (one of the newest ``history_limit``), else None."""
        _check_version(version)
        key = self.keys.version(namespace, version)
        values = await self._call(cast(Awaitable[Any], self._redis.hmget(key, _FIELDS)))
        return parse_prompt_fields(namespace, values)

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
        return sorted(t for t in (_text(m) for m in members) if t)

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


# ---------------------------------------------------------------------------------------------------------
# The never-blocking publisher
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Offer:
    namespace: str
    version: int
    prompt: str
    playbook_json: str
    window_id: str | None
    meta: dict[str, Any] | None


@dataclass(frozen=True)
class PublisherStats:
    """A snapshot of :class:`LatestVersionPublisher`'s counters.

    ``published``: versions the store wrote. ``skipped_not_newer``: publishes the store refused because it
    already held that version or a newer one. ``superseded``: offers replaced by a newer offer before they were
    published (or older than one already published). ``failures``: failed publish attempts (each retry counts).
    ``dropped``: offers abandoned after a non-retryable error. ``pending``: namespaces with a version waiting.
    """

    published: int
    skipped_not_newer: int
    superseded: int
    failures: int
    dropped: int
    pending: int
    last_error: str | None


class SupportsPublish(Protocol):
    """The one method of :class:`combee.store.PromptStore` that :class:`LatestVersionPublisher` needs."""

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


class LatestVersionPublisher:
    """Publish the newest version per namespace in the background; never make the caller wait for Redis.

    ``offer()`` is synchronous and O(1): it records the version as pending unless a newer one is already
    pending or published (older offers are superseded). :meth:`run` (or :meth:`start`) publishes pending
    versions, namespaces in sorted order. A retryable failure (:func:`is_retryable`: Redis down, timing out,
    loading, read-only, ...) keeps the version pending — unless a newer one arrived meanwhile — and sleeps a
    capped exponential backoff with jitter: ``d = min(cap, base * 2**(n-1))`` after the n-th consecutive
    failure, slept as a uniform draw from ``[d/2, d]``. Any other error drops that offer (counted, logged) so a
    bad version cannot wedge the loop. ``sleep`` and ``rng`` are injectable for tests.

    Not thread-safe: call ``offer()`` from the event loop that runs :meth:`run`.
    """

    def __init__(
        self,
        store: SupportsPublish,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        rng: random.Random | None = None,
        backoff_base_s: float = 0.2,
        backoff_cap_s: float = 30.0,
        secrets: Iterable[str] = (),
    ) -> None:
        if backoff_base_s <= 0 or backoff_cap_s < backoff_base_s:
            raise ValueError("need 0 < backoff_base_s <= backoff_cap_s")
        self._store = store
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._base = backoff_base_s
        self._cap = backoff_cap_s
        self._secrets = tuple(secrets)  # RedisPromptStore redacts its own errors; these are extra ones
        self._pending: dict[str, _Offer] = {}
        self._inflight: _Offer | None = None
        self._last_published: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._consecutive_failures = 0
        self.published = 0
        self.skipped_not_newer = 0
        self.superseded = 0
        self.failures = 0
        self.dropped = 0
        self.last_error: str | None = None

    # -- producer side ----------------------------------------------------------------------------------------

    def offer(
        self,
        namespace: str,
        version: int,
        prompt: str,
        playbook_json: str,
        *,
        window_id: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> bool:
        """Queue ``version`` for publishing; returns at once. True if it is now the pending version of its
        namespace, False if superseded on arrival (a newer version is pending or already published).
        Raises InvalidNamespace / ValueError for a bad namespace or version (a caller bug, not a Redis issue)."""
        validate_namespace(namespace)
        _check_version(version)
        waiting = self._pending.get(namespace)
        if (waiting is not None and waiting.version >= version) or self._last_published.get(namespace, -1) >= version:
            self.superseded += 1
            return False
        if waiting is not None:
            self.superseded += 1
        self._pending[namespace] = _Offer(
            namespace, version, prompt, playbook_json, window_id, dict(meta) if meta is not None else None
        )
        self._idle.clear()
        self._wake.set()
        return True

    @property
    def pending(self) -> int:
        """Namespaces with a version waiting to be published (an in-flight publish counts)."""
        return len(self._pending) + (
            1 if self._inflight is not None and self._inflight.namespace not in self._pending else 0
        )

    def forget_published(self, namespace: str) -> None:
        """Forget which version of ``namespace`` was published, so the next offer of it is published again
        (the store lost it: a Redis restarted without persistence). The store's compare-and-set still refuses
        anything not newer than what it holds."""
        self._last_published.pop(namespace, None)

    def pending_version(self, namespace: str) -> int | None:
        """The version waiting for ``namespace`` (None when nothing is pending for it)."""
        offer = self._pending.get(namespace)
        return offer.version if offer is not None else None

    def stats(self) -> PublisherStats:
        return PublisherStats(
            published=self.published,
            skipped_not_newer=self.skipped_not_newer,
            superseded=self.superseded,
            failures=self.failures,
            dropped=self.dropped,
            pending=self.pending,
            last_error=self.last_error,
        )

    # -- the loop ---------------------------------------------------------------------------------------------

    def backoff_s(self, consecutive_failures: int) -> float:
        """The jittered delay after the n-th consecutive failure (n >= 1)."""
        exponent = min(max(consecutive_failures, 1) - 1, 60)
        ceiling = min(self._cap, self._base * 2.0**exponent)
        return ceiling / 2 + self._rng.random() * ceiling / 2

    async def run(self, *, until_idle: bool = False) -> None:
        """Publish pending versions until cancelled, or — with ``until_idle`` — until nothing is pending
        (the bounded mode for tests and tools; it keeps retrying while Redis is down)."""
        while True:
            if not self._pending:
                self._idle.set()
                if until_idle:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._publish_one(self._pending.pop(min(self._pending)))

    async def _publish_one(self, offer: _Offer) -> None:
        self._inflight = offer
        try:
            written = await self._store.publish(
                offer.namespace,
                offer.version,
                offer.prompt,
                offer.playbook_json,
                window_id=offer.window_id,
                meta=offer.meta,
            )
        except asyncio.CancelledError:
            self._inflight = None
            self._requeue(offer)  # stopped mid-publish: the version is still owed (a restart publishes it)
            raise
        except Exception as exc:
            self._inflight = None
            self.failures += 1
            self.last_error = _describe_error(exc, self._secrets)
            if not is_retryable(exc):
                self.dropped += 1
                log.error("dropping version %d of namespace %r: %s", offer.version, offer.namespace, self.last_error)
                return
            self._requeue(offer)
            self._consecutive_failures += 1
            delay = self.backoff_s(self._consecutive_failures)
            log.warning(
                "publish of %r v%d failed (%s); retrying in %.2fs (failure %d in a row)",
                offer.namespace,
                offer.version,
                self.last_error,
                delay,
                self._consecutive_failures,
            )
            await self._sleep(delay)
            return
        self._inflight = None
        self._consecutive_failures = 0
        previous = self._last_published.get(offer.namespace, -1)
        self._last_published[offer.namespace] = max(previous, offer.version)
        if written:
            self.published += 1
        else:
            self.skipped_not_newer += 1
        stale = self._pending.get(offer.namespace)
        if stale is not None and stale.version <= offer.version:
            del self._pending[offer.namespace]
            self.superseded += 1

    def _requeue(self, offer: _Offer) -> None:
        newer = self._pending.get(offer.namespace)
        if newer is None or newer.version < offer.version:
            self._pending[offer.namespace] = offer

    def start(self) -> asyncio.Task[None]:
        """Run :meth:`run` as a background task of the current event loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name="combee-latest-version-publisher")
        return self._task

    async def flush(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 - the documented API
        """Wait until nothing is pending or in flight. True when drained, False when ``timeout`` (seconds)
        passed first. Needs the loop to be running (:meth:`start` or :meth:`run`)."""
        if self._idle.is_set() and not self._pending:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return not self._pending

    async def stop(self, *, flush_timeout: float | None = 0.0) -> bool:
        """Optionally flush (``flush_timeout`` seconds; 0 = do not wait), then cancel the background task.
        Returns True if nothing was left pending."""
        drained = await self.flush(flush_timeout) if flush_timeout else (self.pending == 0)
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return drained
