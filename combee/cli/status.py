"""``combee status``: per namespace: version, traces seen, lag, windows in flight, controller."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from combee.cli.base import add_connection_options, service_errors, stream_settings

__all__ = ["add_status_command", "cmd_status"]


def add_status_command(sub: Any) -> None:
    """Register ``status`` on ``combee``'s subparsers."""
    p = sub.add_parser("status", help="per namespace: version, traces seen, lag, windows in flight, controller")
    p.add_argument("namespace", nargs="?")
    p.add_argument("--json", action="store_true")
    add_connection_options(p)
    p.set_defaults(func=service_errors(cmd_status))


def cmd_status(args: argparse.Namespace) -> int:
    from streams.status import collect_status

    settings = stream_settings(args)
    rows = asyncio.run(collect_status(settings, args.namespace))
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    if not rows:
        print("no namespaces published yet")
        return 0
    for row in rows:
        st = row.get("worker_status") or {}
        ctl = st.get("controller") or {}
        print(
            f"{row['namespace']}: version {row.get('version')}, traces seen {st.get('traces_seen', '-')}, "
            f"lag {row.get('lag', '-')}, windows in flight {st.get('windows_in_flight', '-')}, "
            f"buffered {st.get('buffered', '-')}"
        )
        print(f"  controller: {ctl.get('why', 'no report from a worker (is one running?)')}")
    return 0
