"""Issue #5, part 5: the soak run — traces at a steady rate for 10 minutes across 20 namespaces.

Every 10 s it samples the resident memory (RSS) of every worker process (and the simulator's), the consumer
lag of the worker group on the traces topic, and the version of every namespace in Redis. It passes when:

* no worker's RSS grows by 10 % or more over the last half of the run (median of the samples around the
  middle vs. median of the last samples);
* the lag stays bounded: over the last half it never exceeds what the first half reached plus a margin of
  ``LAG_MARGIN_S`` seconds of arrivals, and it drains to 0 once publishing stops;
* every namespace's version advances in every quarter of the run;
* and, at the end, every invariant of the fault suite holds for all 20 namespaces.

``COMBEE_SOAK_S`` sets the duration (default 600; the full profile only). The figures (the time series and a
summary) are written to ``$COMBEE_FAULTS_OUT/soak.json`` and printed.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from combee.sim.world import generate_traces
from tests.faults.conftest import MODE
from tests.faults.harness import PacedPublisher, PromptWatcher, Record, Run
from tests.faults.invariants import Figures, check, observe
from tests.faults.stack import PrivateStack
from tests.faults.suite import Settler, figure_lines

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(3600)]

NAMESPACES = 20
RATE = 10.0  # traces per second, all namespaces together
SAMPLE_S = 10.0
LAG_MARGIN_S = 30.0
MAX_RSS_GROWTH = 0.10


def _records(seconds: float) -> tuple[list[Record], dict[str, list[str]]]:
    per_ns = max(1, round(seconds * RATE / NAMESPACES))
    groups, truths = [], {}
    for i in range(NAMESPACES):
        ns = f"soak-{i:02d}"
        traces, _, truth = generate_traces(per_ns, 100 + i, namespace=ns, world=("formula", "finer")[i % 2], test_n=0)
        groups.append([Record(ns.encode(), json.dumps(t).encode()) for t in traces])
        truths[ns] = truth["insights"]
    return [r for group in zip(*groups, strict=True) for r in group], truths


def _versions(run: Run, namespaces: list[str]) -> dict[str, int]:
    client = run.redis(socket_timeout=5)
    try:
        pipe = client.pipeline(transaction=False)
        for ns in namespaces:
            pipe.hget(run.keys.current(ns), "version")
        return {ns: int(v) if v else 0 for ns, v in zip(namespaces, pipe.execute(), strict=True)}
    finally:
        client.close()


def _median_around(series: list[tuple[float, int]], t: float, width: float) -> float:
    near = [v for at, v in series if abs(at - t) <= width]
    return statistics.median(near) if near else float("nan")


@pytest.mark.skipif(MODE != "full" and not os.environ.get("COMBEE_SOAK_S"), reason="soak: COMBEE_FAULTS=full")
def test_soak(stack: PrivateStack, workdir: Path, api_key: str) -> None:
    seconds = float(os.environ.get("COMBEE_SOAK_S", "600"))
    records, truths = _records(seconds)
    namespaces = sorted(truths)
    run = Run(stack, workdir / "soak", "soak", api_key=api_key, env_extra={"COMBEE_MAX_WAIT_S": "10"})
    samples: list[dict[str, Any]] = []
    try:
        run.start_sim()
        run.ensure_topics()
        learner, curate = run.start_worker("learner"), run.start_worker("curate")
        watcher = PromptWatcher(run, namespaces, poll_s=1.0)
        watcher.start()
        producer = run.producer()
        publisher = PacedPublisher(producer, records, RATE)
        t0 = time.monotonic()
        publisher.start()
        print(f"\n=== soak: {len(records)} traces over {seconds:.0f}s across {NAMESPACES} namespaces ({RATE}/s)")
        stop = threading.Event()

        def sample() -> None:
            from tests.faults.harness import rss_kib

            while not stop.wait(SAMPLE_S):
                row: dict[str, Any] = {"t": round(time.monotonic() - t0, 1), "published": publisher.done_count}
                for w, name in ((learner, "learner"), (curate, "curate")):
                    row[f"rss_{name}_kib"] = rss_kib(w.pid)
                row["rss_simulator_kib"] = rss_kib(run.sim.pid) if run.sim and run.sim.pid else None
                row["lag"] = run.consumer_lag()
                try:
                    versions = _versions(run, namespaces)
                    row["versions"] = versions
                    row["versions_total"] = sum(versions.values())
                except Exception as exc:  # a sample, not a check
                    row["versions_error"] = repr(exc)
                samples.append(row)
                print(
                    f"    t={row['t']:6.0f}s published {row['published']:5d}  RSS learner "
                    f"{(row['rss_learner_kib'] or 0) / 1024:6.1f} MB  curate {(row['rss_curate_kib'] or 0) / 1024:6.1f}"
                    f" MB  sim {(row['rss_simulator_kib'] or 0) / 1024:6.1f} MB  lag {row['lag']}  versions "
                    f"{row.get('versions_total')}",
                    flush=True,
                )
                run.check_no_crash()

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        publisher.join_checked(timeout_s=seconds * 2 + 120)
        producer.close()
        stop.set()
        sampler.join(timeout=60)
        settler = Settler(run)
        settle_started = time.monotonic()
        settler.wait(producer.sent, 600)
        settle_s = time.monotonic() - settle_started
        settler.close()
        # Faust commits every second: give the last windows' offsets a moment to be committed
        lag_deadline = time.monotonic() + 30
        final_lag = run.consumer_lag()
        while final_lag != 0 and time.monotonic() < lag_deadline:
            time.sleep(1)
            final_lag = run.consumer_lag()
        time.sleep(3)
        obs = observe(run, namespaces, watcher)
        figures = Figures(scenario="soak")
        check(run, producer.sent, obs, figures)
    finally:
        run.close()

    # --- memory: growth over the last half ---------------------------------------------------------------
    duration = samples[-1]["t"]
    summary: dict[str, Any] = {"seconds": seconds, "namespaces": NAMESPACES, "rate": RATE, "traces": len(records)}
    problems = list(figures.violations)
    for name in ("learner", "curate", "simulator"):
        series = [(s["t"], s[f"rss_{name}_kib"]) for s in samples if s.get(f"rss_{name}_kib")]
        mid = _median_around(series, duration / 2, 3 * SAMPLE_S)
        end = statistics.median([v for _, v in series[-5:]])
        growth = (end - mid) / mid
        summary[f"rss_{name}"] = {
            "start_mb": round(series[0][1] / 1024, 1),
            "mid_mb": round(mid / 1024, 1),
            "end_mb": round(end / 1024, 1),
            "max_mb": round(max(v for _, v in series) / 1024, 1),
            "growth_last_half": round(growth, 4),
        }
        if name != "simulator" and growth >= MAX_RSS_GROWTH:
            problems.append(f"{name} RSS grew {growth:.1%} over the last half ({mid / 1024:.0f} → {end / 1024:.0f} MB)")
    # --- lag: bounded, and drained ---------------------------------------------------------------------
    lags = [(s["t"], s["lag"]) for s in samples if s.get("lag") is not None]
    first = [lag for t, lag in lags if t <= duration / 2]
    second = [lag for t, lag in lags if t > duration / 2]
    bound = max(first, default=0) + RATE * LAG_MARGIN_S
    summary["lag"] = {
        "max_first_half": max(first, default=None),
        "max_second_half": max(second, default=None),
        "median_second_half": statistics.median(second) if second else None,
        "bound": bound,
        "after_settling": final_lag,
        "settle_s": round(settle_s, 1),
    }
    if second and max(second) > bound:
        problems.append(f"consumer lag reached {max(second)} in the last half (bound {bound:.0f})")
    if final_lag:
        problems.append(f"consumer lag {final_lag} after settling")
    # --- versions: every namespace advances in every quarter -------------------------------------------
    with_versions = [s for s in samples if "versions" in s]
    quarters = [with_versions[round(q * (len(with_versions) - 1) / 4)] for q in range(5)]
    stalled = {
        ns: q + 1
        for q in range(4)
        for ns in namespaces
        if quarters[q + 1]["versions"][ns] <= quarters[q]["versions"][ns]
    }
    summary["versions"] = {
        "per_quarter_total": [q["versions_total"] for q in quarters],
        "final": _last_versions(with_versions),
        "stalled": stalled,
    }
    if stalled:
        problems.append(f"versions did not advance in some quarter: {stalled}")
    summary["invariants"] = figures.as_dict()
    out = workdir / "soak.json"
    out.write_text(json.dumps({"summary": summary, "samples": samples}, indent=2, default=str))
    for line in figure_lines(figures)[:5]:
        print(line)
    print(json.dumps({k: v for k, v in summary.items() if k != "invariants"}, indent=2, default=str))
    print(f"soak figures: {out}")
    assert not problems, "\n".join(problems)


def _last_versions(samples: list[dict[str, Any]]) -> dict[str, int]:
    return dict(samples[-1]["versions"]) if samples else {}
