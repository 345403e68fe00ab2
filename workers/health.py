"""The worker's dependencies checked and reported: the LLM endpoint(s), an embeddings endpoint when one is
configured, Kafka and Redis.

At start and then every ``interval_s`` seconds each dependency is probed (an LLM or embeddings endpoint with
``GET <base>/models``, Kafka with a TCP connection to its bootstrap addresses, Redis with ``PING``); the LLM
steps report too (:meth:`workers.context.StageContext.retrying`), so an outage met by work in flight shows at
once. The states live in a :class:`combee.health.HealthBoard`; after each round the worker writes its report to
Redis (the ``health`` hash: ``combee status``, ``combee ui``) and sets ``combee_dependency_up``. A state that
changes is logged once, not on every retry.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from combee.health import HealthBoard
from combee.llm import Role
from combee.redaction import endpoint_url, redact, redact_url
from combee.settings import Settings
from streams.kafka_config import check_kafka_reachable
from workers.context import StageContext
from workers.window import in_flight

if TYPE_CHECKING:
    from streams.redis_store import RedisPromptStore

__all__ = ["HealthWatch", "build_health", "health_loop", "holds_up", "llm_dependency_names", "worker_id"]

log = logging.getLogger("combee.worker.health")

Probe = Callable[[], Awaitable[None]]


def worker_id() -> str:
    """``host:pid``, as the namespace reports name the worker."""
    return f"{socket.gethostname()}:{os.getpid()}"


def llm_dependency_names(settings: Settings) -> dict[Role, str]:
    """Each role's dependency name: ``llm`` for the shared endpoint, ``llm-<role>`` for a role with its own."""
    return {
        role: "llm" if settings.base_url_for(role) == settings.openai_base_url else f"llm-{role.value}"
        for role in Role
        if role is not Role.GENERATOR  # workers never generate
    }


@dataclass
class HealthWatch:
    """The worker's board, a probe per dependency and the secrets to keep out of what it reports."""

    board: HealthBoard
    probes: Mapping[str, Probe]
    secrets: tuple[str, ...] = ()
    worker: str = field(default_factory=worker_id)
    clock: Callable[[], float] = time.time

    async def check(self, name: str) -> None:
        """Run ``name``'s probe and record what it found (logging a change of state)."""
        try:
            await self.probes[name]()
        except Exception as exc:  # any failure of a probe is the dependency's, not the worker's
            self.failed(name, exc)
        else:
            if self.board.up(name, self.clock()):
                log.info("%s (%s) is up", name, self.board.get(name).target)

    def llm_outcome(self, dependency: str, exc: BaseException | None) -> None:
        """An LLM step of ``dependency`` succeeded (``exc`` None) or failed on an outage (after the client's
        retries): the board follows at once rather than at the next probe."""
        if dependency not in self.board:
            return
        if exc is not None:
            self.failed(dependency, exc)
        elif self.board.up(dependency, self.clock()):
            log.info("%s (%s) is up", dependency, self.board.get(dependency).target)

    def failed(self, name: str, exc: BaseException | str) -> None:
        text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        if self.board.down(name, redact(text, self.secrets), self.clock()):
            dep = self.board.get(name)
            log.warning("%s (%s) is DOWN: %s; work that needs it waits", name, dep.target, dep.last_error)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(name) for name in self.probes))


