"""The metrics port and its Prometheus implementation: the values after calls, the endpoint, metrics off."""

from __future__ import annotations

import ast
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from combee.errors import ConfigError
from combee.llm import Role
from combee.meter import Meter, RoleStats
from combee.metrics import LLMPrices, NoMetrics
from combee.metrics_prometheus import FAMILIES, PrometheusMetrics, sample_sum
from combee.settings import Settings
from combee.wiring import build_metrics

ROOT = Path(__file__).resolve().parents[2]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str | bytes) -> Samples:
    raw = text.decode() if isinstance(text, bytes) else text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(raw)
        for s in family.samples
    }


def value(s: Samples, name: str, **labels: str) -> float | None:
    """The one sample of ``name`` with exactly ``labels`` (None when absent)."""
    return s.get((name, frozenset(labels.items())))


def test_the_issues_families_are_all_exported() -> None:
    assert {
        "combee_traces",
        "combee_windows",
        "combee_prompt_version",
        "combee_playbook_bullets",
        "combee_consumer_lag",
        "combee_window_latency_seconds",
        "combee_llm_calls",
        "combee_llm_tokens",
        "combee_llm_cost_usd",
        "combee_llm_parse_failures",
        "combee_llm_repairs",
        "combee_batch_size",
        "combee_fenced_writes",
    } <= FAMILIES


def test_pipeline_reports_become_sample_values() -> None:
    m = PrometheusMetrics()
    m.trace_accepted("ns", 16)
    m.trace_accepted("ns", 4)
    m.trace_duplicate("ns", 3)
    m.trace_dead_lettered("ns", "json")
    m.trace_dead_lettered("", "invalid")
    m.window_closed("ns")
    m.window_mapped("ns", 0.4)
    m.window_applied("ns", 1.5)
    m.window_applied("ns", -0.1)  # a clock step back is observed as 0, never negative
    m.playbook_size("ns", 12)
    m.prompt_published("ns", 7, 2.0)
    m.prompt_published("ns", 8, None)  # a version applied elsewhere: the gauge moves, no latency
    m.batch_size("ns", 32)
    m.consumer_lag("c.traces", 2, 5)
    m.fenced_write("ns")
    s = samples(m.render())

    assert value(s, "combee_traces_total", namespace="ns", outcome="accepted", reason="") == 20
    assert value(s, "combee_traces_total", namespace="ns", outcome="duplicate", reason="") == 3
    assert value(s, "combee_traces_total", namespace="ns", outcome="dead_lettered", reason="json") == 1
    assert value(s, "combee_traces_total", namespace="", outcome="dead_lettered", reason="invalid") == 1
    assert value(s, "combee_windows_total", namespace="ns", stage="closed") == 1
    assert value(s, "combee_windows_total", namespace="ns", stage="mapped") == 1
    assert value(s, "combee_windows_total", namespace="ns", stage="applied") == 2
    assert value(s, "combee_window_latency_seconds_count", namespace="ns", step="applied") == 2
    assert value(s, "combee_window_latency_seconds_sum", namespace="ns", step="applied") == 1.5
    assert value(s, "combee_window_latency_seconds_bucket", namespace="ns", step="mapped", le="0.5") == 1
    assert value(s, "combee_window_latency_seconds_count", namespace="ns", step="published") == 1
    assert value(s, "combee_playbook_bullets", namespace="ns") == 12
    assert value(s, "combee_prompt_version", namespace="ns") == 8
    assert value(s, "combee_batch_size", namespace="ns") == 32
    assert value(s, "combee_consumer_lag", topic="c.traces", partition="2") == 5
    assert value(s, "combee_fenced_writes_total", namespace="ns") == 1

    m.consumer_lag("c.traces", 2, None)  # revoked: the series goes
    m.consumer_lag("c.traces", 3, None)  # never reported: nothing to remove, no error
    assert value(samples(m.render()), "combee_consumer_lag", topic="c.traces", partition="2") is None


