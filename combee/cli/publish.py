"""``combee publish``: publish a JSON-lines trace file to the traces topic, or trusted feedback (``--feedback``,
signed; combee/feedback.py) to the feedback topic."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from combee.cli.base import add_connection_options, load_trace_file, service_errors, stream_settings

__all__ = ["add_publish_command", "cmd_publish"]


def add_publish_command(sub: Any) -> None:
    """Register ``publish`` on ``combee``'s subparsers."""
    p = sub.add_parser("publish", help="publish a JSON-lines trace file to the traces topic")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--traces", type=Path)
    what.add_argument(
        "--feedback",
        type=Path,
        help='trusted feedback, one JSON object a line: {"trace_id": ..., "namespace": ..., "feedback": {"success": '
        "..., ...}}, signed as --producer (docs/security.md, 'Trusted feedback')",
    )
    p.add_argument("--namespace", help="publish every trace (or feedback record) into this namespace")
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
    if args.feedback is not None:
        return _publish_feedback(args, settings)
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


def _publish_feedback(args: argparse.Namespace, settings: Any) -> int:
    """Every line of ``--feedback`` validated first (one bad line: nothing sent, exit 2), then signed and sent."""
    from pydantic import ValidationError

    from combee.errors import ConfigError, InvalidNamespace
    from combee.feedback import FeedbackRecord
    from combee.models import validate_namespace
    from streams.publisher import FeedbackPublisher

    records = []
    for n, line in enumerate(args.feedback.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{args.feedback}:{n}: not JSON: {exc}"[:300]) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("trace_id"), str):
            raise ConfigError(f'{args.feedback}:{n}: needs {{"trace_id": ..., "namespace": ..., "feedback": {{...}}}}')
        namespace = args.namespace or obj.get("namespace")
        if not isinstance(namespace, str):
            raise ConfigError(f"{args.feedback}:{n}: no namespace (give one, or --namespace)")
        try:
            record = FeedbackRecord(trace_id=obj["trace_id"], namespace=namespace, feedback=obj.get("feedback", {}))
            validate_namespace(namespace)
        except (ValidationError, InvalidNamespace) as exc:
            raise ConfigError(f"{args.feedback}:{n}: invalid feedback record: {exc}"[:300]) from None
        records.append(record)
    topics = settings.topics()
    with FeedbackPublisher(settings, topics) as publisher:
        for r in records:
            publisher.publish(r.namespace, r.trace_id, r.feedback)
        publisher.flush(60)
        producer, failed = publisher.signer.producer, publisher.failed
    print(f"published {len(records) - failed} feedback records to {topics.feedback} (signed as {producer})")
    return 1 if failed else 0
