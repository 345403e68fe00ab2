"""The agent-side read SDK: get the learned prompt of a namespace, or watch for new versions.

Two promises to agents:

* **Never block on Redis for a prompt you already have.** :meth:`PromptClient.get` answers from a local copy
  while it is younger than ``max_age_s`` (time since Redis last confirmed it); otherwise it asks Redis with a
  short timeout, and on any Redis failure it returns the local copy — stale but valid — backing off before it
  asks again. Only with no copy at all does it raise :class:`PromptUnavailable`.
* **Never see a torn or older prompt.** Each prompt is read with one ``HMGET`` of one hash (``current`` or the
  per-version hash), which the store's publish script writes atomically, so prompt text and version always
  match; a client never returns or yields a version lower than one it has already returned or yielded.

:meth:`PromptClient.watch` subscribes to the namespace's ``updates`` channel *and* polls ``current`` right
after every (re)subscription and whenever the channel has been quiet for ``poll_interval_s``, so a missed
pub/sub message or a Redis restart delays a new version by at most about one poll interval; connection
failures are retried with capped, jittered exponential backoff for as long as the watch runs.
:class:`AsyncPromptClient` is the same for asyncio agents.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import redis
import redis.asyncio
import redis.exceptions

from combee.errors import CombeeError
from combee.models import validate_namespace
from combee.outcomes import OutcomeCounts
from combee.promptdiff import VersionRecord
from combee.serving import Serving, in_canary_arm, served_version
from streams.client_cache import Backoff, Cache, PromptVersion, is_news
from streams.keys import RedisKeys
from streams.redis_connection import RedisOptions, build_redis, build_sync_redis, client_secrets, describe_error
from streams.redis_outcomes import parse_outcomes
from streams.redis_promotion import SERVING_FIELDS, parse_serving
from streams.redis_records import (
    RECORD_FIELDS,
    HistoryEntry,
    in_version_range,
    parse_history,
    parse_version_record,
    reply_float,
    reply_text,
)
from streams.settings import RedisSettings

__all__ = ["AsyncPromptClient", "PromptClient", "PromptUnavailable", "PromptVersion"]

log = logging.getLogger(__name__)

_FIELDS: Final = ("version", "prompt", "window_id", "published_at")
# What counts as "Redis failed" for the fallbacks: every redis-py error, socket errors, and a hash that does
# not parse (someone wrote it by hand).
_READ_ERRORS: Final = (redis.exceptions.RedisError, OSError, ValueError)


class PromptUnavailable(CombeeError):
    """No prompt can be returned: Redis cannot be read (``unreadable``) or holds no version, and there is no
    local copy."""

    def __init__(self, message: str, *, unreadable: bool = True) -> None:
        super().__init__(message)
        self.unreadable = unreadable


def _prompt_version(namespace: str, values: Sequence[Any]) -> PromptVersion | None:
    version, prompt, window_id, published_at = (reply_text(v) for v in values)
    if version is None:
        return None
    if prompt is None:
        raise ValueError(f"prompt hash of namespace {namespace!r} has a version but no prompt")
    number = int(version)
    if not in_version_range(number):  # written outside Combee: never adopted (`combee prompt repair` resets it)
        raise ValueError(f"namespace {namespace!r} holds version {version[:40]}, not in 0..2**53 - 1 (tampered)")
    return PromptVersion(number, prompt, namespace, window_id or None, reply_float(published_at))


def _announced_version(message: Any) -> int | None:
    """The version number a pub/sub message announces (None for anything else)."""
    if not isinstance(message, dict) or message.get("type") != "message":
        return None
    try:
        version = int(reply_text(message.get("data")) or "")
    except ValueError:
        return None
    return version if in_version_range(version) else None


class _ClientBase:
    def __init__(
        self,
        namespace: str,
        keys: RedisKeys,
        *,
        max_age_s: float,
        poll_interval_s: float,
        backoff_base_s: float,
        backoff_cap_s: float,
        clock: Callable[[], float],
        rng: random.Random | None,
        agent_id: str | None = None,
    ) -> None:
        if max_age_s < 0 or poll_interval_s <= 0:
            raise ValueError("need max_age_s >= 0 and poll_interval_s > 0")
        self.namespace = validate_namespace(namespace)
        self.keys = keys
        self.max_age_s = max_age_s
        self.poll_interval_s = poll_interval_s
        self._clock = clock
        self._backoff = Backoff(backoff_base_s, backoff_cap_s, rng or random.Random())
        self._cache = Cache(max_age_s, self._backoff)
        self._current_key = keys.current(namespace)
        self._serving_key = keys.serving(namespace)
        # the last serving state read was direct: an announcement of a version not above the last one yielded
        # changes nothing then (under another policy it may announce a decision), so the watch skips its read
        self._direct = True
        self._channel = keys.updates(namespace)
        self.agent_id = agent_id
        self._secrets: tuple[str, ...] = ()

    @property
    def cached(self) -> PromptVersion | None:
        """The local copy (newest version seen), without asking Redis."""
        return self._cache.value

    def _unavailable(self, exc: BaseException | None) -> PromptUnavailable:
        if exc is None:
            return PromptUnavailable(f"namespace {self.namespace!r} has no published prompt yet", unreadable=False)
        return PromptUnavailable(
            f"cannot read the prompt of namespace {self.namespace!r} and no copy is cached: "
            f"{describe_error(exc, self._secrets)}"
        )

    def _log_failure(self, what: str, exc: BaseException, delay: float) -> None:
        log.warning(
            "%s for namespace %r failed (%s); retrying in %.2fs", what, self.namespace, self._describe(exc), delay
        )

    def _describe(self, exc: BaseException) -> str:
        return describe_error(exc, self._secrets)

    def _resolve(self, raw_state: Any, raw_head: Any, raw_announced: Sequence[Any], announced: int | None) -> _Served:
        """What the one pipelined read (serving state, head, and the ``announced`` version when given) says to
        serve, and which version key is still to be read, if any (the sync and async clients do that read)."""
        state, head = parse_serving(raw_state), _prompt_version(self.namespace, raw_head)
        self._direct = state.policy == "direct"
        is_head, other = self._pick(state, head, announced)
        if is_head:
            return _Served(state.serial, head)
        if other is not None and other == announced and raw_announced:
            return _Served(state.serial, _prompt_version(self.namespace, raw_announced[0]) or head)
        fallback = head if announced is not None else None
        read = self.keys.version(self.namespace, other) if other is not None else None
        return _Served(state.serial, fallback, read)

    def _pick(self, state: Serving, head: PromptVersion | None, announced: int | None) -> tuple[bool, int | None]:
        """Given the serving state and the head: (True, None) when the head is what to serve (or None when head
        is None), (False, V) when version V must be read (None: nothing is served). ``announced``: under
        ``direct``, a version announced on the channel is read itself, so a burst is yielded version by version."""
        arm = in_canary_arm(self.namespace, self.agent_id, state.fraction)
        target = served_version(state, head.version if head is not None else None, canary_arm=arm)
        if state.policy == "direct" and announced is not None and head is not None and announced < head.version:
            return False, announced
        if head is None or target == head.version:
            return True, None
        return False, target


@dataclass(frozen=True)
class _Served:
    """:meth:`_ClientBase._resolve`'s answer: the serving serial, and the prompt to serve, which is what reading
    ``read`` (a version key) finds when that is set and finds something, else ``otherwise``."""

    serial: int
    otherwise: PromptVersion | None
    read: str | None = None


def _keys_from(keys: RedisKeys | None, key_prefix: str | None) -> RedisKeys | None:
    if keys is not None and key_prefix is not None:
        raise ValueError("give keys or key_prefix, not both")
    return RedisKeys(key_prefix) if key_prefix is not None else keys


def _options_and_keys(
    source: RedisSettings | RedisOptions | str, keys: RedisKeys | None
) -> tuple[RedisOptions, RedisKeys]:
    options = RedisOptions.coerce(source)
    return options, keys or RedisKeys(options.key_prefix)


class PromptClient(_ClientBase):
    """Blocking prompt reader for one namespace (thread-safe; one per namespace and process is plenty).

    ``redis_source`` is a URL, settings (any RedisSettings: combee's Settings is one) or RedisOptions (the
    client then owns its connection pool, built with ``socket_timeout_s`` and no command retries) or an
    existing ``redis.Redis`` (not closed by :meth:`close`). Key names come from ``keys``, or
    ``RedisKeys(key_prefix)``, or the settings' key prefix (default ``combee``). ``clock``/``sleep``/``rng``
    are injectable. Raises InvalidNamespace for a bad namespace and ConfigError for unusable connection
    settings; never connects in the constructor.
    """

    def __init__(
        self,
        redis_source: RedisSettings | RedisOptions | str | redis.Redis,
        namespace: str,
        *,
        keys: RedisKeys | None = None,
        key_prefix: str | None = None,
        max_age_s: float = 1.0,
        socket_timeout_s: float = 0.5,
        poll_interval_s: float = 2.0,
        backoff_base_s: float = 0.1,
        backoff_cap_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = time.sleep,
        rng: random.Random | None = None,
        agent_id: str | None = None,
    ) -> None:
        validate_namespace(namespace)
        keys = _keys_from(keys, key_prefix)
        if not isinstance(redis_source, str | RedisOptions | RedisSettings):
            self._redis: redis.Redis = redis_source  # a ready client (or a test double with the same methods)
            self._owns_redis = False
            keys = keys or RedisKeys()
        else:
            options, keys = _options_and_keys(redis_source, keys)
            self._redis = build_sync_redis(
                options,
                socket_timeout_s=socket_timeout_s,
                connect_timeout_s=socket_timeout_s,
                retries=0,
                client_name=f"combee-prompt-client:{namespace}",
            )
            self._owns_redis = True
        super().__init__(
            namespace,
            keys,
            max_age_s=max_age_s,
            poll_interval_s=poll_interval_s,
            backoff_base_s=backoff_base_s,
            backoff_cap_s=backoff_cap_s,
            clock=clock,
            rng=rng,
            agent_id=agent_id,
        )
        self._secrets = client_secrets(self._redis)
        self._sleep = sleep
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"PromptClient(namespace={self.namespace!r}, prefix={self.keys.prefix!r})"

    def _read(self, key: str) -> PromptVersion | None:
        values = cast(Sequence[Any], self._redis.hmget(key, _FIELDS))
        return _prompt_version(self.namespace, values)

    def _read_served(self, announced: int | None = None) -> tuple[int, PromptVersion | None]:
        """What this agent is served and the serving state's serial: one round trip (the state, the head and the
        ``announced`` version), and one more when it is served a version other than those."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.hmget(self._serving_key, SERVING_FIELDS)
        pipe.hmget(self._current_key, _FIELDS)
        if announced is not None:  # under direct, what a watch yields: read in the same round trip
            pipe.hmget(self.keys.version(self.namespace, announced), _FIELDS)
        raw_state, raw_head, *raw_announced = pipe.execute()
        served = self._resolve(raw_state, raw_head, raw_announced, announced)
        found = self._read(served.read) if served.read is not None else None
        return served.serial, found or served.otherwise

    def get(self) -> PromptVersion:
        """The newest prompt this client knows, refreshed from Redis when the copy is older than ``max_age_s``.

        Never returns an older version than a previous call returned. Raises PromptUnavailable only when
        there is no local copy and Redis cannot provide one (unreachable, or nothing published yet).
        """
        now = self._clock()
        with self._lock:
            served = self._cache.answer_without_redis(now)
        if served is not None:
            return served
        try:
            serial, found = self._read_served()
        except _READ_ERRORS as exc:
            with self._lock:
                fallback = self._cache.failed(self._clock())
            if fallback is None:
                raise self._unavailable(exc) from None
            log.debug("serving cached v%d of %r: %s", fallback.version, self.namespace, self._describe(exc))
            return fallback
        with self._lock:
            served = self._cache.confirmed(found, self._clock(), serial)
        if served is None:
            raise self._unavailable(None)
        return served

    def history(self, limit: int = 20) -> list[HistoryEntry]:
        """The newest ``limit`` published versions' summaries, newest first (not cached).
        Raises PromptUnavailable when Redis cannot be read."""
        if limit < 1:
            return []
        try:
            members = cast(Sequence[Any], self._redis.zrevrange(self.keys.history(self.namespace), 0, limit - 1))
        except _READ_ERRORS as exc:
            raise PromptUnavailable(f"cannot read the history of {self.namespace!r}: {self._describe(exc)}") from None
        return parse_history(members)

    def outcomes(self) -> dict[str, OutcomeCounts]:
        """The outcomes counted per version key (``"3"``, ``"unknown"``: above the live version) from the traces
        that named the version they ran with (:mod:`combee.outcomes`). Raises PromptUnavailable as :meth:`history`."""
        try:
            raw = cast(Mapping[Any, Any], self._redis.hgetall(self.keys.outcomes(self.namespace)))
        except _READ_ERRORS as exc:
            raise PromptUnavailable(f"cannot read the outcomes of {self.namespace!r}: {self._describe(exc)}") from None
        return parse_outcomes(raw or {})

    def version(self, version: int) -> PromptVersion | None:
        """Published version ``version`` if it is still retained, else None (not cached).
        Raises PromptUnavailable when Redis cannot be read."""
        try:
            return self._read(self.keys.version(self.namespace, version))
        except _READ_ERRORS as exc:
            raise PromptUnavailable(f"cannot read {self.namespace!r} v{version}: {self._describe(exc)}") from None

    def version_record(self, version: int) -> VersionRecord | None:
        """Version ``version``'s playbook and provenance (:mod:`combee.promptdiff`), or None when not retained.
        Raises PromptUnavailable when Redis cannot be read."""
        key = self.keys.version(self.namespace, version)
        try:
            return parse_version_record(self.namespace, cast(Sequence[Any], self._redis.hmget(key, RECORD_FIELDS)))
        except _READ_ERRORS as exc:
            raise PromptUnavailable(f"cannot read {self.namespace!r} v{version}: {self._describe(exc)}") from None

    def watch(self, timeout: float | None = None, *, after: int | None = None) -> Generator[PromptVersion, None, None]:
        """Yield each new version of the namespace, in strictly increasing version order.

        The first item is the current version (unless ``after`` is given: then only versions > ``after``).
        Announced versions are read from their per-version hash, so a slow consumer still sees each one;
        ``current`` is polled after every (re)subscription and whenever the channel has been quiet for
        ``poll_interval_s``, so a missed announcement costs at most one interval (and the poll may then skip
        straight to the newest version). Stops after ``timeout`` seconds in total (None: runs until the caller
        stops iterating). Redis failures are retried with capped, jittered backoff and never raised. Each
        yielded version also refreshes the :meth:`get` cache.
        """
        deadline = None if timeout is None else self._clock() + timeout
        last = -1 if after is None else after
        last_serial: int | None = None
        pubsub: Any = None
        failures = 0
        next_poll = -math.inf
        try:
            while True:
                now = self._clock()
                if deadline is not None and now >= deadline:
                    return
                try:
                    if pubsub is None:
                        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                        pubsub.subscribe(self._channel)
                        next_poll = -math.inf  # catch whatever was published while we were not subscribed
                    found, serial = None, last_serial or 0
                    if now >= next_poll:
                        next_poll = now + self.poll_interval_s
                        serial, found = self._read_served()
                    else:
                        wait = next_poll - now if deadline is None else min(next_poll, deadline) - now
                        announced = _announced_version(pubsub.get_message(timeout=max(wait, 0.0)))
                        if announced is not None:
                            # The channel works: poll only after it has been quiet for a whole interval, so a
                            # burst is yielded version by version instead of jumping to the newest.
                            next_poll = self._clock() + self.poll_interval_s
                        if announced is not None and (announced > last or not self._direct):
                            serial, found = self._read_served(announced)
                    failures = 0
                except _READ_ERRORS as exc:
                    _close_quietly(pubsub)
                    pubsub = None
                    failures += 1
                    delay = self._backoff.delay(failures)
                    if deadline is not None:
                        delay = min(delay, max(deadline - self._clock(), 0.0))
                    self._log_failure("watch", exc, delay)
                    self._sleep(delay)
                    continue
                news = is_news(found, serial, last, last_serial)
                last_serial = serial if last_serial is None else max(last_serial, serial)
                if news and found is not None:
                    last = found.version
                    with self._lock:
                        self._cache.confirmed(found, self._clock(), serial)
                    yield found
        finally:
            _close_quietly(pubsub)

    def close(self) -> None:
        """Release the connection pool (only if this client created it)."""
        if self._owns_redis:
            self._redis.close()

    def __enter__(self) -> PromptClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _close_quietly(pubsub: Any) -> None:
    if pubsub is not None:
        with contextlib.suppress(Exception):
            pubsub.close()


