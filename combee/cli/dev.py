"""``combee dev``: start/stop a local Kafka + Redis (``deploy/local/``), and the local model with ``--llm``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_dev_command", "cmd_dev"]


def add_dev_command(sub: Any) -> None:
    """Register ``dev`` on ``combee``'s subparsers."""
    p = sub.add_parser("dev", help="start/stop a local Kafka + Redis (deploy/local/)")
    p.add_argument("dev_command", choices=["up", "down", "status", "restart", "fetch"])
    p.add_argument("rest", nargs=argparse.REMAINDER, help="options passed to deploy/local/")
    p.add_argument("--state-dir", type=Path)
    p.add_argument("--llm", action="store_true", help="up: also start the real local model (combee llm serve)")
    p.set_defaults(func=cmd_dev)


def cmd_dev(args: argparse.Namespace) -> int:
    from deploy import llm, local

    argv = [] if args.state_dir is None else ["--state-dir", str(args.state_dir)]
    with_llm = args.llm or "--llm" in args.rest
    llm_code = llm.main([*argv, "down", "--quiet"]) if args.dev_command == "down" else 0  # if one runs
    code = local.main([*argv, args.dev_command, *(a for a in args.rest if a != "--llm")])
    if code == 0 and with_llm and args.dev_command == "up":
        code = llm.main([*argv, "up"])
    return code or llm_code
