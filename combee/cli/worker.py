"""``combee worker``: run the streaming workers (Faust) until stopped, or until idle."""

from __future__ import annotations

import argparse
from typing import Any

from combee.cli.base import add_connection_options, positive_int, service_errors, stream_settings

__all__ = ["add_worker_command", "cmd_worker"]


def add_worker_command(sub: Any) -> None:
    """Register ``worker`` on ``combee``'s subparsers."""
    p = sub.add_parser("worker", help="run the streaming workers (Faust)")
    p.add_argument(
        "--role",
        choices=["all", "learner", "curate"],
        default="all",
        help="learner: own namespaces (window, plan, combine); curate: the pool (reflection and curator tasks "
        "of every namespace); all (default): both",
    )
    p.add_argument("--until-idle", type=float, metavar="SECONDS", help="exit after SECONDS with nothing to do")
    p.add_argument("--concurrency", type=positive_int, help="curator calls in flight (default 8)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_connection_options(p)
    p.set_defaults(func=service_errors(cmd_worker))


def cmd_worker(args: argparse.Namespace) -> int:
    from workers.main import run_worker

    settings = stream_settings(args)
    if args.concurrency:
        settings = settings.model_copy(update={"curate_concurrency": args.concurrency})
    roles = ("learner", "curate") if args.role == "all" else (args.role,)
    return run_worker(settings, roles=roles, until_idle_s=args.until_idle, loglevel=args.log_level)