async def _http_models(base_url: str, api_key: str | None, timeout_s: float) -> None:
    """``GET <base_url>/models``: a connection failure, a timeout, a 5xx or a refused key raise; anything else is
    an endpoint that answers (a server without the route answers 404, which is up)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(base_url.rstrip("/") + "/models", headers=headers) as reply,
        ):
            status = reply.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ConnectionError(f"GET /models: {type(exc).__name__}: {exc or 'no answer'}") from None
    if status >= 500:
        raise ConnectionError(f"GET /models: HTTP {status}")
    if status in (401, 403):
        raise PermissionError(f"GET /models: HTTP {status}: the endpoint refused the API key")


def _endpoint_probe(base_url: str, api_key: str | None, timeout_s: float) -> Probe:
    async def probe() -> None:
        await _http_models(base_url, api_key, timeout_s)

    return probe


def build_health(settings: Settings, store: RedisPromptStore, *, timeout_s: float = 3.0) -> HealthWatch:
    """The dependencies of a worker configured by ``settings``, each with its probe."""
    key = settings.openai_api_key.get_secret_value()
    targets: dict[str, str] = {}
    probes: dict[str, Probe] = {}
    for role, name in sorted(llm_dependency_names(settings).items(), key=lambda item: item[1]):
        url = settings.base_url_for(role)
        targets[name] = endpoint_url(url)
        probes[name] = _endpoint_probe(url, key, timeout_s)
    secrets = [key]
    if settings.embeddings != "off" and settings.embeddings_url and settings.embeddings in ("auto", "endpoint"):
        emb_key = (settings.embeddings_api_key or settings.openai_api_key).get_secret_value()
        secrets.append(emb_key)
        emb_url: str = settings.embeddings_url
        targets["embeddings"] = endpoint_url(emb_url)
        probes["embeddings"] = _endpoint_probe(emb_url, emb_key, timeout_s)
    bootstrap = settings.kafka_bootstrap

    async def kafka() -> None:
        why = await asyncio.to_thread(check_kafka_reachable, bootstrap, timeout_s)
        if why is not None:
            raise ConnectionError(why)

    async def redis() -> None:
        await asyncio.wait_for(store.ping(), timeout_s)

    targets["kafka"], probes["kafka"] = bootstrap, kafka
    targets["redis"], probes["redis"] = redact_url(settings.redis_url), redis
    for secret in (settings.redis_password, settings.kafka_sasl_password):
        if secret is not None:
            secrets.append(secret.get_secret_value())
    return HealthWatch(HealthBoard(targets), probes, tuple(s for s in secrets if s))


def holds_up(ctx: StageContext) -> dict[str, dict[str, int]]:
    """What waits on each dependency while it is down: windows in flight and traces buffered (LLM, embeddings,
    Kafka), reflection and curate tasks in flight (the pool), versions waiting for Redis."""
    windows = sum(in_flight(ctx, rt) for rt in ctx.runtimes.values())
    buffered = sum(ctx.buffered(rt) for rt in ctx.runtimes.values())
    work = {"windows_waiting": windows, "traces_buffered": buffered, "tasks_in_flight": ctx.in_flight_tasks}
    return {
        "llm": work,
        "embeddings": {"windows_waiting": windows},
        "kafka": work,
        "redis": {"versions_waiting": int(getattr(ctx.publisher, "pending", 0))},
    }


def report(ctx: StageContext, watch: HealthWatch) -> dict[str, Any]:
    """The worker's health report as it is written to Redis."""
    waiting = holds_up(ctx)
    per_dep = {name: waiting.get("llm" if name.startswith("llm") else name, {}) for name in watch.probes}
    return {
        "worker": watch.worker,
        "updated_at": watch.clock(),
        "namespaces": sorted(ctx.runtimes),
        "dependencies": watch.board.report(per_dep),
    }


async def health_loop(ctx: StageContext, watch: HealthWatch, store: RedisPromptStore, interval_s: float) -> None:
    """Probe every dependency, then write the report and the metric, every ``interval_s`` seconds, until
    cancelled (then the report is removed: a stopped worker holds nothing up)."""
    try:
        while True:
            await watch.check_all()
            for name in watch.probes:
                ctx.metrics.dependency_up(name, watch.board.get(name).state == "up")
            try:
                await store.set_health(watch.worker, report(ctx, watch))
            except Exception as exc:  # Redis down: the board says so; the report waits for the next round
                log.debug("health report not written: %s", exc)
            await asyncio.sleep(interval_s)
    finally:
        try:
            await asyncio.wait_for(store.clear_health(watch.worker), 1.0)
        except BaseException as exc:  # stopping: a report left behind only ages
            log.debug("health report not removed: %s", exc)
