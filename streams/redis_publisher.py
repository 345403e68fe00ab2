"""A publisher that never blocks: the newest playbook version per namespace reaches the store in the background.

:class:`LatestVersionPublisher` sits between a learner and the store: ``offer()`` returns at once and keeps
only the newest pending version per namespace; a background loop publishes, backing off (capped exponential,
jittered) while Redis is unreachable, so learning never waits for Redis and, once Redis is back, the newest
version lands and the superseded ones are skipped. A superseded offer's ``meta["provenance"]`` windows are
carried into the offer that supersedes it (with their ``meta["evidence"]``), so the published version still
names and explains every window it covers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from combee.evidence import carry_evidence
from combee.models import validate_namespace
from combee.promptdiff import PROVENANCE_KEY
from streams.redis_connection import describe_error, is_retryable
from streams.redis_records import check_version

if TYPE_CHECKING:
    pass

__all__ = ["LatestVersionPublisher", "PublisherStats", "SupportsPublish"]

log = logging.getLogger("streams.redis_store")  # the name it logged under before the module was split

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


def _carry_provenance(superseded: dict[str, Any] | None, meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """The newer offer's meta with the superseded offer's ``provenance`` windows (and their evidence,
    :func:`combee.evidence.carry_evidence`) in front of its own: the version that does get published then names
    and explains every window applied since the previously published one."""
    older = (superseded or {}).get(PROVENANCE_KEY)
    if meta is None or not isinstance(older, list) or not isinstance(meta.get(PROVENANCE_KEY), list):
        return meta
    return carry_evidence(superseded, {**meta, PROVENANCE_KEY: [*older, *meta[PROVENANCE_KEY]]})


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
    bad version cannot wedge the loop. ``sleep`` and ``rng`` are injectable for tests. ``on_published``, if set,
    is called with (namespace, version) each time the store holds a version after a publish (written now, or
    refused because it already held it or a newer one); an exception it raises is logged, never propagated.

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
        on_published: Callable[[str, int], None] | None = None,
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
        self.on_published = on_published

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
        check_version(version)
        waiting = self._pending.get(namespace)
        if (waiting is not None and waiting.version >= version) or self._last_published.get(namespace, -1) >= version:
            self.superseded += 1
            return False
        meta = dict(meta) if meta is not None else None
        if waiting is not None:
            self.superseded += 1
            meta = _carry_provenance(waiting.meta, meta)
        self._pending[namespace] = _Offer(namespace, version, prompt, playbook_json, window_id, meta)
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
            self.last_error = describe_error(exc, self._secrets)
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
        if self.on_published is not None:
            try:
                self.on_published(offer.namespace, offer.version)
            except Exception:  # a listener's bug must not stop publishing
                log.exception("on_published listener failed for %r v%d", offer.namespace, offer.version)
        stale = self._pending.get(offer.namespace)
        if stale is not None and stale.version <= offer.version:
            del self._pending[offer.namespace]
            self.superseded += 1

    def _requeue(self, offer: _Offer) -> None:
        newer = self._pending.get(offer.namespace)
        if newer is None or newer.version < offer.version:
            self._pending[offer.namespace] = offer
        elif newer.version > offer.version:  # the failed version is superseded: its windows go with the newer one
            self._pending[offer.namespace] = dataclasses.replace(newer, meta=_carry_provenance(offer.meta, newer.meta))

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
