"""The closed loop on the real services (docs/promotion.md, "The closed loop"): SIMULATED agents read their prompt
through their own AsyncPromptClient, answer with the simulator's generator and publish traces naming the version;
the worker learns from them; then a version without the lesson bullets is injected under ``gate``. The gate
rejects it, and no agent ever runs it: not by the agents' own records, not by the worker's outcome counts."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from combee.bench.closed_loop import LoopConfig, run_closed_loop, worker_env
from streams.redis_promotion import SERVING_FIELDS, parse_serving
from tests.integration.pipeline import Pipeline
from tests.integration.streams_support import kafka_bootstrap_or_skip, redis_url_or_skip

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]
STARTUP_S = 300
CONFIG = LoopConfig(
    policies=("gate",), agents=200, rate=25.0, hot_rules=8, window=200, max_wait_s=30.0, learn_tasks=200,
    before_tasks=0, max_decide_tasks=600, after_tasks=40, validation_tasks=60, gate_min_pairs=40, block=50,
    settle_timeout_s=240.0,
)  # fmt: skip


@pytest.fixture
def pipe(tmp_path: Path) -> Iterator[Pipeline]:
    p = Pipeline(kafka_bootstrap_or_skip(), redis_url_or_skip(), tmp_path, time_scale=CONFIG.time_scale)
    p.start_sim(STARTUP_S)
    try:
        yield p
    finally:
        p.close()


def test_the_gate_rejects_the_injected_bad_version_and_no_agent_ever_runs_it(pipe: Pipeline, tmp_path: Path) -> None:
    pipe.create_topics()
    pipe.start_worker(**worker_env(CONFIG), COMBEE_MAX_WAIT_S=str(CONFIG.max_wait_s))
    assert pipe.sim is not None
    out = tmp_path / "out"
    doc = run_closed_loop(CONFIG, out, bootstrap=pipe.bootstrap, redis_url=pipe.redis_url, prefix=pipe.prefix,
                          base_url=pipe.sim.base_url)  # fmt: skip
    part = doc["policies"]["gate"]
    a = part["assessment"]
    bad = a["bad_version"]
    assert a["decision"]["action"] == "reject" and a["decision"]["decided_by"] == "gate", pipe.workers[0].tail()
    assert a["decision"]["evidence"]["comparison"]["verdict"] == "worse"
    assert a["passed"] and a["served_bad_total"] == 0
    # independently of the bookkeeping: the records written, the serving state and the worker's own counts
    with gzip.open(out / "records.jsonl.gz", "rt") as fh:
        records = [json.loads(line) for line in fh]
    ran = {r["version"] for r in records}
    assert 0 in ran and a["live_before"] in ran and bad not in ran
    state = parse_serving(pipe.redis().hmget(pipe.keys.serving("loop-gate"), SERVING_FIELDS))
    assert state.policy == "gate" and state.rejected_through >= bad and state.live != bad
    assert part["worker_outcomes"].get(str(bad), {"n": 0})["n"] == 0
    # the worker counted every published trace once, under the version it named (v0's: before any was live)
    counted = part["worker_outcomes"]
    assert sum(c["n"] for c in counted.values()) == len(records)
    for version, mine in part["agents_per_version"].items():
        if version != "0":
            assert (counted[version]["n"], counted[version]["success"]) == (mine["n"], mine["success"])
    removed = [d for d in pipe.deltas("loop-gate") if d.version == bad]
    assert removed and removed[0].window_id.startswith("loop-gate/remove/")
    assert part["removed_bullets"] > 0 and (out / "closed-loop.json").exists()