def test_llm_meters_fold_into_calls_tokens_cost_failures_and_repairs() -> None:
    m = PrometheusMetrics(LLMPrices(per_1k_prompt=0.5, per_1k_completion=2.0))
    meter = Meter()
    meter.roles["reflector"] = RoleStats(
        calls=5, prompt_tokens=4000, completion_tokens=500, cached_prompt_tokens=1000, parse_failures=2,
        repairs=2, repaired=1, gave_up=1, failure_kinds={"not_json": 1, "invalid": 1},
    )  # fmt: skip
    meter.roles["merger"] = RoleStats(calls=1, prompt_tokens=1000, completion_tokens=100)
    m.llm_usage(meter)
    m.llm_usage(meter)  # meters add up: a second window's
    m.llm_unavailable(Role.CURATOR)
    s = samples(m.render())

    assert value(s, "combee_llm_calls_total", role="reflector", outcome="ok") == 6
    assert value(s, "combee_llm_calls_total", role="reflector", outcome="unparsable") == 4
    assert value(s, "combee_llm_calls_total", role="merger", outcome="ok") == 2
    assert value(s, "combee_llm_calls_total", role="curator", outcome="unavailable") == 1
    assert value(s, "combee_llm_tokens_total", role="reflector", kind="prompt") == 8000
    assert value(s, "combee_llm_tokens_total", role="reflector", kind="completion") == 1000
    assert value(s, "combee_llm_tokens_total", role="reflector", kind="cached_prompt") == 2000
    assert value(s, "combee_llm_cost_usd_total", role="reflector") == pytest.approx(2 * (2.0 + 1.0))
    assert value(s, "combee_llm_cost_usd_total", role="merger") == pytest.approx(2 * (0.5 + 0.2))
    assert value(s, "combee_llm_parse_failures_total", role="reflector", kind="not_json") == 2
    assert value(s, "combee_llm_parse_failures_total", role="reflector", kind="invalid") == 2
    assert value(s, "combee_llm_repairs_total", role="reflector") == 4
    assert value(s, "combee_llm_gave_up_total", role="reflector") == 2


def test_sample_sum_adds_the_samples_whose_labels_match_as_a_scraper_reads_them() -> None:
    m = PrometheusMetrics()
    meter = Meter()
    meter.roles["reflector"] = RoleStats(calls=5, parse_failures=2, gave_up=1)
    meter.roles["curator"] = RoleStats(calls=3)
    m.llm_usage(meter)
    text = m.render().decode()

    assert sample_sum(text, "combee_llm_calls_total", role="reflector") == 5
    assert sample_sum(text, "combee_llm_calls_total", role="reflector", outcome="ok") == 3
    assert sample_sum(text, "combee_llm_calls_total") == 5 + 3
    assert sample_sum(text, "combee_llm_calls_total", role="merger") == 0.0


def test_without_prices_the_cost_counts_zero() -> None:
    m = PrometheusMetrics()
    meter = Meter()
    meter.roles["curator"] = RoleStats(calls=1, prompt_tokens=1000, completion_tokens=100)
    m.llm_usage(meter)
    assert value(samples(m.render()), "combee_llm_cost_usd_total", role="curator") == 0


def test_two_instances_never_share_a_registry() -> None:
    a, b = PrometheusMetrics(), PrometheusMetrics()
    a.window_closed("ns")
    assert value(samples(b.render()), "combee_windows_total", namespace="ns", stage="closed") is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_are_off_unless_a_port_is_set() -> None:
    port = free_port()
    off = build_metrics(Settings(metrics_port=None))
    assert isinstance(off, NoMetrics)
    off.window_closed("ns")  # a no-op, never an error
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass  # nothing listens: no server was started


def test_a_port_serves_the_registry_over_http() -> None:
    port = free_port()
    metrics = build_metrics(Settings(metrics_port=port, llm_price_per_1k_prompt=1.0))
    assert isinstance(metrics, PrometheusMetrics)
    try:
        metrics.window_applied("ns", 0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert response.status == 200
            s = samples(response.read())
        assert value(s, "combee_windows_total", namespace="ns", stage="applied") == 1
        assert metrics.prices.per_1k_prompt == 1.0
    finally:
        metrics.close()


def test_a_taken_port_is_a_one_line_configuration_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}.*COMBEE_METRICS_PORT"):
            build_metrics(Settings(metrics_port=port))