class AsyncPromptClient(_ClientBase):
    """:class:`PromptClient` for asyncio agents: ``await get()``, ``async for v in watch()``, ``await history()``.

    Use one event loop per client. Wrap ``watch()`` in :func:`contextlib.aclosing` (or let it run to its
    timeout) so its subscription is released as soon as you stop iterating.
    """

    def __init__(
        self,
        redis_source: RedisSettings | RedisOptions | str | redis.asyncio.Redis,
        namespace: str,
        *,
        keys: RedisKeys | None = None,
        key_prefix: str | None = None,
        max_age_s: float = 1.0,
        socket_timeout_s: float = 0.5,
        poll_interval_s: float = 2.0,
        backoff_base_s: float = 0.1,
        backoff_cap_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        rng: random.Random | None = None,
        agent_id: str | None = None,
    ) -> None:
        validate_namespace(namespace)
        keys = _keys_from(keys, key_prefix)
        if not isinstance(redis_source, str | RedisOptions | RedisSettings):
            self._redis: redis.asyncio.Redis = redis_source
            self._owns_redis = False
            keys = keys or RedisKeys()
        else:
            options, keys = _options_and_keys(redis_source, keys)
            self._redis = build_redis(
                options,
                socket_timeout_s=socket_timeout_s,
                connect_timeout_s=socket_timeout_s,
                retries=0,
                client_name=f"combee-prompt-client:{namespace}",
            )
            self._owns_redis = True
        super().__init__(
            namespace,
            keys,
            max_age_s=max_age_s,
            poll_interval_s=poll_interval_s,
            backoff_base_s=backoff_base_s,
            backoff_cap_s=backoff_cap_s,
            clock=clock,
            rng=rng,
            agent_id=agent_id,
        )
        self._secrets = client_secrets(self._redis)
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"AsyncPromptClient(namespace={self.namespace!r}, prefix={self.keys.prefix!r})"

    async def _read(self, key: str) -> PromptVersion | None:
        values = await cast(Awaitable[Sequence[Any]], self._redis.hmget(key, _FIELDS))
        return _prompt_version(self.namespace, values)

    async def _read_served(self, announced: int | None = None) -> tuple[int, PromptVersion | None]:
        """See :meth:`PromptClient._read_served`."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(self._serving_key, SERVING_FIELDS)
            pipe.hmget(self._current_key, _FIELDS)
            if announced is not None:
                pipe.hmget(self.keys.version(self.namespace, announced), _FIELDS)
            raw_state, raw_head, *raw_announced = await pipe.execute()
        served = self._resolve(raw_state, raw_head, raw_announced, announced)
        found = await self._read(served.read) if served.read is not None else None
        return served.serial, found or served.otherwise

    async def get(self) -> PromptVersion:
        """See :meth:`PromptClient.get`."""
        served = self._cache.answer_without_redis(self._clock())
        if served is not None:
            return served
        try:
            serial, found = await self._read_served()
        except _READ_ERRORS as exc:
            fallback = self._cache.failed(self._clock())
            if fallback is None:
                raise self._unavailable(exc) from None
            log.debug("serving cached v%d of %r: %s", fallback.version, self.namespace, self._describe(exc))
            return fallback
        served = self._cache.confirmed(found, self._clock(), serial)
        if served is None:
            raise self._unavailable(None)
        return served

    async def history(self, limit: int = 20) -> list[HistoryEntry]:
        """See :meth:`PromptClient.history`."""
        if limit < 1:
            return []
        try:
            members = await cast(
                Awaitable[Sequence[Any]], self._redis.zrevrange(self.keys.history(self.namespace), 0, limit - 1)
            )
        except _READ_ERRORS as exc:
            raise PromptUnavailable(f"cannot read the history of {self.namespace!r}: {self._describe(exc)}") from None
        return parse_history(members)

    async def watch(
        self,
        timeout: float | None = None,  # noqa: ASYNC109 - bounds the whole watch; the documented API
        *,
        after: int | None = None,
    ) -> AsyncGenerator[PromptVersion, None]:
        """See :meth:`PromptClient.watch`."""
        deadline = None if timeout is None else self._clock() + timeout
        last = -1 if after is None else after
        last_serial: int | None = None
        pubsub: Any = None
        failures = 0
        next_poll = -math.inf
        try:
            while True:
                now = self._clock()
                if deadline is not None and now >= deadline:
                    return
                try:
                    if pubsub is None:
                        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                        await pubsub.subscribe(self._channel)
                        next_poll = -math.inf
                    found, serial = None, last_serial or 0
                    if now >= next_poll:
                        next_poll = now + self.poll_interval_s
                        serial, found = await self._read_served()
                    else:
                        wait = next_poll - now if deadline is None else min(next_poll, deadline) - now
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=max(wait, 0.0))
                        announced = _announced_version(message)
                        if announced is not None:
                            next_poll = self._clock() + self.poll_interval_s
                        if announced is not None and (announced > last or not self._direct):
                            serial, found = await self._read_served(announced)
                    failures = 0
                except _READ_ERRORS as exc:
                    await _aclose_quietly(pubsub)
                    pubsub = None
                    failures += 1
                    delay = self._backoff.delay(failures)
                    if deadline is not None:
                        delay = min(delay, max(deadline - self._clock(), 0.0))
                    self._log_failure("watch", exc, delay)
                    await self._sleep(delay)
                    continue
                news = is_news(found, serial, last, last_serial)
                last_serial = serial if last_serial is None else max(last_serial, serial)
                if news and found is not None:
                    last = found.version
                    self._cache.confirmed(found, self._clock(), serial)
                    yield found
        finally:
            await _aclose_quietly(pubsub)

    async def aclose(self) -> None:
        """Release the connection pool (only if this client created it)."""
        if self._owns_redis:
            await self._redis.aclose()

    async def __aenter__(self) -> AsyncPromptClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def _aclose_quietly(pubsub: Any) -> None:
    if pubsub is not None:
        with contextlib.suppress(Exception):
            await pubsub.aclose()
