"""``combee dev``: start/stop a local Kafka + Redis (``deploy/local/``), and the local model with ``--llm``.

``up`` also creates Combee's topics (``combee topics create`` against the services just started), so a fleet
can publish before any worker runs. Its stdout stays the ``export`` lines to ``eval``; the topics' report goes
to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
import sys
from pathlib import Path
from typing import Any

from combee.cli.base import EXIT_SERVICE, CliError, first_line

__all__ = ["add_dev_command", "cmd_dev", "exported_env"]


def add_dev_command(sub: Any) -> None:
    """Register ``dev`` on ``combee``'s subparsers."""
    p = sub.add_parser("dev", help="start/stop a local Kafka + Redis (deploy/local/)")
    p.add_argument("dev_command", choices=["up", "down", "status", "restart", "fetch"])
    p.add_argument("rest", nargs=argparse.REMAINDER, help="options passed to deploy/local/")
    p.add_argument("--state-dir", type=Path)
    p.add_argument("--llm", action="store_true", help="up: also start the real local model (combee llm serve)")
    p.add_argument("--no-topics", action="store_true", help="up: do not create Combee's topics")
    p.set_defaults(func=cmd_dev)


def cmd_dev(args: argparse.Namespace) -> int:
    from deploy import llm, local

    argv = [] if args.state_dir is None else ["--state-dir", str(args.state_dir)]
    with_llm = args.llm or "--llm" in args.rest
    no_topics = args.no_topics or "--no-topics" in args.rest
    rest = [a for a in args.rest if a not in ("--llm", "--no-topics")]
    llm_code = llm.main([*argv, "down", "--quiet"]) if args.dev_command == "down" else 0  # if one runs
    if args.dev_command == "up":
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):
            code = local.main([*argv, "up", *rest])
        sys.stdout.write(captured.getvalue())
        sys.stdout.flush()
        if code == 0 and not no_topics:
            _create_topics(exported_env(captured.getvalue()))
    else:
        code = local.main([*argv, args.dev_command, *rest])
    if code == 0 and with_llm and args.dev_command == "up":
        code = llm.main([*argv, "up"])
    return code or llm_code


def exported_env(text: str) -> dict[str, str]:
    """``{NAME: value}`` of the ``export NAME=value`` lines ``deploy.local up`` prints (other lines ignored)."""
    env = {}
    for line in text.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, value = words[1].split("=", 1)
            env[name] = value
    return env


def _create_topics(env: dict[str, str]) -> None:
    """Create the topics on the services ``up`` reported (bootstrap, and replication on a local cluster)."""
    from combee.cli.topics import create_topics
    from combee.settings import Settings

    fields = {
        "COMBEE_KAFKA_BOOTSTRAP": "kafka_bootstrap",
        "COMBEE_REPLICATION_FACTOR": "replication_factor",
        "COMBEE_MIN_INSYNC_REPLICAS": "min_insync_replicas",
    }
    try:
        given: dict[str, Any] = {field: env[name] for name, field in fields.items() if name in env}
        settings = Settings(**given)
        report = create_topics(settings)
    except Exception as exc:  # the services are up; say why the topics are not, in one line
        raise CliError(
            f"Kafka and Redis are up, but creating the topics failed: {type(exc).__name__}: {first_line(exc)} "
            "(retry with `combee topics create`)",
            EXIT_SERVICE,
        ) from None
    sys.stderr.write(
        f"combee dev up: topics under prefix {settings.topic_prefix}: {len(report.created)} created, "
        f"{len(report.existing)} already there\n"
    )
