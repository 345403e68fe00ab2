"""``combee ui``: serve the read-only web page over Redis (:mod:`combee.ui.server`) until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import errno
from typing import Any

from combee.cli.base import CliError, add_connection_options, stream_settings
from combee.settings import Settings

__all__ = ["add_ui_command", "cmd_ui"]


def add_ui_command(sub: Any) -> None:
    """Register ``ui`` on ``combee``'s subparsers."""
    p = sub.add_parser(
        "ui", help="a web page: namespaces, versions, prompts, diffs, recent windows, the controller's decision"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port to bind (default 8765; 0: any free port)")
    add_connection_options(p)
    p.set_defaults(func=cmd_ui)


def cmd_ui(args: argparse.Namespace) -> int:
    settings = stream_settings(args)
    try:
        asyncio.run(_serve(settings, args.host, args.port))
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES):
            raise CliError(f"cannot serve on {args.host}:{args.port}: {exc.strerror}; choose another --port") from None
        raise
    except KeyboardInterrupt:
        pass
    return 0


async def _serve(settings: Settings, host: str, port: int) -> None:
    from combee.redaction import redact_url
    from combee.ui.server import serve
    from streams.keys import RedisKeys
    from streams.redis_connection import build_redis
    from streams.redis_store import RedisPromptStore

    redis = build_redis(settings, client_name="combee-ui")
    try:
        store = RedisPromptStore(redis, RedisKeys(settings.key_prefix))
        await serve(
            store,
            host,
            port,
            ready=lambda url: print(f"combee ui: serving {url} (Ctrl-C stops)", flush=True),
            redis_target=redact_url(settings.redis_url),
        )
    finally:
        await redis.aclose()
