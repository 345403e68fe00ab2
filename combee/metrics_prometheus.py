"""The metrics port on Prometheus (``prometheus-client``): the registry, every family, and its HTTP endpoint.

One :class:`PrometheusMetrics` per worker process owns a registry of its own (nothing global, so tests and
several instances never collide). :data:`FAMILIES` names every family it exports — the contract with
``deploy/prometheus.yml`` and the dashboard in ``deploy/grafana/`` (tests/unit/test_metrics.py checks every
panel's query against it). Counters are exported with the ``_total`` suffix, histograms as ``_bucket``,
``_sum`` and ``_count``. docs/operations.md describes each family.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import start_http_server
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from combee.corroborate import HELD_REASONS
from combee.errors import PARSE_FAILURE_KINDS, TRACE_ERROR_KINDS
from combee.feedback import OUTCOMES as FEEDBACK_OUTCOMES
from combee.feedback import REFUSALS as FEEDBACK_REFUSALS
from combee.feedback import TIMEOUT_KIND
from combee.guard import REASONS as GUARD_REASONS
from combee.identity import REFUSALS as IDENTITY_REFUSALS
from combee.labels import OTHER, BoundedLabels
from combee.llm import Role
from combee.meter import Meter
from combee.metrics import LLMPrices
from combee.namespaces import NAMESPACE_LIMIT_KIND
from combee.outcomes import OUTCOMES, OutcomeCounts
from combee.quotas import QUOTA_KIND

__all__ = ["FAMILIES", "LATENCY_BUCKETS_S", "PrometheusMetrics", "sample_sum"]

# From a simulated run (tenths of a second) to a real model's large windows (tens of minutes).
LATENCY_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


class PrometheusMetrics:
    """:class:`combee.metrics.Metrics` on a private Prometheus registry; :meth:`serve` exposes it over HTTP."""

    def __init__(self, prices: LLMPrices | None = None, max_namespaces: int = 100) -> None:
        self.prices = prices or LLMPrices()
        # namespaces are chosen by producers: past the first max_namespaces, their series are one, "(other)"
        self._ns = BoundedLabels(max_namespaces)
        self._series_made: set[str] = set()  # namespace labels whose series namespace_seen has created
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._traces = Counter(
            "combee_traces",
            "Trace records by outcome: accepted (by the map stage), duplicate (windowed before), dead_lettered "
            "(with the reason's kind).",
            ["namespace", "outcome", "reason"],
            registry=r,
        )
        self._windows = Counter(
            "combee_windows", "Windows by stage reached: closed, mapped, applied.", ["namespace", "stage"], registry=r
        )
        self._version = Gauge(
            "combee_prompt_version", "The newest prompt version this worker saw Redis hold.", ["namespace"], registry=r
        )
        self._bullets = Gauge(
            "combee_playbook_bullets", "Bullets of the playbook this worker holds.", ["namespace"], registry=r
        )
        self._lag = Gauge(
            "combee_consumer_lag",
            "Records of an assigned partition not yet processed (end offset minus the first unfinished offset).",
            ["topic", "partition"],
            registry=r,
        )
        self._latency = Histogram(
            "combee_window_latency_seconds",
            "Seconds from a window's closing to a step: mapped, applied, published (to Redis).",
            ["namespace", "step"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self._batch = Gauge(
            "combee_batch_size", "The window size the controller chose (or is trying).", ["namespace"], registry=r
        )
        self._controls_refused = Counter(
            "combee_control_records_refused",
            "Control records (rollback) dead-lettered: unsigned or bad_signature (COMBEE_CONTROL_KEY).",
            ["reason"],
            registry=r,
        )
        self._fenced = Counter(
            "combee_fenced_writes",
            "Delta records refused because another owner claimed the partition first (zombie writes).",
            ["namespace"],
            registry=r,
        )
        self._llm_calls = Counter(
            "combee_llm_calls",
            "LLM answers by role and outcome: ok (parsed), unparsable; unavailable counts steps that failed on "
            "an outage or rate limit after the client's retries.",
            ["role", "outcome"],
            registry=r,
        )
        self._llm_tokens = Counter(
            "combee_llm_tokens",
            "LLM tokens by role and kind: prompt, completion, cached_prompt.",
            ["role", "kind"],
            registry=r,
        )
        self._llm_cost = Counter(
            "combee_llm_cost_usd", "Dollars at COMBEE_LLM_PRICE_PER_1K_* (0 when unset).", ["role"], registry=r
        )
        self._parse_failures = Counter(
            "combee_llm_parse_failures", "Answers that did not parse, by role and kind.", ["role", "kind"], registry=r
        )
        self._repairs = Counter(
            "combee_llm_repairs", "Re-asks that carried the parser's error back to the model.", ["role"], registry=r
        )
        self._gave_up = Counter(
            "combee_llm_gave_up",
            "Calls whose every answer failed to parse (that item was skipped).",
            ["role"],
            registry=r,
        )
        self._dependency_up = Gauge(
            "combee_dependency_up",
            "1 when the worker's last check found the dependency up (llm, embeddings, kafka, redis), 0 when down.",
            ["dependency"],
            registry=r,
        )
        self._moved = Counter(
            "combee_traces_moved",
            "Traces that arrived on another partition than their namespace's (a producer that does not partition "
            "by murmur2 of the namespace) and were published again to the right one: each is stored twice.",
            ["namespace"],
            registry=r,
        )
        self._outcomes = _OutcomeCollector()
        r.register(self._outcomes)
        self._quarantined = Counter(
            "combee_bullets_quarantined",
            "Lessons the guard held back instead of publishing them, by reason (combee.guard.REASONS; "
            "`combee bullet list NS --quarantined`).",
            ["namespace", "reason"],
            registry=r,
        )
        self._feedback = Counter(
            "combee_feedback",
            "Trusted feedback (combee/feedback.py), by outcome: joined to its trace, early (came first, kept), "
            "duplicate, late, expired (its trace never came), ignored (an agent-feedback namespace), refused (reason: "
            "unsigned, unknown_producer, bad_signature, feedback_not_allowed), timed_out (a trace whose record "
            "did not come in COMBEE_FEEDBACK_WAIT_S).",
            ["namespace", "outcome", "reason"],
            registry=r,
        )
        self._held = Counter(
            "combee_lessons_held",
            "Operations and harmful tags corroboration held back, by reason (combee.corroborate.HELD_REASONS; "
            "`combee bullet list NS --pending`).",
            ["namespace", "reason"],
            registry=r,
        )
        self._decisions = Counter(
            "combee_promotion_decisions",
            "Promotion decisions applied: action promote, reject or rollback; by operator, canary, gate or outcomes (a "
            "rollback on outcomes), docs/promotion.md.",
            ["namespace", "action", "by"],
            registry=r,
        )
        self._live = Gauge(
            "combee_namespaces_live",
            "Namespaces this worker holds in memory (COMBEE_MAX_NAMESPACES caps it; idle ones are evicted).",
            registry=r,
        )
        self._evicted = Counter(
            "combee_namespaces_evicted",
            "Namespaces let go after COMBEE_NAMESPACE_IDLE_S with nothing buffered or in flight (rebuilt from Kafka "
            "when they come back).",
            registry=r,
        )
        self._traces_held = Counter(
            "combee_traces_held",
            "Traces held back because their namespace's window buffer was full (read again from Kafka when there "
            "is room); the other namespaces of the partition go on.",
            ["namespace"],
            registry=r,
        )
        ProcessCollector(registry=r)  # process_resident_memory_bytes, process_cpu_seconds_total, ...
        self._server: Any = None
        self._thread: threading.Thread | None = None
        # Error counters exist at 0 from the start, so a dashboard shows 0 rather than "No data" before the
        # first error; a namespace's own start when the worker takes it on (namespace_seen).
        for role in (Role.REFLECTOR, Role.CURATOR, Role.MERGER):
            self._llm_calls.labels(role.value, "unavailable")
            self._repairs.labels(role.value)
            self._gave_up.labels(role.value)
            for kind in PARSE_FAILURE_KINDS:
                self._parse_failures.labels(role.value, kind)
        self.namespace_seen("")  # dead letters whose key names no namespace

    # --- the port ------------------------------------------------------------------------------------------

    def trace_accepted(self, namespace: str, n: int = 1) -> None:
        self._traces.labels(self._ns(namespace), "accepted", "").inc(n)

    def trace_duplicate(self, namespace: str, n: int = 1) -> None:
        self._traces.labels(self._ns(namespace), "duplicate", "").inc(n)

    def trace_dead_lettered(self, namespace: str, reason: str) -> None:
        self._traces.labels(self._ns(namespace), "dead_lettered", reason).inc()

    def window_closed(self, namespace: str) -> None:
        self._windows.labels(self._ns(namespace), "closed").inc()

    def window_mapped(self, namespace: str, since_closed_s: float) -> None:
        self._windows.labels(self._ns(namespace), "mapped").inc()
        self._latency.labels(self._ns(namespace), "mapped").observe(max(0.0, since_closed_s))

    def window_applied(self, namespace: str, since_closed_s: float) -> None:
        self._windows.labels(self._ns(namespace), "applied").inc()
        self._latency.labels(self._ns(namespace), "applied").observe(max(0.0, since_closed_s))

    def playbook_size(self, namespace: str, bullets: int) -> None:
        if (label := self._ns(namespace)) != OTHER:  # a gauge of many namespaces at once would mean nothing
            self._bullets.labels(label).set(bullets)

    def prompt_published(self, namespace: str, version: int, since_closed_s: float | None) -> None:
        label = self._ns(namespace)
        if label != OTHER:
            self._version.labels(label).set(version)
        if since_closed_s is not None:
            self._latency.labels(label, "published").observe(max(0.0, since_closed_s))

    def batch_size(self, namespace: str, size: int) -> None:
        if (label := self._ns(namespace)) != OTHER:
            self._batch.labels(label).set(size)

    def consumer_lag(self, topic: str, partition: int, lag: int | None) -> None:
        if lag is None:
            with contextlib.suppress(KeyError):  # never reported
                self._lag.remove(topic, str(partition))
            return
        self._lag.labels(topic, str(partition)).set(max(0, lag))

    def llm_usage(self, meter: Meter) -> None:
        for role, s in sorted(meter.roles.items()):
            ok = s.calls - s.parse_failures
            if ok > 0:
                self._llm_calls.labels(role, "ok").inc(ok)
            if s.parse_failures:
                self._llm_calls.labels(role, "unparsable").inc(s.parse_failures)
            for kind, n in (
                ("prompt", s.prompt_tokens),
                ("completion", s.completion_tokens),
                ("cached_prompt", s.cached_prompt_tokens),
            ):
                if n:
                    self._llm_tokens.labels(role, kind).inc(n)
            cost = self.prices.cost_usd(s.prompt_tokens, s.completion_tokens)
            self._llm_cost.labels(role).inc(cost)
            for kind, n in sorted(s.failure_kinds.items()):
                self._parse_failures.labels(role, kind).inc(n)
            if s.repairs:
                self._repairs.labels(role).inc(s.repairs)
            if s.gave_up:
                self._gave_up.labels(role).inc(s.gave_up)

    def llm_unavailable(self, role: Role) -> None:
        self._llm_calls.labels(role.value, "unavailable").inc()

    def fenced_write(self, namespace: str) -> None:
        self._fenced.labels(self._ns(namespace)).inc()

    def dependency_up(self, dependency: str, up: bool) -> None:
        self._dependency_up.labels(dependency).set(1 if up else 0)

    def namespace_seen(self, namespace: str) -> None:
        label = self._ns(namespace)
        self._series_made.add(label)
        for reason in (*TRACE_ERROR_KINDS, QUOTA_KIND, NAMESPACE_LIMIT_KIND, *IDENTITY_REFUSALS, TIMEOUT_KIND):
            self._traces.labels(label, "dead_lettered", reason)
        if label:
            self._fenced.labels(label)
            self._moved.labels(label)
            self._traces_held.labels(label)
            for reason in GUARD_REASONS:
                self._quarantined.labels(label, reason)

    def trace_moved(self, namespace: str) -> None:
        # a moved trace may be the first this worker sees of its namespace (it is admitted on its home partition,
        # perhaps by another worker): its series exist from here on, as for a namespace admitted here
        label = self._ns(namespace)
        if label not in self._series_made:
            self.namespace_seen(namespace)
        self._moved.labels(label).inc()

    def control_refused(self, reason: str) -> None:
        self._controls_refused.labels(reason).inc()

    def trace_forgotten(self, namespace: str) -> None:
        self._traces.labels(self._ns(namespace), "forgotten", "").inc()

    def outcome_totals(self, totals: Mapping[str, Mapping[str, OutcomeCounts]]) -> None:
        self._outcomes.totals = {ns: dict(rows) for ns, rows in totals.items()}

    def bullet_quarantined(self, namespace: str, reason: str) -> None:
        self._quarantined.labels(self._ns(namespace), reason if reason in GUARD_REASONS else "other").inc()

    def lessons_held(self, namespace: str, reason: str, n: int = 1) -> None:
        self._held.labels(self._ns(namespace), reason if reason in HELD_REASONS else "other").inc(n)

    def promotion_decision(self, namespace: str, action: str, by: str) -> None:
        known = action if action in ("promote", "reject", "rollback") else "other"
        self._decisions.labels(
            self._ns(namespace), known, by if by in ("operator", "canary", "gate", "outcomes") else "other"
        ).inc()

    def namespaces_live(self, count: int) -> None:
        self._live.set(count)

    def namespace_evicted(self, namespace: str) -> None:
        self._evicted.inc()

    def trace_held(self, namespace: str) -> None:
        self._traces_held.labels(self._ns(namespace)).inc()

    def feedback(self, namespace: str, outcome: str, reason: str = "") -> None:
        known = outcome if outcome in FEEDBACK_OUTCOMES else "other"
        why = (reason if reason in (*FEEDBACK_REFUSALS, "invalid") else "other") if reason else ""
        self._feedback.labels(self._ns(namespace), known, why).inc()

    # --- exposition ----------------------------------------------------------------------------------------

    def render(self) -> bytes:
        """The text exposition format, as ``GET /metrics`` answers."""
        return generate_latest(self.registry)

    def families(self) -> set[str]:
        """The names of the families the registry exports (without sample suffixes)."""
        return {family.name for family in self.registry.collect()}

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Answer ``GET /metrics`` on ``host:port`` from a daemon thread; returns the port bound (0: a free one).

        Raises OSError when the port is taken.
        """
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        bound: int = self._server.server_port
        return bound

    def close(self) -> None:
        """Stop the HTTP endpoint (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _OutcomeCollector(Collector):
    """``combee_outcomes_total{namespace,version,outcome}``: the exact counts Redis holds, as the worker last read
    them for the namespaces it owns. Versions are already bounded (the newest few, ``older``, ``unknown``)."""

    def __init__(self) -> None:
        self.totals: dict[str, dict[str, OutcomeCounts]] = {}

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "combee_outcomes",
            "Traces that named the playbook version they ran with, by outcome (success, failure, unknown), counted "
            "exactly once; version 'older' sums versions past the newest few, 'unknown' one above the live version.",
            labels=["namespace", "version", "outcome"],
        )
        for ns, rows in sorted(self.totals.items()):
            for version, counts in sorted(rows.items()):
                for outcome in OUTCOMES:
                    family.add_metric([ns, version, outcome], counts.count(outcome))
        yield family


# Every family exported, as the registry names them (a counter's samples add ``_total``).
FAMILIES = frozenset(PrometheusMetrics().families())


def sample_sum(exposition: str, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``, read from a ``GET /metrics``
    answer (what a scraper would see; 0.0 when there are none)."""
    return sum(
        s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )
