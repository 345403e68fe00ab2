"""Issue 15's acceptance for metrics: a worker fed with known traces on the real Kafka and Redis answers
``GET /metrics`` with values that match the work done (delta log, Redis, the playbook)."""

from __future__ import annotations

import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.pipeline import Pipeline
from tests.integration.streams_support import free_port
from tests.support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def fetch(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def scrape(port: int) -> Samples:
    text = fetch(port)
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when there is none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def test_metrics_match_the_work_done(pipe: Pipeline) -> None:
    ns = "metrics-one"
    traces, _ = pipe.traces(60, 5, ns)
    bad: list[tuple[bytes | None, bytes]] = [
        (ns.encode(), b"not json {"),
        (ns.encode(), json.dumps({"namespace": ns}).encode()),  # no task: invalid
    ]
    port = free_port()
    pipe.start_worker(
        COMBEE_METRICS_PORT=str(port),
        COMBEE_EMBEDDINGS="off",  # exact de-duplication: lighter, and nothing here depends on it
        COMBEE_REDUCE_SHAPE="none",  # the paper's reduce, so that every role (the merger too) is counted
        COMBEE_LLM_PRICE_PER_1K_PROMPT="0.5",
        COMBEE_LLM_PRICE_PER_1K_COMPLETION="2",
    )
    pipe.publish_traces(traces, pace_s=0.01)
    pipe.publish(bad)
    pipe.wait_learned({ns: 60})
    records = pipe.deltas(ns)
    version = pipe.current_version(ns)
    playbook = pipe.published_playbook(ns)
    traces_topic = pipe.topics.traces

    def settled() -> bool:  # the publisher's report and the lag sampler (every 5 s) have caught up
        s = scrape(port)
        lags = [v for (n, ls), v in s.items() if n == "combee_consumer_lag" and ("topic", traces_topic) in ls]
        return value(s, "combee_prompt_version", namespace=ns) == version and bool(lags) and not any(lags)

    wait_until(settled, 30, "metrics caught up with the work done", poll_s=1.0)
    s = scrape(port)
    shown = ("_bucket", "_created", "# ")
    print("\n".join(line for line in fetch(port).splitlines() if not any(x in line for x in shown)))

    assert value(s, "combee_traces_total", namespace=ns, outcome="accepted") == 60
    assert value(s, "combee_traces_total", namespace=ns, outcome="duplicate") == 0
    assert value(s, "combee_traces_total", namespace=ns, outcome="dead_lettered", reason="json") == 1
    assert value(s, "combee_traces_total", namespace=ns, outcome="dead_lettered", reason="invalid") == 1
    assert len(pipe.dead_letters()) == 2

    assert version == len(records) == records[-1].version
    for stage in ("closed", "mapped", "applied"):
        assert value(s, "combee_windows_total", namespace=ns, stage=stage) == len(records), stage
    assert value(s, "combee_prompt_version", namespace=ns) == version
    assert value(s, "combee_playbook_bullets", namespace=ns) == len(playbook.bullets) > 0
    assert value(s, "combee_batch_size", namespace=ns) > 0

    for step in ("mapped", "applied"):
        assert value(s, "combee_window_latency_seconds_count", namespace=ns, step=step) == len(records), step
        assert value(s, "combee_window_latency_seconds_sum", namespace=ns, step=step) > 0
    # a version superseded before Redis took it is not observed: at least the last one is
    assert 1 <= value(s, "combee_window_latency_seconds_count", namespace=ns, step="published") <= len(records)
    applied_p = value(s, "combee_window_latency_seconds_sum", namespace=ns, step="applied") / len(records)
    mapped_p = value(s, "combee_window_latency_seconds_sum", namespace=ns, step="mapped") / len(records)
    assert applied_p >= mapped_p

    # one reflection per accepted trace (more with repairs); a curator call per group; merges join groups
    assert value(s, "combee_llm_calls_total", role="reflector") >= 60
    assert value(s, "combee_llm_calls_total", role="curator") > 0
    assert value(s, "combee_llm_calls_total", role="merger") > 0
    assert value(s, "combee_llm_calls_total", outcome="unavailable") == 0
    for role in ("reflector", "curator", "merger"):
        prompt = value(s, "combee_llm_tokens_total", role=role, kind="prompt")
        completion = value(s, "combee_llm_tokens_total", role=role, kind="completion")
        assert prompt > 0 and completion > 0, role
        cost = value(s, "combee_llm_cost_usd_total", role=role)
        assert cost == pytest.approx(prompt / 1000 * 0.5 + completion / 1000 * 2), role

    assert value(s, "combee_fenced_writes_total") == 0
    assert value(s, "process_resident_memory_bytes") > 0
