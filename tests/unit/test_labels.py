"""combee/labels.py and the Prometheus metrics: producer-chosen namespaces cannot grow the series without bound."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from combee.errors import InvalidNamespace
from combee.labels import OTHER, BoundedLabels
from combee.metrics_prometheus import PrometheusMetrics, sample_sum
from combee.models import validate_namespace


def test_the_first_values_keep_their_label_and_later_ones_fold_into_other() -> None:
    labels = BoundedLabels(2)
    assert [labels(v) for v in ("a", "b", "a", "c", "d", "b", "")] == ["a", "b", "a", OTHER, OTHER, "b", ""]
    assert labels.own == {"a", "b"} and labels.folded == 2


def test_other_is_not_a_namespace_so_it_never_collides_with_one() -> None:
    with pytest.raises(InvalidNamespace):
        validate_namespace(OTHER)


def test_prometheus_series_stay_bounded_with_many_namespaces() -> None:
    metrics = PrometheusMetrics(max_namespaces=3)
    for i in range(50):
        ns = f"ns-{i}"
        metrics.namespace_seen(ns)
        metrics.trace_accepted(ns, 2)
        metrics.window_applied(ns, 0.5)
        metrics.batch_size(ns, 8)
    text = metrics.render().decode()
    namespaces = {
        s.labels["namespace"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "namespace" in s.labels
    }
    assert namespaces == {"", "ns-0", "ns-1", "ns-2", OTHER}
    assert sample_sum(text, "combee_traces_total", outcome="accepted") == 100  # nothing is lost, only folded
    assert sample_sum(text, "combee_traces_total", namespace=OTHER, outcome="accepted") == 94
    assert sample_sum(text, "combee_batch_size", namespace=OTHER) == 0  # no gauge mixes namespaces
    assert sample_sum(text, "combee_traces_total", namespace="ns-0", reason="rate_limited") == 0  # series at 0