def test_only_the_prometheus_module_imports_prometheus_client() -> None:
    """The core stays pure (STYLE.md): the port is plain Python, the client library lives at one edge."""
    importers = []
    for pkg in ("combee", "streams", "workers", "deploy"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                if any(n.split(".")[0] == "prometheus_client" for n in names):
                    importers.append(str(path.relative_to(ROOT)))
    assert sorted(set(importers)) == ["combee/metrics_prometheus.py"]


def test_outcomes_are_exported_per_bounded_version_label() -> None:
    """combee_outcomes_total carries the counts as handed over (already folded), one series per outcome, and a
    new report replaces the old whole: a namespace this worker no longer owns disappears."""
    from combee.outcomes import OutcomeCounts, fold_versions

    counts = {str(v): OutcomeCounts(success=v, failure=1) for v in range(1, 30)}
    counts["unknown"] = OutcomeCounts(unknown=4)
    m = PrometheusMetrics()
    m.outcome_totals({"ns": fold_versions(counts, live=29, keep=5), "gone": {"3": OutcomeCounts(success=1)}})
    m.outcome_totals({"ns": fold_versions(counts, live=29, keep=5)})
    s = samples(m.render())
    series = {dict(labels)["version"] for (name, labels) in s if name == "combee_outcomes_total"}
    assert series == {"25", "26", "27", "28", "29", "older", "unknown"}
    assert value(s, "combee_outcomes_total", namespace="ns", version="29", outcome="success") == 29
    assert value(s, "combee_outcomes_total", namespace="ns", version="older", outcome="success") == sum(range(1, 25))
    assert value(s, "combee_outcomes_total", namespace="ns", version="older", outcome="failure") == 24
    assert value(s, "combee_outcomes_total", namespace="ns", version="unknown", outcome="unknown") == 4
    assert not any(dict(labels).get("namespace") == "gone" for (_, labels) in s)
    assert "combee_outcomes" in FAMILIES


def test_quarantined_bullets_are_counted_by_a_bounded_reason() -> None:
    m = PrometheusMetrics()
    m.namespace_seen("ns")
    m.bullet_quarantined("ns", "url")
    m.bullet_quarantined("ns", "url")
    m.bullet_quarantined("ns", "a reason no guard rule gives")
    s = samples(m.render())
    assert value(s, "combee_bullets_quarantined_total", namespace="ns", reason="url") == 2
    assert value(s, "combee_bullets_quarantined_total", namespace="ns", reason="other") == 1
    assert value(s, "combee_bullets_quarantined_total", namespace="ns", reason="markup") == 0  # there at 0
    reasons = {dict(labels)["reason"] for name, labels in s if name == "combee_bullets_quarantined_total"}
    assert reasons == {"markup", "url", "email", "credential", "card_number", "agent_control", "answer_tampering",
                       "other"}  # fmt: skip


def test_live_namespaces_evictions_and_held_traces_are_reported() -> None:
    m = PrometheusMetrics(max_namespaces=1)
    m.namespace_seen("alpha")
    m.namespaces_live(3)
    m.namespace_evicted("alpha")
    m.namespace_evicted("beta")
    m.trace_held("alpha")
    m.trace_held("beta")  # past the label limit: counted under "(other)"
    s = samples(m.render())
    assert value(s, "combee_namespaces_live") == 3
    assert value(s, "combee_namespaces_evicted_total") == 2
    assert value(s, "combee_traces_held_total", namespace="alpha") == 1
    assert value(s, "combee_traces_held_total", namespace="(other)") == 1
    # the cap's dead letters have a series at 0 once the namespace is taken on
    assert value(s, "combee_traces_total", namespace="alpha", outcome="dead_lettered", reason="namespace_limit") == 0
