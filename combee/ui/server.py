"""``combee ui``'s web server (aiohttp): thin handlers that read with :mod:`streams.overview` and render with
:mod:`combee.ui.render`, and the same data as JSON under ``/api/``.

Routes: ``/`` (namespaces), ``/ns/{namespace}``, ``/ns/{namespace}/v/{version}``,
``/ns/{namespace}/diff?from=V&to=W`` (defaults as ``combee prompt diff``), and ``/api/namespaces``,
``/api/ns/{namespace}``, ``/api/ns/{namespace}/v/{version}``, ``/api/ns/{namespace}/diff``, ``/api/health`` (the
workers' dependencies; the index page shows them, a namespace's page its outages). An invalid namespace,
a version not retained or out of range (above 2**53 - 1) or a bad query is a 404/400 page naming it; a diff
that would read more than ``max_diff_versions`` playbooks is a 400 saying how to narrow it; Redis unreachable is
a 503 page. A request whose ``Host`` is not a name of this server is a 421 (:mod:`combee.ui.guard`), and every
answer carries the security headers of :func:`combee.ui.guard.security_headers`.
Read-only: nothing here writes to Redis.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.exceptions
from aiohttp import web
from pydantic import BaseModel

from combee.errors import ConfigError, InvalidNamespace
from combee.models import validate_namespace
from combee.promptdiff import MAX_DIFF_VERSIONS, UnknownVersion
from combee.ui import render
from combee.ui.guard import HostCheck, security_headers
from streams import overview
from streams.overview import OverviewStore
from streams.redis_records import in_version_range
from streams.redis_store import DEFAULT_HISTORY_LIMIT

__all__ = ["REDIS_KEY", "STORE_KEY", "build_app", "serve", "start_site"]

log = logging.getLogger(__name__)

STORE_KEY = web.AppKey[OverviewStore]("store")
REDIS_KEY = web.AppKey[str]("redis")  # the Redis the store reads (credentials masked), for the 503 page
HOSTS_KEY = web.AppKey[HostCheck]("hosts")
MAX_DIFF_KEY = web.AppKey[int]("max_diff_versions")
_HEADERS = security_headers(render.PAGE_STYLE)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def _json(data: Any) -> web.Response:
    plain = [dataclasses.asdict(d) for d in data] if isinstance(data, list) else dataclasses.asdict(data)
    return web.Response(text=json.dumps(plain, default=_json_default, indent=1), content_type="application/json")


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


class _Fail(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _namespace(request: web.Request) -> str:
    try:
        return validate_namespace(request.match_info["namespace"])
    except InvalidNamespace as exc:
        raise _Fail(404, str(exc)) from None


def _version(text: str | None, name: str, status: int = 400) -> int | None:
    """``text`` as a version number (None when absent); ``_Fail(status)`` when it is not one in [0, 2**53 - 1]."""
    if text is None or text == "":
        return None
    shown = text if len(text) <= 40 else f"{text[:40]}…"
    try:
        value = int(text)
    except ValueError:  # not digits, or more digits than Python converts
        raise _Fail(status, f"{name} must be a version number, got {shown!r}") from None
    if not in_version_range(value):
        raise _Fail(status, f"{name} must be a version number in 0..2**53 - 1, got {shown}")
    return value


def _page(handler: Callable[[web.Request, OverviewStore], Awaitable[web.Response]]) -> Handler:
    """Run ``handler`` with the app's store; a failure becomes a page (HTML) or ``{"error": ...}`` (``/api/``)."""

    async def run(request: web.Request) -> web.StreamResponse:
        api = request.path.startswith("/api/")
        try:
            return await handler(request, request.app[STORE_KEY])
        except _Fail as exc:
            status, message = exc.status, str(exc)
        except UnknownVersion as exc:
            status, message = 404, f"{request.match_info.get('namespace', '')}: {exc}"
        except ConfigError as exc:
            status, message = 400, str(exc)
        except (redis.exceptions.RedisError, OSError) as exc:
            log.warning("reading Redis for %s failed: %s", request.path, type(exc).__name__)
            where = request.app.get(REDIS_KEY)
            status, message = 503, f"cannot read Redis{f' at {where}' if where else ''}: {type(exc).__name__}"
        if api:
            return web.json_response({"error": message}, status=status)
        return _html(render.error_page(status, message), status)

    return run


async def _index(request: web.Request, store: OverviewStore) -> web.Response:
    summaries = await overview.namespace_summaries(store)
    if request.path.startswith("/api/"):
        return _json(summaries)
    return _html(render.index_page(summaries, await overview.health_view(store, time.time())))


