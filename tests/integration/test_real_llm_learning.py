"""The CI smoke of learning with a REAL model: the local Qwen2.5-Coder (llama.cpp, deploy/llm.py) answers a few
Formula questions as the agent, then Combee learns one window of those real traces offline (``combee learn``)
and one through the streaming pipeline (Kafka → workers → Redis).

Skipped unless the llm extra is installed (``pip install -e '.[dev,llm]'``, as CI does); deselect with
``-m "not real_llm"``. Sized to a handful of requests: two traces, so about 8 model calls (2 agent answers; offline 2
reflections and 1-2 curator groups; streaming its own curator groups, its reflections from the shared cache), a few
minutes on 2 cores. Never run it beside another CPU-heavy job: a CPU model slows several-fold.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from combee.cli.demo import real_traces
from deploy import llm
from tests.integration.pipeline import Pipeline
from tests.integration.streams_support import kafka_bootstrap_or_skip, redis_url_or_skip
from tests.integration.test_real_llm_server import free_port, installed_model
from tests.support import REAL_MODEL_TRACES, real_model_questions

pytestmark = [pytest.mark.real_llm, pytest.mark.slow, pytest.mark.timeout(1800)]

N_TRACES = REAL_MODEL_TRACES
NAMESPACE = "finance-formula"


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One response cache for both tests: the streaming run reuses the offline run's reflections (the same
    trace against the same empty playbook is the same request) and asks the model afresh for everything its
    own window plan changes (curator groups and merges are seeded by the window id). Keeps CI to minutes."""
    return tmp_path_factory.mktemp("answers")


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A private local model server (2 slots of 4,096 tokens) and N_TRACES real traces made with it, answering the
    Formula rows carried in tests/data/finance."""
    model = installed_model()
    questions = real_model_questions()
    state_dir = tmp_path_factory.mktemp("llm-state")
    cfg = llm.make_config(model=model, port=free_port(), slots=2, ctx=8192)
    running, _ = llm.up(cfg, state_dir, timeout_s=600, tied_to_caller=True)
    try:
        traces = real_traces(running.base_url, llm.ALIAS, questions, concurrency=2)
        yield running.base_url, traces
    finally:
        llm.down(state_dir)


def _role_figures(metrics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    roles = metrics.get("roles") or {}
    assert isinstance(roles, dict) and roles, f"metrics.json has no per-role figures: {sorted(metrics)}"
    return roles


def test_learns_one_window_of_real_traces_offline(
    real: tuple[str, list[dict[str, Any]]], answers: Path, tmp_path: Path
) -> None:
    base_url, traces = real
    assert len(traces) == N_TRACES and all(t["feedback"]["ground_truth"] for t in traces)
    path = tmp_path / "traces.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in traces))
    out = tmp_path / "learned"
    cmd = [sys.executable, "-m", "combee.cli", "learn", "--traces", str(path), "--method", "combee",
           "--batch-size", str(N_TRACES), "--base-url", base_url, "--model", llm.ALIAS, "--llm-concurrency", "2",
           "--out", str(out), "--quiet", "--cache-dir", str(answers)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    playbook = json.loads((out / "playbook.json").read_text())
    print(json.dumps({k: metrics.get(k) for k in ("wall_s", "llm_calls", "roles", "playbook_entries")}, indent=1))
    assert playbook["bullets"], "a real model's window of traces taught nothing"
    roles = _role_figures(metrics)
    assert {"reflector", "curator"} <= set(roles), f"a learning role was never asked: {sorted(roles)}"
    for role, figures in roles.items():
        # every refused answer is counted (parse_failures) and re-asked with the parser's error; a call whose
        # every answer was refused is given up and counted, never applied half-parsed or dropped unseen
        calls, rejected, gave_up = figures["calls"], figures["parse_failures"], figures["gave_up"]
        assert rejected <= max(1, calls // 10), f"{role}: {rejected} of {calls} answers rejected: {figures}"
        assert gave_up <= 1, f"{role}: {gave_up} calls given up: {figures}"


def test_learns_real_traces_through_the_streaming_pipeline(
    real: tuple[str, list[dict[str, Any]]], answers: Path, tmp_path: Path
) -> None:
    base_url, traces = real
    pipe = Pipeline(kafka_bootstrap_or_skip(), redis_url_or_skip(), tmp_path, base_url=base_url)
    try:
        pipe.start_worker(
            "--role", "all",
            COMBEE_MODEL=llm.ALIAS,
            COMBEE_LLM_MAX_CONCURRENCY="2",
            COMBEE_LLM_TIMEOUT_S="900",
            COMBEE_BS_MIN="1",
            COMBEE_BS_CANDIDATES=f"[{N_TRACES}]",
            COMBEE_MAX_WAIT_S="5",
            COMBEE_CACHE_DIR=str(answers),
        )  # fmt: skip
        pipe.publish_traces(traces)
        pipe.wait_learned({NAMESPACE: N_TRACES}, timeout_s=1200)
        version = pipe.current_version(NAMESPACE)
        playbook = pipe.published_playbook(NAMESPACE, version)
        assert version >= 1 and playbook.bullets, "the streamed window of real traces taught nothing"
    finally:
        pipe.close()
