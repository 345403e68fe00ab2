"""Issue 9, part 4: the pipeline on a three-node Kafka cluster loses its partition leaders mid-run.

A private KRaft cluster of three nodes (each broker + controller; every topic replicated three times,
``min.insync.replicas=2``; the suite's producer and the workers write with acks=all), Redis, the SIMULATED
model, one learner and one curate worker, the same traces as every scenario. While traces are published:

1. the node leading the traces partition of the first namespace is SIGKILLed; the run waits for the cluster
   to elect new leaders and for the workers to apply a window without it, then starts the node again and
   waits until every partition is fully replicated again;
2. the same for the node leading that namespace's delta-log partition (the combiner's commit point).

Then the run settles and every invariant of the suite is checked (lost, learned twice, windows applied twice,
version regressions and gaps, torn reads, half-applied deltas, liveness), with the failover figures beside.

Opt-in: runs with ``COMBEE_FAULTS=full`` (``make faults``), or ``COMBEE_FAULTS_CLUSTER=1`` with either profile
(``make faults-short``: one short run, ~90 s with the cluster's start and stop; ``make faults-cluster``: full
profile, 3 runs). ``COMBEE_FAULTS_RUNS=N`` runs it N times in a row on one cluster.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streams.topics import partition_for
from tests.faults.conftest import MODE, record
from tests.faults.harness import Run
from tests.faults.invariants import Figures
from tests.faults.stack import ClusterStack
from tests.faults.suite import NAMESPACES, Profile, Progress, Scenario, execute, figure_lines

pytestmark = [
    pytest.mark.faults,
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        MODE != "full" and os.environ.get("COMBEE_FAULTS_CLUSTER", "").strip() != "1",
        reason="three-broker profile: COMBEE_FAULTS=full, or COMBEE_FAULTS_CLUSTER=1 (make faults-cluster)",
    ),
]

RUNS = int(os.environ.get("COMBEE_FAULTS_RUNS", "1"))
#: A node is down for at least this long waiting for the workers to apply a window without it: a pipeline
#: that cannot make progress while one of three nodes is down fails the run.
PROGRESS_WHILE_DOWN_S = 90.0
#: How long the cluster may take to give a dead node's partitions new leaders (the broker session is 4 s).
FAILOVER_BOUND_S = 30.0
ISR_BOUND_S = 120.0


def _cluster(run: Run) -> ClusterStack:
    assert isinstance(run.stack, ClusterStack), "the failover scenario needs a ClusterStack"
    return run.stack


def _wait(ok: Any, timeout_s: float) -> float | None:
    """Seconds until ``ok()`` is true (errors while the cluster reorganises count as not yet), None on timeout."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if ok():
                return round(time.monotonic() - started, 1)
        except Exception:  # metadata from a node that is dying or catching up: ask again
            pass
        time.sleep(0.25)
    return None


def _kill_leader(run: Run, progress: Progress, rng: random.Random, topic: str, label: str) -> dict[str, Any]:
    """SIGKILL the node leading ``topic``'s partition of the first namespace, see the workers go on without
    it, start it again and wait until every partition is fully replicated again."""
    stack = _cluster(run)
    homes = sorted({partition_for(ns.encode(), run.partitions) for ns, _, _ in NAMESPACES})
    progress.wait_for_more(run)  # the workers are learning…
    time.sleep(rng.uniform(0.0, 1.5))  # …and the leader dies at a random moment of it
    state = stack.partitions([topic])
    victim = state[(topic, homes[0])][0]
    led = [p for p in homes if state[(topic, p)][0] == victim]
    before = progress.poll()
    killed_at = time.monotonic()
    stack.kill_node(victim)
    run.note(f"SIGKILL Kafka node {victim}, leader of {label} partition(s) {led}")

    def new_leaders() -> bool:
        now = stack.partitions([topic])
        return all(now[(topic, p)][0] not in (-1, victim) for p in led)

    failover_s = _wait(new_leaders, FAILOVER_BOUND_S)
    leaders = {p: stack.partitions([topic])[(topic, p)][0] for p in led} if failover_s is not None else {}
    run.note(f"{label} partition(s) {led} led by {leaders or 'nobody'} after {failover_s}s")
    progressed = progress.wait_for_more(run, timeout_s=PROGRESS_WHILE_DOWN_S)
    first_window_s = round(time.monotonic() - killed_at, 1) if progressed else None
    windows_down = progress.poll() - before
    down_s = time.monotonic() - killed_at
    back_s = stack.start_node(victim)
    run.note(f"Kafka node {victim} back after {down_s + back_s:.1f}s ({windows_down} windows applied without it)")
    topics = [s.name for s in run.topics.specs()] + ["__consumer_offsets"]
    isr_s = _wait(lambda: not stack.under_replicated(topics), ISR_BOUND_S)
    run.note(f"every partition fully replicated again after {isr_s}s")
    return {
        "topic": label,
        "node": victim,
        "led_partitions": led,
        "new_leaders": leaders,
        "failover_s": failover_s,
        "first_window_after_kill_s": first_window_s,
        "windows_while_down": windows_down,
        "node_down_s": round(down_s, 1),
        "node_start_s": round(back_s, 1),
        "isr_full_after_s": isr_s,
    }


