"""Health that shows (issue 28): the board's states, how an outage reads, the Kafka probe, error counters at 0,
how many trial windows profiling has left, and ``combee status`` / the web page saying so without ``None``."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import pytest

from combee.cli.status import format_status
from combee.controller import BatchSizeController
from combee.errors import PARSE_FAILURE_KINDS, TRACE_ERROR_KINDS, KafkaUnreachable
from combee.health import HealthBoard, describe_dependency, one_line
from combee.metrics_prometheus import PrometheusMetrics, sample_sum
from combee.ui.render import health_section, index_page
from streams.kafka_config import check_kafka_reachable, require_kafka
from streams.overview import WorkerHealth

ROOT = Path(__file__).resolve().parents[2]


def test_a_dependency_is_down_since_its_first_failure_and_up_again_clears_the_error() -> None:
    board = HealthBoard({"llm": "http://127.0.0.1:8000/v1", "redis": "redis://127.0.0.1:6379/0"})
    assert board.get("llm").state == "unknown"
    assert board.up("llm", 100.0) is True
    assert board.down("llm", "ConnectError:\n  connection\trefused", 105.0) is True
    assert board.down("llm", "ConnectError: still refused", 110.0) is False  # no change: since stays at 105
    dep = board.get("llm")
    assert (dep.state, dep.since, dep.failures, dep.checked_at) == ("down", 105.0, 2, 110.0)
    assert dep.last_error == "ConnectError: still refused"
    assert board.up("llm", 120.0) is True
    dep = board.get("llm")
    assert (dep.state, dep.since, dep.last_error, dep.failures) == ("up", 120.0, None, 0)
    assert board.up("unknown-name", 1.0) is False and "unknown-name" not in board


def test_an_error_is_kept_on_one_short_line() -> None:
    text = one_line("a\nb   c\t" + "x" * 1000)
    assert "\n" not in text and text.startswith("a b c x") and len(text) == 240


def test_an_outage_says_since_when_why_and_what_it_holds_up() -> None:
    board = HealthBoard({"llm": "http://127.0.0.1:8000/v1", "kafka": "127.0.0.1:9092"})
    board.down("llm", "ConnectionError: connection refused", 1000.0)
    board.up("kafka", 1000.0)
    report = board.report({"llm": {"windows_waiting": 1, "traces_buffered": 5, "tasks_in_flight": 0}})
    assert report["kafka"]["holds_up"] == {}  # only what is down holds anything up
    line = describe_dependency(report["llm"], now=1125.0)
    assert line == (
        "llm http://127.0.0.1:8000/v1: DOWN for 2 min 5 s: ConnectionError: connection refused; "
        "holds up 1 window, 5 traces buffered"
    )
    assert describe_dependency(report["kafka"], now=1125.0) == "kafka 127.0.0.1:9092: up"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_kafka_not_there_is_one_line_at_once() -> None:
    port = _closed_port()
    started = time.monotonic()
    with pytest.raises(KafkaUnreachable) as caught:
        require_kafka(f"127.0.0.1:{port}")
    assert time.monotonic() - started < 2.0
    message = str(caught.value)
    assert message == (
        f"Kafka is not reachable at 127.0.0.1:{port} (127.0.0.1:{port}: connection refused); "
        "start it, or for the local one run: combee dev up"
    )
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert check_kafka_reachable(f"127.0.0.1:{_closed_port()},127.0.0.1:{port}") is None  # any one will do


def test_error_counters_have_a_series_at_zero_before_the_first_error() -> None:
    metrics = PrometheusMetrics()
    text = metrics.render().decode()
    for role in ("reflector", "curator", "merger"):
        assert f'combee_llm_gave_up_total{{role="{role}"}} 0.0' in text
        assert f'combee_llm_repairs_total{{role="{role}"}} 0.0' in text
        assert f'combee_llm_calls_total{{outcome="unavailable",role="{role}"}} 0.0' in text
        assert f'combee_llm_parse_failures_total{{kind="not_json",role="{role}"}} 0.0' in text
    assert 'combee_traces_total{namespace="",outcome="dead_lettered",reason="json"} 0.0' in text
    assert "combee_fenced_writes_total{" not in text  # per namespace: from when the worker takes one on
    metrics.namespace_seen("demo")
    metrics.trace_moved("demo")
    metrics.dependency_up("llm", False)
    text = metrics.render().decode()
    assert 'combee_fenced_writes_total{namespace="demo"} 0.0' in text
    assert 'combee_traces_total{namespace="demo",outcome="dead_lettered",reason="oversized"} 0.0' in text
    assert sample_sum(text, "combee_traces_moved_total", namespace="demo") == 1.0
    assert sample_sum(text, "combee_dependency_up", dependency="llm") == 0.0


def test_the_kinds_started_at_zero_are_every_kind_the_code_raises() -> None:
    raised = set()
    for path in [*(ROOT / "combee" / "prompts").glob("*.py"), ROOT / "combee" / "tracefile.py"]:
        raised |= set(re.findall(r'kind="([a-z_]+)"', path.read_text()))
        raised |= set(re.findall(r'TraceError\([^)]*?, "([a-z_]+)"\)', path.read_text()))
    assert raised <= set(PARSE_FAILURE_KINDS) | set(TRACE_ERROR_KINDS), raised - set(PARSE_FAILURE_KINDS)
    assert "invalid" in TRACE_ERROR_KINDS  # TraceError's default kind


def test_the_controller_says_how_many_trial_windows_are_left() -> None:
    ctl = BatchSizeController(candidates=(32, 64, 128))
    assert ctl.trials_left() == (32, 64, 128)
    ctl.observe(20, 5.0)  # a window closed early (max_wait) is no trial
    ctl.observe(32, 8.0)
    assert ctl.trials_left() == (64, 128)
    note = ctl.profiling_note()
    assert note is not None and "2 trial windows of 3 left (64, 128 traces; 192 traces in all)" in note
    ctl.observe(64, 10.0)
    ctl.observe(128, 15.0)
    assert ctl.trials_left() == () and ctl.profiling_note() is None


def test_status_text_shows_an_outage_and_no_python_none() -> None:
    now = 2000.0
    status = {
        "kafka_error": None,
        "workers": [
            {
                "worker": "vm:42",
                "age_s": 1.5,
                "dependencies": {
                    "llm": {
                        "name": "llm",
                        "target": "http://127.0.0.1:8000/v1",
                        "state": "down",
                        "since": 1990.0,
                        "last_error": "ConnectionError: refused",
                        "holds_up": {"windows_waiting": 2},
                    },
                    "redis": {"name": "redis", "target": "redis://127.0.0.1:6379/0", "state": "up"},
                },
            }
        ],
        "namespaces": [{"namespace": "demo", "state": "learning", "version": None, "lag": None, "worker_status": None}],
    }
    text = format_status(status, now)
    assert "llm http://127.0.0.1:8000/v1: DOWN for 10 s: ConnectionError: refused; holds up 2 windows" in text
    assert "demo: no version published yet" in text and "lag unknown" in text
    assert "None" not in text


def test_the_web_page_shows_an_outage_escaped() -> None:
    worker = WorkerHealth(
        worker="vm:1",
        updated_at=1.0,
        age_s=2.0,
        stale=False,
        down=("llm http://x/v1: DOWN for 5 s: <b>boom</b>; holds up 1 window",),
        up=("kafka", "redis"),
        unchecked=(),
    )
    html = health_section([worker])
    assert 'class="outage"' in html and "&lt;b&gt;boom&lt;/b&gt;" in html and "<b>boom" not in html
    assert "No worker has reported" in index_page([], ())
    healthy = WorkerHealth("vm:2", 1.0, 1.0, False, (), ("llm", "kafka"), ())
    assert "all dependencies up (llm, kafka)" in health_section([healthy])
