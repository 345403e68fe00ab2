"""The Kafka rights each kind of Combee client needs, as data (docs/security.md, "What each principal needs").

One table serves three readers: ``combee topics acls ROLE --principal P`` prints the ``kafka-acls.sh`` commands
an operator runs; the fault suite grants exactly these rights on a broker whose authorizer enforces them and
checks that the pipeline runs and that a producer cannot write an internal topic; docs/security.md describes
them in words. Pure: no client, no broker.

Names: ``<prefix>`` is ``COMBEE_TOPIC_PREFIX``. The internal topics are the ``<prefix>.`` topics other than the
traces topic, and the topics Faust creates for the worker's app (``<prefix>-worker…``); the worker's consumer
groups are named ``<prefix>-worker…`` too. Combee uses no transactions, and Kafka ≥ 3.0's idempotent producer
needs only ``Write`` on its topic.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["ROLES", "Grant", "Role", "grants", "kafka_acls_commands"]


class Role(StrEnum):
    PRODUCER = "producer"  # an agent's TracePublisher, or any client publishing traces
    FEEDBACK = "feedback"  # a trusted feedback source's FeedbackPublisher (a grader, a review tool)
    WORKER = "worker"  # combee worker, every role
    OPERATOR = "operator"  # combee prompt rollback / bullet / replay / topics / status


ROLES = tuple(r.value for r in Role)


@dataclass(frozen=True)
class Grant:
    """Allow ``operations`` on a resource: a topic or a consumer group, named literally or by prefix."""

    resource: str  # "topic" | "group"
    name: str
    prefixed: bool
    operations: tuple[str, ...]  # Kafka operation names: Read, Write, Describe, Create, DescribeConfigs, ...


def grants(role: Role, prefix: str) -> tuple[Grant, ...]:
    """What ``role`` needs on the topics and groups of the deployment whose topic prefix is ``prefix``."""
    traces = f"{prefix}.traces"
    internal = (f"{prefix}.", f"{prefix}-worker")
    if role is Role.PRODUCER:
        return (Grant("topic", traces, False, ("Write", "Describe")),)
    if role is Role.FEEDBACK:
        # apart from the producers: an agent that may write traces cannot write its own trusted feedback
        return (Grant("topic", f"{prefix}.feedback", False, ("Write", "Describe")),)
    if role is Role.WORKER:
        # the worker creates and reads every topic (the traces topic too, when it is missing); the prefixed
        # grant on "<prefix>." therefore also covers <prefix>.traces
        topic_ops = ("Read", "Write", "Describe", "Create", "DescribeConfigs")
        return (
            *(Grant("topic", name, True, topic_ops) for name in internal),
            Grant("group", f"{prefix}-worker", True, ("Read", "Describe")),
        )
    return (
        Grant("topic", f"{prefix}.partials", False, ("Write", "Describe")),  # rollback, bullet actions
        Grant("topic", f"{prefix}.windows", False, ("Write", "Describe")),  # replay
        Grant("topic", traces, False, ("Read", "Describe")),  # replay
        Grant("topic", f"{prefix}.deltas", False, ("Read", "Describe")),  # replay, status
        Grant("topic", f"{prefix}.", True, ("Create", "Describe", "DescribeConfigs", "AlterConfigs")),  # topics
        Grant("group", f"{prefix}-worker", True, ("Describe",)),  # status: lag
    )


def kafka_acls_commands(role: Role, prefix: str, principal: str, bootstrap: str = "BROKER:9092") -> list[str]:
    """The ``kafka-acls.sh`` command lines that give ``principal`` (e.g. ``User:combee-worker``) its rights."""
    lines = []
    for g in grants(role, prefix):
        flag = "--topic" if g.resource == "topic" else "--group"
        pattern = " --resource-pattern-type prefixed" if g.prefixed else ""
        ops = " ".join(f"--operation {op}" for op in g.operations)
        lines.append(
            f"kafka-acls.sh --bootstrap-server {bootstrap} --add --allow-principal {principal} "
            f"{flag} '{g.name}'{pattern} {ops}"
        )
    return lines