async def _namespace_page(request: web.Request, store: OverviewStore) -> web.Response:
    view = await overview.namespace_overview(store, _namespace(request))
    if request.path.startswith("/api/"):
        return _json(view)
    return _html(render.namespace_page(view, await overview.health_view(store, time.time())))


async def _health(request: web.Request, store: OverviewStore) -> web.Response:
    return _json(list(await overview.health_view(store, time.time())))


async def _version_page(request: web.Request, store: OverviewStore) -> web.Response:
    ns = _namespace(request)
    version = _version(request.match_info["version"], "version", status=404)
    assert version is not None  # the route's pattern requires digits
    view = await overview.version_detail(store, ns, version)
    if view is None:
        held = sorted(h.version for h in await store.history(ns, limit=DEFAULT_HISTORY_LIMIT))
        there = f"versions {held[0]}..{held[-1]}" if held else "no version yet"
        raise _Fail(404, f"{ns}: version {version} is not published or no longer retained (there are {there})")
    return _json(view) if request.path.startswith("/api/") else _html(render.version_page(view))


async def _diff_page(request: web.Request, store: OverviewStore) -> web.Response:
    ns = _namespace(request)
    from_v = _version(request.query.get("from"), "from")
    to_v = _version(request.query.get("to"), "to")
    diff = await overview.prompt_diff(store, ns, from_v, to_v, max_versions=request.app[MAX_DIFF_KEY])
    return _json(diff) if request.path.startswith("/api/") else _html(render.diff_page(diff))


async def _not_found(request: web.Request) -> web.Response:
    return _html(render.error_page(404, f"no page at {request.path}"), 404)


@web.middleware
async def _check_host(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer only requests that name this server (DNS rebinding: :mod:`combee.ui.guard`)."""
    hosts = request.app[HOSTS_KEY]
    header = request.headers.get("Host")
    if not hosts.allows(header):
        return web.Response(status=421, text=hosts.refusal(header) + "\n", content_type="text/plain")
    return await handler(request)


async def _add_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(_HEADERS)


def build_app(
    store: OverviewStore,
    redis_target: str | None = None,
    *,
    hosts: HostCheck | None = None,
    max_diff_versions: int = MAX_DIFF_VERSIONS,
) -> web.Application:
    """The web UI over ``store`` (a :class:`streams.redis_store.RedisPromptStore`, or a test's fake). Not started;
    the caller owns the store's connection. ``redis_target`` (credentials masked) is named when Redis fails;
    ``hosts`` are the Host names answered (default: localhost and IP addresses); a diff reads at most
    ``max_diff_versions`` versions."""
    app = web.Application(middlewares=[_check_host])
    app.on_response_prepare.append(_add_headers)
    app[STORE_KEY] = store
    app[HOSTS_KEY] = hosts if hosts is not None else HostCheck()
    app[MAX_DIFF_KEY] = max_diff_versions
    if redis_target:
        app[REDIS_KEY] = redis_target
    for base in ("", "/api"):
        app.router.add_get(f"{base}/" if base == "" else f"{base}/namespaces", _page(_index))
        app.router.add_get(base + "/ns/{namespace}", _page(_namespace_page))
        app.router.add_get(base + r"/ns/{namespace}/v/{version:\d+}", _page(_version_page))
        app.router.add_get(base + "/ns/{namespace}/diff", _page(_diff_page))
    app.router.add_get("/api/health", _page(_health))
    app.router.add_get("/{tail:.*}", _not_found)
    return app


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host:port`` (0: a free port); returns the runner (``cleanup()`` stops it) and the port.
    Raises OSError when the address is taken."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = int(runner.addresses[0][1]) if runner.addresses else port
    return runner, bound


async def serve(
    store: OverviewStore,
    host: str,
    port: int,
    *,
    ready: Callable[[str], None] | None = None,
    redis_target: str | None = None,
    allowed_hosts: tuple[str, ...] = (),
    max_diff_versions: int = MAX_DIFF_VERSIONS,
) -> None:
    """Serve until cancelled; ``ready`` (if given) gets the page's URL once bound. Requests must name ``host``,
    localhost, an IP address or one of ``allowed_hosts`` in their Host header."""
    app = build_app(store, redis_target, hosts=HostCheck(host, allowed_hosts), max_diff_versions=max_diff_versions)
    runner, bound = await start_site(app, host, port)
    shown = f"[{host}]" if ":" in host else host
    try:
        if ready is not None:
            ready(f"http://{shown}:{bound}/")
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
