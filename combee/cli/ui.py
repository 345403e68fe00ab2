"""``combee ui``: serve the read-only web page over Redis (:mod:`combee.ui.server`) until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import errno
from typing import Any

from combee.cli.base import CliError, add_connection_options, positive_int, stream_settings
from combee.settings import Settings

__all__ = ["add_ui_command", "cmd_ui"]


def add_ui_command(sub: Any) -> None:
    """Register ``ui`` on ``combee``'s subparsers."""
    p = sub.add_parser(
        "ui", help="a web page: namespaces, versions, prompts, diffs, recent windows, the controller's decision"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port to bind (default 8765; 0: any free port)")
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests with this Host name (repeatable; with $COMBEE_UI_ALLOWED_HOSTS); localhost, "
        "IP addresses and --host are always answered, any other name is refused (DNS rebinding)",
    )
    p.add_argument(
        "--max-diff-versions",
        type=positive_int,
        metavar="N",
        help="the most versions one diff request reads (default $COMBEE_UI_MAX_DIFF_VERSIONS or 50)",
    )
    add_connection_options(p)
    p.set_defaults(func=cmd_ui)


def cmd_ui(args: argparse.Namespace) -> int:
    settings = stream_settings(args)
    try:
        hosts = (*settings.ui_allowed_hosts, *args.allow_host)
        max_diff = args.max_diff_versions or settings.ui_max_diff_versions
        asyncio.run(_serve(settings, args.host, args.port, hosts, max_diff))
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise CliError(f"cannot serve on {args.host}:{args.port}: {exc.strerror}; choose another --port") from None
        raise
    except KeyboardInterrupt:
        pass
    return 0


async def _serve(settings: Settings, host: str, port: int, hosts: tuple[str, ...], max_diff: int) -> None:
    from combee.redaction import redact_url
    from combee.ui.server import serve
    from streams.redis_store import RedisPromptStore

    store = RedisPromptStore.from_settings(settings, client_name="combee-ui")
    try:
        await serve(
            store,
            host,
            port,
            ready=lambda url: print(f"combee ui: serving {url} (Ctrl-C stops)", flush=True),
            redis_target=redact_url(settings.redis_url),
            allowed_hosts=hosts,
            max_diff_versions=max_diff,
        )
    finally:
        await store.aclose()
