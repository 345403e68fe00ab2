"""``combee publish``: publish a JSON-lines trace file to the traces topic."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from combee.cli.base import add_connection_options, load_trace_file, service_errors, stream_settings

__all__ = ["add_publish_command", "cmd_publish"]


def add_publish_command(sub: Any) -> None:
    """Register ``publish`` on ``combee``'s subparsers."""
    p = sub.add_parser("publish", help="publish a JSON-lines trace file to the traces topic")
    p.add_argument("--traces", type=Path, required=True)
    p.add_argument("--namespace", help="publish every trace into this namespace")
    p.add_argument(
        "--producer",
        help="sign every trace as this producer (default COMBEE_PRODUCER_ID) with the key COMBEE_PRODUCER_KEY "
        "(an environment variable, never an option: docs/security.md, 'Signed traces')",
    )
    add_connection_options(p)
    p.set_defaults(func=service_errors(cmd_publish))


def cmd_publish(args: argparse.Namespace) -> int:
    from streams.publisher import TracePublisher

    settings = stream_settings(args)
    if args.producer:
        settings = settings.model_copy(update={"producer_id": args.producer})
    traces, skipped = load_trace_file(args.traces, args.namespace, sys.stderr)
    topics = settings.topics()
    with TracePublisher(settings, topics) as publisher:
        publisher.publish_many(traces)
        publisher.flush(60)
        failed = publisher.failed
    counts: dict[str, int] = {}
    for t in traces:
        counts[t.namespace] = counts.get(t.namespace, 0) + 1
    summary = ", ".join(f"{ns}: {n}" for ns, n in sorted(counts.items()))
    signed = f"signed as {publisher.signer.producer}" if publisher.signer is not None else "unsigned"
    print(
        f"published {len(traces) - failed} traces to {topics.traces} ({summary}; {signed}); "
        f"{skipped} malformed lines skipped"
    )
    return 1 if failed else 0
