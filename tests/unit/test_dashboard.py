"""deploy/grafana and deploy/prometheus.yml agree with what the workers export (issue 15's acceptance).

Every query of the dashboard (panels and template variables) is read with a small PromQL scanner: whatever
is left once strings, label matchers, ranges, grouping clauses, functions, keywords and numbers are taken out
is a series name, and each must be one the metrics registry exports — a gauge by its name, a counter with
``_total``, a histogram as ``_bucket``/``_sum``/``_count`` — or Prometheus's own ``up``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from combee.metrics_prometheus import PrometheusMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "combee.json"
PROMETHEUS_OWN = {"up"}  # series Prometheus adds to every scrape target itself

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
KEYWORDS |= {"inf", "nan"}


def exported_series() -> set[str]:
    """Every series name a worker's /metrics may show (``_created`` samples left out: no panel needs them)."""
    names: set[str] = set()
    for family in PrometheusMetrics().registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


def series_in(expr: str) -> set[str]:
    """The series names a PromQL expression selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values, regexes
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range and subquery durations
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # label lists
    names = set()
    for match in re.finditer(r"(?<![\w$.])([A-Za-z_:][\w:]*)\s*(\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, expr) for every panel target and every query variable."""
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            out.append((f"${var['name']}", re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", query)))
    return out


def test_the_scanner_finds_series_and_nothing_else() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, namespace) (rate(combee_x_bucket{namespace=~"$ns", a="b c"}[5m])))'
        " / on (namespace) group_left max without (pod) (up{job='x'}) > bool 2 or vector(1)"
    )
    assert series_in(expr) == {"combee_x_bucket", "up"}
    assert series_in("sum(rate(combee_traces[1m])) * 60") == {"combee_traces"}


def test_the_dashboard_is_valid_json_with_unique_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "combee" and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel.get("targets"), f"panel {panel['title']!r} has no query"
            assert all(t.get("expr") for t in panel["targets"]), panel["title"]
            assert panel["datasource"]["uid"] == "combee-prometheus"


def test_every_query_names_only_exported_series() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_series() | PROMETHEUS_OWN
    for where, expr in queries(dashboard):
        names = series_in(expr)
        assert names, f"{where}: no series in {expr!r}"
        assert names <= exported, f"{where}: {sorted(names - exported)} not exported (query {expr!r})"


def test_the_dashboard_shows_every_combee_family() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    used = set().union(*(series_in(expr) for _, expr in queries(dashboard)))
    families = {f.name for f in PrometheusMetrics().registry.collect() if f.name.startswith("combee_")}
    shown = {f for f in families if any(name == f or name.startswith(f + "_") for name in used)}
    assert shown == families


def test_prometheus_scrapes_the_port_compose_gives_the_worker() -> None:
    yaml = pytest.importorskip("yaml")
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    worker = compose["services"]["combee-worker"]["environment"]
    (job,) = [j for j in prometheus["scrape_configs"] if j["job_name"] == "combee"]
    targets = [t for cfg in job["static_configs"] for t in cfg["targets"]]
    assert targets == [f"combee-worker:{worker['COMBEE_METRICS_PORT']}"]
    assert worker["COMBEE_METRICS_HOST"] == "0.0.0.0"
    for service in ("prometheus", "grafana"):
        assert all(str(p).startswith("127.0.0.1:") for p in compose["services"][service]["ports"]), service
    datasources = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert [d["uid"] for d in datasources["datasources"]] == ["combee-prometheus"]
    providers = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/combee.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./deploy/grafana/dashboards:{providers['providers'][0]['options']['path']}:ro" in mounts


def test_the_local_prometheus_config_scrapes_workers_on_this_host() -> None:
    yaml = pytest.importorskip("yaml")
    local = yaml.safe_load((ROOT / "deploy" / "prometheus-local.yml").read_text())
    (job,) = [j for j in local["scrape_configs"] if j["job_name"] == "combee"]  # the dashboard's job name
    targets = [t for cfg in job["static_configs"] for t in cfg["targets"]]
    assert targets and all(t.startswith("127.0.0.1:") for t in targets)
    assert "127.0.0.1:9108" in targets and job["metrics_path"] == "/metrics"
