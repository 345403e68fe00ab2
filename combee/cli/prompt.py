"""``combee prompt get|watch|history|rollback``: read, or roll back, the learned prompt of a namespace."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from typing import Any

from combee.cli.base import CliError, add_connection_options, positive_int, prompt_client, stream_settings

__all__ = ["add_prompt_command", "cmd_prompt"]


def add_prompt_command(sub: Any) -> None:
    """Register ``prompt`` on ``combee``'s subparsers."""
    p = sub.add_parser("prompt", help="read the learned prompt of a namespace from Redis")
    psub = p.add_subparsers(dest="prompt_command", required=True, parser_class=type(p))
    g = psub.add_parser("get", help="print the current prompt")
    g.add_argument("namespace")
    g.add_argument("--json", action="store_true")
    w = psub.add_parser("watch", help="print every new version as it is published")
    w.add_argument("namespace")
    w.add_argument("--count", type=positive_int, help="stop after COUNT versions")
    w.add_argument("--timeout", type=float, help="stop after SECONDS without a new version")
    w.add_argument("--versions-only", action="store_true")
    h = psub.add_parser("history", help="list published versions, newest first")
    h.add_argument("namespace")
    h.add_argument("--limit", type=positive_int, default=20)
    r = psub.add_parser("rollback", help="publish an earlier version's content as a new version")
    r.add_argument("namespace")
    r.add_argument("--to", type=positive_int, required=True, metavar="VERSION")
    r.add_argument("--timeout", type=float, default=60.0)
    for q in (g, w, h, r):
        add_connection_options(q)
    p.set_defaults(func=cmd_prompt)


def cmd_prompt(args: argparse.Namespace) -> int:
    from streams.client import PromptUnavailable

    settings = stream_settings(args)
    if args.prompt_command == "rollback":
        return _rollback(settings, args)
    with prompt_client(settings, args.namespace) as client:
        try:
            if args.prompt_command == "get":
                v = client.get()
                if args.json:
                    print(json.dumps({"namespace": v.namespace, "version": v.version, "prompt": v.prompt,
                                      "window_id": v.window_id, "published_at": v.published_at}))  # fmt: skip
                else:
                    print(f"# namespace {v.namespace} · version {v.version} · window {v.window_id}", file=sys.stderr)
                    print(v.prompt, end="")
            elif args.prompt_command == "history":
                for h in client.history(limit=args.limit):
                    when = (
                        datetime.fromtimestamp(h.published_at).isoformat(timespec="seconds") if h.published_at else "-"
                    )
                    note = (h.meta or {}).get("note") or ""
                    print(f"v{h.version:<6} {when}  bullets={h.bullets}  tokens={h.tokens}  {h.window_id or ''} {note}")
            else:  # watch
                for count, v in enumerate(client.watch(timeout=args.timeout), start=1):
                    print(f"--- version {v.version} (window {v.window_id}) ---", flush=True)
                    if not args.versions_only:
                        print(v.prompt, flush=True)
                    if args.count and count >= args.count:
                        break
        except PromptUnavailable as exc:
            raise CliError(str(exc), 4) from None
    return 0


def _rollback(settings: Any, args: argparse.Namespace) -> int:
    from kafka import KafkaProducer

    from combee.models import validate_namespace
    from streams.codec import encode
    from streams.envelopes import Control
    from streams.kafka_config import kafka_security_kwargs
    from streams.topics import Topics

    validate_namespace(args.namespace)
    with prompt_client(settings, args.namespace) as client:
        before = client.get().version
        if not 1 <= args.to <= before:
            raise CliError(f"no version {args.to} to roll back to (current is {before})")
        topics = Topics(prefix=settings.topic_prefix, partitions=settings.partitions)
        producer = KafkaProducer(
            bootstrap_servers=settings.kafka_bootstrap, acks="all", **kafka_security_kwargs(settings)
        )
        ctrl = Control(namespace=args.namespace, kind="rollback", to_version=args.to, requested_at=time.time())
        producer.send(topics.partials, key=args.namespace.encode(), value=encode(ctrl)).get(timeout=30)
        producer.close()
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            v = client.get()
            if v.version > before:
                print(f"{args.namespace}: version {v.version} now holds the content of version {args.to}")
                return 0
            time.sleep(0.5)
    raise CliError(
        f"rollback requested, but no new version appeared within {args.timeout:g}s (is a worker running?)", 4
    )
