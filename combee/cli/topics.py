"""``combee topics create|describe|acls``: Combee's Kafka topics as a deployment step, from the workers' own specs.

Both read the topic definitions the workers use (:meth:`streams.topics.Topics.specs` under ``--prefix`` and
``--partitions``), so what is created here is exactly what ``combee worker`` would create (and then only
verifies). ``create`` is idempotent: topics that exist are left as they are (drift in their configs is
reported, never changed). ``acls`` prints the ``kafka-acls.sh`` commands that give one principal the rights
of its role (:mod:`streams.acls`); it contacts nothing.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any, TextIO

from combee.cli.base import add_connection_options, positive_int, service_errors, stream_settings
from streams.acls import ROLES, Role, kafka_acls_commands

if TYPE_CHECKING:
    from combee.settings import Settings
    from streams.kafka_config import TopicsReport, TopicState

__all__ = ["add_topics_command", "cmd_topics", "create_topics", "format_states", "settings_for"]


def add_topics_command(sub: Any) -> None:
    """Register ``topics`` on ``combee``'s subparsers."""
    p = sub.add_parser("topics", help="create or describe Combee's Kafka topics (a deployment step)")
    tsub = p.add_subparsers(dest="topics_command", required=True, parser_class=type(p))
    c = tsub.add_parser("create", help="create every missing topic (idempotent)")
    d = tsub.add_parser("describe", help="each topic's partitions and replication, beside its spec")
    for q in (c, d):
        q.add_argument(
            "--partitions",
            type=positive_int,
            help="partitions of every keyed topic (default: $COMBEE_PARTITIONS or 4; the workers' setting)",
        )
        q.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for Kafka (default 30)")
        add_connection_options(q)
    c.add_argument(
        "--replication-factor",
        type=positive_int,
        help="replicas of each new topic (default: $COMBEE_REPLICATION_FACTOR or 1)",
    )
    c.add_argument(
        "--min-insync-replicas",
        type=positive_int,
        help="min.insync.replicas of each new topic (default: $COMBEE_MIN_INSYNC_REPLICAS, else the broker's)",
    )
    a = tsub.add_parser("acls", help="print the kafka-acls.sh commands that give one principal its rights")
    a.add_argument("role", choices=ROLES, help="producer (publishes traces), worker, or operator (the CLI)")
    a.add_argument("--principal", required=True, help="the Kafka principal, e.g. User:combee-worker")
    a.add_argument("--prefix", help="topic prefix (default: $COMBEE_TOPIC_PREFIX or combee)")
    a.add_argument("--bootstrap", default="BROKER:9092", help="the --bootstrap-server in the printed commands")
    p.set_defaults(func=service_errors(cmd_topics))


def settings_for(args: argparse.Namespace) -> Settings:
    """The settings of a ``topics`` verb: environment, then the service and topic options given."""
    settings = stream_settings(args)
    updates = {
        field: value
        for arg, field in (
            ("partitions", "partitions"),
            ("replication_factor", "replication_factor"),
            ("min_insync_replicas", "min_insync_replicas"),
        )
        if (value := getattr(args, arg, None)) is not None
    }
    return settings.model_copy(update=updates) if updates else settings


def cmd_topics(args: argparse.Namespace) -> int:
    if args.topics_command == "acls":
        prefix = stream_settings(args).topic_prefix  # --prefix, else the environment's
        for line in kafka_acls_commands(Role(args.role), prefix, args.principal, args.bootstrap):
            print(line)
        return 0
    settings = settings_for(args)
    if args.topics_command == "create":
        report = create_topics(settings, timeout_s=args.timeout)
        _print_report(report, settings, sys.stdout)
        return 0
    from streams.kafka_config import create_topics_command, describe_topics

    topics = settings.topics()
    states = describe_topics(settings, topics, timeout_s=args.timeout)
    print(format_states(states), end="")
    if any(not s.exists for s in states):
        command = create_topics_command(settings.kafka_bootstrap, topics)
        sys.stderr.write(f"combee: some topics are missing; create them with: {command}\n")
    return 0 if all(s.ok for s in states) else 1


def create_topics(settings: Settings, *, timeout_s: float = 30.0) -> TopicsReport:
    """Create Combee's missing topics as the workers would (the settings' prefix, partitions, replication).

    Raises ConfigError when an existing topic has another partition count or the broker refuses a creation;
    kafka-python's errors when Kafka cannot be reached.
    """
    from streams.kafka_config import ensure_topics

    return ensure_topics(settings, settings.topics(), timeout_s=timeout_s)


def _print_report(report: TopicsReport, settings: Settings, out: TextIO) -> None:
    for name in report.created:
        out.write(f"created  {name}\n")
    for name in report.existing:
        out.write(f"exists   {name}\n")
    for name, diffs in sorted(report.config_drift.items()):
        for key, (actual, expected) in sorted(diffs.items()):
            out.write(f"drift    {name}: {key}={actual} (the spec says {expected}; left as it is)\n")
    out.write(
        f"{len(report.created)} created, {len(report.existing)} already there "
        f"(prefix {settings.topic_prefix}, {settings.partitions} partitions, "
        f"replication factor {settings.replication_factor} for new topics)\n"
    )


def format_states(states: list[TopicState]) -> str:
    """A table of topics: name, partitions (and the spec's when they differ), replicas, state, key, purpose."""
    rows = [("TOPIC", "PARTITIONS", "REPLICAS", "STATE", "KEYED BY", "HOLDS")]
    for s in states:
        if not s.exists:
            partitions, replicas, state = "-", "-", "missing"
        else:
            partitions = str(s.partitions) if s.ok else f"{s.partitions} (spec {s.spec.partitions})"
            replicas = str(s.replication_factor) if s.replication_factor is not None else "?"
            state = "ok" if s.ok else "wrong partitions"
        rows.append((s.spec.name, partitions, replicas, state, s.spec.keyed_by, s.spec.doc))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r[:5])) + "  " + r[5] + "\n" for r in rows)