def _leader_failover(run: Run, profile: Profile, progress: Progress, rng: random.Random) -> dict[str, Any]:
    return {
        "failovers": [
            _kill_leader(run, progress, rng, run.topics.traces, "traces"),
            _kill_leader(run, progress, rng, run.topics.deltas, "deltas"),
        ]
    }


def _failovers_held(run: Run, figures: Figures) -> None:
    """Every topic of the run (Faust's too) had a replica on every node and min.insync.replicas a majority;
    every failover elected new leaders in time, the workers applied windows while the node was down, and the
    cluster was whole again before the next kill."""
    stack = _cluster(run)
    topics = stack.replication(run.prefix)
    want = (stack.replication_factor, str(stack.min_insync_replicas))
    figures.faults["replication"] = {"topics": len(topics), "replicas, min.insync.replicas": list(want)}
    for name, got in sorted(topics.items()):
        if got != want:
            figures.violations.append(f"topic {name} has (replicas, min.insync.replicas) {got}, not {want}")
    if len(topics) < len(run.topics.specs()):
        figures.violations.append(f"only {len(topics)} topics of the run found: {sorted(topics)}")
    for f in figures.faults.get("failovers", []):
        what = f"{f['topic']} leader (node {f['node']})"
        if f["failover_s"] is None:
            figures.violations.append(f"{what}: no new leader within {FAILOVER_BOUND_S:.0f}s")
        if f["first_window_after_kill_s"] is None:
            figures.violations.append(f"{what}: no window applied within {PROGRESS_WHILE_DOWN_S:.0f}s of its death")
        if f["isr_full_after_s"] is None:
            figures.violations.append(f"{what}: partitions not fully replicated {ISR_BOUND_S:.0f}s after its restart")


def _rate(p: Profile) -> float:
    # Traces must keep arriving through both failovers (~15 s each here, the first after ~10 s): spread them
    # over at least a minute.
    return min(p.rate, 2 * p.traces_per_namespace / 60.0)


FAILOVER = Scenario(
    "leader-failover",
    "3 Kafka nodes (RF 3, min.insync.replicas 2, acks=all): SIGKILL the leader of the traces partition, then "
    "of the delta log, each restarted once the workers made progress without it",
    _leader_failover,
    rate=_rate,
    verify=_failovers_held,
)


def failover_line(f: Figures) -> str:
    parts = []
    for x in f.faults.get("failovers", []):
        parts.append(
            f"{x['topic']}: node {x['node']} (led p{','.join(map(str, x['led_partitions']))}) new leader after "
            f"{x['failover_s']}s, next window after {x['first_window_after_kill_s']}s, {x['windows_while_down']} "
            f"windows while down, back in {x['node_start_s']}s, ISR full {x['isr_full_after_s']}s later"
        )
    return f"  failover  {'; '.join(parts) or 'n/a'}; duplicate log records {f.duplicate_log_records}"


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterStack]:
    with tempfile.TemporaryDirectory(prefix="combee-cluster-") as tmp:
        stack = ClusterStack(Path(tmp) / "state")
        try:
            yield stack.up()
        finally:
            stack.down()


@pytest.mark.parametrize("run", range(1, RUNS + 1), ids=[f"run{r}" for r in range(1, RUNS + 1)])
def test_leader_failover(cluster: ClusterStack, workdir: Path, profile: Profile, api_key: str, run: int) -> None:
    print(f"\n=== scenario {FAILOVER.name} (run {run}, profile {profile.name}): {FAILOVER.doc}")
    figures = execute(cluster, workdir, FAILOVER, profile, api_key=api_key, control=None, run_index=run)
    for line in [*figure_lines(figures), failover_line(figures)]:
        print(line)
    print(f"  wall      {figures.seconds}s")
    record(figures.as_dict())
    assert not figures.violations, "\n".join(figures.violations)
