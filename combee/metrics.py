"""The metrics port: what a worker reports about its work, as plain values (docs/operations.md).

The stages call a :class:`Metrics` at the points where work is done (a trace accepted, a window applied, a
version published) and never know where the numbers go. :class:`NoMetrics` (metrics off, the default) does
nothing; the Prometheus implementation is :class:`combee.metrics_prometheus.PrometheusMetrics`, built by the
composition root (:func:`combee.wiring.build_metrics`). Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from combee.llm import LLMPrices, Role
from combee.meter import Meter
from combee.outcomes import OutcomeCounts

__all__ = ["LLMPrices", "Metrics", "NoMetrics"]  # LLMPrices: re-exported from combee.llm


class Metrics(Protocol):
    """What the workers report. Every method returns at once and never raises for a value it is given.

    Latencies are seconds since the window was closed (``closed_at`` of its envelope, wall clock).
    """

    def trace_accepted(self, namespace: str, n: int = 1) -> None:
        """``n`` traces of ``namespace`` accepted by the map stage (first delivery of their window)."""

    def trace_duplicate(self, namespace: str, n: int = 1) -> None:
        """``n`` traces dropped or re-mapped because they were windowed before (a redelivery)."""

    def trace_dead_lettered(self, namespace: str, reason: str) -> None:
        """A trace record dead-lettered; ``reason`` is a short kind (``json``, ``invalid``, ...), not a message."""

    def window_closed(self, namespace: str) -> None: ...

    def window_mapped(self, namespace: str, since_closed_s: float) -> None: ...

    def window_applied(self, namespace: str, since_closed_s: float) -> None: ...

    def playbook_size(self, namespace: str, bullets: int) -> None:
        """The playbook this worker holds for ``namespace`` has ``bullets`` bullets (after a commit or recovery)."""

    def prompt_published(self, namespace: str, version: int, since_closed_s: float | None) -> None:
        """Redis holds ``version`` of ``namespace`` (written now, or found there already)."""

    def batch_size(self, namespace: str, size: int) -> None:
        """The window size the controller chose (or is trying) for ``namespace``."""

    def consumer_lag(self, topic: str, partition: int, lag: int | None) -> None:
        """Records of ``topic``/``partition`` not yet processed; None: the partition is no longer this worker's."""

    def llm_usage(self, meter: Meter) -> None:
        """Fold one step's accounting (calls, tokens, parse failures, repairs per role) into the totals."""

    def llm_unavailable(self, role: Role) -> None:
        """A step of ``role`` failed on an LLM outage or rate limit (after the client's retries); it waits."""

    def fenced_write(self, namespace: str) -> None:
        """A delta record logged after another owner's claim, refused (a zombie combiner's write)."""

    def dependency_up(self, dependency: str, up: bool) -> None:
        """The worker's last check of ``dependency`` (``llm``, ``embeddings``, ``kafka``, ``redis``) found it up."""

    def namespace_seen(self, namespace: str) -> None:
        """This worker took ``namespace`` on: its counters of errors start at 0 (a series exists before the first)."""

    def trace_moved(self, namespace: str) -> None:
        """A trace arrived on another partition than its namespace's and was published again to the right one."""

    def control_refused(self, reason: str) -> None:
        """A control record (rollback) was dead-lettered: ``unsigned`` or ``bad_signature``."""

    def trace_forgotten(self, namespace: str) -> None:
        """A trace a forget rule names was skipped: not learned (``combee traces forget``)."""

    def outcome_totals(self, totals: Mapping[str, Mapping[str, OutcomeCounts]]) -> None:
        """The outcome counts (from Redis) of every namespace this worker owns, per version label, already bounded
        (:func:`combee.outcomes.fold_versions`); replaces the last report whole (a namespace gone is dropped)."""

    def bullet_quarantined(self, namespace: str, reason: str) -> None:
        """A lesson the guard held back (``reason``: one of :data:`combee.guard.REASONS`), not published."""

    def lessons_held(self, namespace: str, reason: str, n: int = 1) -> None:
        """``n`` operations or tags corroboration held back in a window (``reason``: one of
        :data:`combee.corroborate.HELD_REASONS`)."""

    def promotion_decision(self, namespace: str, action: str, by: str) -> None:
        """A promotion decision was applied (``action``: promote, reject, rollback; ``by``: operator, canary,
        gate, outcomes), combee/promotion.py."""

    def namespaces_live(self, count: int) -> None:
        """The worker now holds ``count`` namespaces in memory (capped by ``COMBEE_MAX_NAMESPACES``)."""

    def namespace_evicted(self, namespace: str) -> None:
        """``namespace`` was idle with nothing buffered or in flight and its in-memory state was let go."""

    def trace_held(self, namespace: str) -> None:
        """A trace arrived while its namespace's window buffer was full: held back (offset kept, read again from
        Kafka when there is room) instead of stopping its partition."""

    def feedback(self, namespace: str, outcome: str, reason: str = "") -> None:
        """What became of a trusted feedback record or of a trace waiting for one (``outcome``: one of
        :data:`combee.feedback.OUTCOMES`; ``reason``, for ``refused``: one of :data:`combee.feedback.REFUSALS`)."""


class NoMetrics:
    """Metrics off: every report is dropped."""

    def trace_accepted(self, namespace: str, n: int = 1) -> None:
        pass

    def trace_duplicate(self, namespace: str, n: int = 1) -> None:
        pass

    def trace_dead_lettered(self, namespace: str, reason: str) -> None:
        pass

    def window_closed(self, namespace: str) -> None:
        pass

    def window_mapped(self, namespace: str, since_closed_s: float) -> None:
        pass

    def window_applied(self, namespace: str, since_closed_s: float) -> None:
        pass

    def playbook_size(self, namespace: str, bullets: int) -> None:
        pass

    def prompt_published(self, namespace: str, version: int, since_closed_s: float | None) -> None:
        pass

    def batch_size(self, namespace: str, size: int) -> None:
        pass

    def consumer_lag(self, topic: str, partition: int, lag: int | None) -> None:
        pass

    def llm_usage(self, meter: Meter) -> None:
        pass

    def llm_unavailable(self, role: Role) -> None:
        pass

    def fenced_write(self, namespace: str) -> None:
        pass

    def dependency_up(self, dependency: str, up: bool) -> None:
        pass

    def namespace_seen(self, namespace: str) -> None:
        pass

    def trace_moved(self, namespace: str) -> None:
        pass

    def control_refused(self, reason: str) -> None:
        pass

    def bullet_quarantined(self, namespace: str, reason: str) -> None:
        pass

    def lessons_held(self, namespace: str, reason: str, n: int = 1) -> None:
        pass

    def promotion_decision(self, namespace: str, action: str, by: str) -> None:
        pass

    def namespaces_live(self, count: int) -> None:
        pass

    def namespace_evicted(self, namespace: str) -> None:
        pass

    def trace_held(self, namespace: str) -> None:
        pass

    def feedback(self, namespace: str, outcome: str, reason: str = "") -> None:
        pass

    def trace_forgotten(self, namespace: str) -> None:
        pass

    def outcome_totals(self, totals: Mapping[str, Mapping[str, OutcomeCounts]]) -> None:
        pass
