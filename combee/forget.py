"""Forgetting traces: rules naming one namespace's or one producer's traces, which learning must not use again.

A rule is a value (pure, no I/O): :func:`forgotten` says whether a trace falls under any rule. The rules are kept
in Redis (:mod:`streams.forget`), honoured by the window stage (live learning skips such a trace, counted) and by
``combee replay`` (a relearn from Kafka leaves them out), and set with ``combee traces forget``.

A producer is the trace's ``metadata["producer"]`` — a label the agent sets, not an authenticated identity: it
serves deletion requests ("forget what agent X sent"), not defence against a producer that lies about its name.
Forgetting hides traces from learning at once; the records themselves leave Kafka only when the traces topic's
retention (``COMBEE_TRACES_RETENTION_MS``) passes them — Kafka cannot delete single records from the middle of a
log (see docs/security.md, "Retention and deletion").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from combee.errors import ConfigError
from combee.models import Trace, one_line, validate_namespace

__all__ = ["PRODUCER_KEY", "ForgetRule", "forgotten", "parse_rules", "producer_of"]

PRODUCER_KEY = "producer"
"""The metadata key naming a trace's producer."""


def producer_of(trace: Trace) -> str | None:
    """The producer a trace names in its metadata, or None."""
    value = trace.metadata.get(PRODUCER_KEY)
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True, order=True)
class ForgetRule:
    """Every trace of ``namespace`` (any producer), every trace of ``producer`` (any namespace), or, with both,
    the traces of that producer in that namespace. At least one is set."""

    namespace: str | None = None
    producer: str | None = None

    def __post_init__(self) -> None:
        if self.namespace is None and self.producer is None:
            raise ConfigError("a forget rule names a namespace, a producer, or both")
        if self.namespace is not None:
            validate_namespace(self.namespace)
        if self.producer is not None and (not self.producer or one_line(self.producer) != self.producer):
            raise ConfigError("a producer name is one line of printable text")

    def matches(self, trace: Trace) -> bool:
        return self.covers(trace.namespace, producer_of(trace))

    def covers(self, namespace: str, producer: str | None) -> bool:
        """Whether the rule names what ``producer`` (None: unnamed) sent to ``namespace``."""
        if self.namespace is not None and namespace != self.namespace:
            return False
        return self.producer is None or producer == self.producer

    def encode(self) -> str:
        """The rule as one canonical JSON text (a Redis set member: the same rule twice is one member)."""
        return json.dumps({"namespace": self.namespace, "producer": self.producer}, sort_keys=True)

    def describe(self) -> str:
        parts = [
            f"namespace {self.namespace}" if self.namespace else "",
            f"producer {self.producer!r}" if self.producer else "",
        ]
        return " and ".join(p for p in parts if p)


def parse_rules(members: Iterable[str | bytes]) -> tuple[ForgetRule, ...]:
    """Rules from their stored texts, sorted; a member that is not a valid rule is skipped (never an error: a
    rule that cannot be read must not stop learning, and ``combee traces forgotten`` shows what was read)."""
    rules = set()
    for member in members:
        try:
            data = json.loads(member)
            rules.add(ForgetRule(namespace=data.get("namespace"), producer=data.get("producer")))
        except (ValueError, TypeError, AttributeError, ConfigError):
            continue
    return tuple(sorted(rules, key=lambda r: (r.namespace or "", r.producer or "")))


def forgotten(trace: Trace, rules: Sequence[ForgetRule]) -> bool:
    """True when any rule names ``trace``."""
    return any(rule.matches(trace) for rule in rules)
