"""Issue 16's acceptance on the real Kafka and Redis: one namespace, two workers, the reflections shared.

Both runs learn the same SIMULATED traces with the same seeds and fixed window sizes (every window is
``COMBEE_BS_MAX`` traces, the last one the remainder), once with one worker and once with two. With two, each
worker must make at least 35 % of the namespace's reflector calls (each worker's own ``/metrics``), and the
playbook must be the one-worker playbook exactly.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from combee.models import Playbook
from tests.integration.pipeline import Pipeline, Worker
from tests.integration.streams_support import free_port, kafka_bootstrap_or_skip, redis_url_or_skip
from tests.integration.test_metrics import scrape, value
from tests.support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NS = "fleet-one"
FIXED_WINDOWS = {
    "COMBEE_BS_MIN": "32",
    "COMBEE_BS_MAX": "32",
    "COMBEE_BS_DEFAULT": "32",
    "COMBEE_BS_CANDIDATES": "[32]",
    "COMBEE_MAX_WAIT_S": "3",
}


def traces_partitions(port: int, topic: str) -> frozenset[int]:
    """The partitions of ``topic`` a worker reports consumer lag for: those assigned to it (its lag sampler, every
    5 s, forgets a partition once it is taken away)."""
    return frozenset(
        int(dict(labels)["partition"])
        for (name, labels) in scrape(port)
        if name == "combee_consumer_lag" and ("topic", topic) in labels
    )


#: How long the workers' shares of the traces partitions must stay the same to count as settled (longer than the
#: lag sampler's 5 s, so a share a worker lost shows in its report).
STABLE_S = 6.0


def wait_ready(pipe: Pipeline, workers: list[Worker], ports: list[int]) -> None:
    """Every worker has joined the group (its log says Ready), and the last rebalance has settled: each worker
    holds its own share of the traces partitions, together all of them, unchanged for ``STABLE_S`` seconds
    (sampled every second: settled is seen within a second of it happening, not up to 6 s later). A lone worker
    holding every partition has no other member to rebalance with: seeing it hold them all is enough."""
    wait_until(lambda: all("Worker]: Ready" in w.log.read_text(errors="replace") for w in workers), 180, "ready")
    stable_s = STABLE_S if len(workers) > 1 else 0.0
    everything = frozenset(range(pipe.partitions))
    since: list[tuple[list[frozenset[int]], float]] = []  # the split last seen and when it was first seen

    def settled() -> bool:
        held = [traces_partitions(port, pipe.topics.traces) for port in ports]
        split = all(held) and sum(map(len, held)) == len(everything) and frozenset().union(*held) == everything
        if not split:
            since.clear()
            return False
        if not since or since[0][0] != held:
            since[:] = [(held, time.monotonic())]
        return time.monotonic() - since[0][1] >= stable_s

    wait_until(settled, 300, f"the {len(everything)} traces partitions shared out among the workers", poll_s=1.0)


def learn(tmp: Path, traces: list[dict], workers: int) -> tuple[Playbook, list[float], Pipeline]:
    pipe = Pipeline(kafka_bootstrap_or_skip(), redis_url_or_skip(), tmp, env_extra=FIXED_WINDOWS)
    pipe.start_sim()
    try:
        pipe.create_topics()
        ports = [free_port() for _ in range(workers)]
        for port in ports:
            pipe.start_worker(COMBEE_METRICS_PORT=str(port))
        wait_ready(pipe, pipe.workers, ports)
        pipe.publish_traces(traces)  # at once: the windows are cut by size alone
        pipe.wait_learned({NS: len(traces)}, timeout_s=600)
        calls = [value(scrape(port), "combee_llm_calls_total", role="reflector") for port in ports]
        return pipe.published_playbook(NS), calls, pipe
    finally:
        pipe.close()


def test_two_workers_share_one_namespaces_reflections_and_learn_the_one_worker_playbook(tmp_path: Path) -> None:
    probe = Pipeline(kafka_bootstrap_or_skip(), redis_url_or_skip(), tmp_path)
    traces, _ = probe.traces(200, 11, NS)
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    alone, alone_calls, one = learn(tmp_path / "one", traces, workers=1)
    shared, calls, two = learn(tmp_path / "two", traces, workers=2)

    print(f"reflector calls: one worker {alone_calls}, two workers {calls}")
    assert sum(calls) >= len(traces)
    assert all(c >= 0.35 * sum(calls) for c in calls), calls
    cuts = [[(r.window_id, r.trace_count) for r in p.deltas(NS)] for p in (one, two)]
    assert cuts[0] == cuts[1], "the two runs cut different windows"
    assert shared.version == alone.version
    assert [(b.id, b.section, b.content, b.helpful, b.harmful) for b in shared.bullets] == [
        (b.id, b.section, b.content, b.helpful, b.harmful) for b in alone.bullets
    ]
