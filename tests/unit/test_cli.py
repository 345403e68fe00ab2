"""The ``combee`` command's contract: files written, call counts, and one-line errors (never a traceback)."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from combee.sim.config import SimConfig
from combee.sim.runner import SimThread


@pytest.fixture(scope="module")
def sim() -> Iterator[SimThread]:
    with SimThread(SimConfig(seed=1, time_scale=0.0), world="combee") as s:
        yield s


def combee(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full_env = {**os.environ, "COMBEE_LLM_MAX_ATTEMPTS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "combee.cli", *args], capture_output=True, text=True, timeout=120, env=full_env
    )


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("traces") / "t.jsonl"
    done = combee("sim", "traces", "--n", "60", "--seed", "1", "--out", str(out), "--test-n", "20")
    assert done.returncode == 0, done.stderr
    assert "SIMULATED" in done.stdout
    return out


def test_learn_writes_outputs_and_call_counts_match_the_plan(sim: SimThread, trace_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    test_file = str(trace_file.with_name("t.test.jsonl"))
    done = combee("learn", "--traces", str(trace_file), "--method", "combee", "--batch-size", "20", "--out", str(out),
                  "--quiet", "--base-url", sim.base_url, "--test", test_file, "--reduce-shape", "none")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "(SIMULATED endpoint)" in done.stdout
    m = json.loads((out / "metrics.json").read_text())
    for key in ("method", "batch_sizes", "iterations", "wall_s", "llm_calls", "prompt_tokens", "completion_tokens",
                "playbook_entries", "playbook_tokens", "simulated", "roles"):  # fmt: skip
        assert key in m
    assert m["simulated"] is True and m["batch_sizes"] == [20, 20, 20] and m["iterations"] == 3
    assert m["method_config"]["reduce_shape"] == "none"
    # per iteration (the paper's reduce): n reflector calls; floor(sqrt(t)) group calls over the t reflections that
    # teach something (the others hold no insight for a curator), one merge
    per = m["per_iteration"]
    assert [p["reflections"] for p in per] == [20] * 3 and all(10 <= p["teaching_reflections"] <= 20 for p in per)
    assert [(p["group_calls"], p["merge_calls"]) for p in per] == [
        (math.isqrt(p["teaching_reflections"]), 1) for p in per
    ]
    groups = sum(p["group_calls"] for p in per)
    assert m["roles"]["reflector"]["calls"] == 60 and m["roles"]["curator"]["calls"] == groups
    assert m["llm_calls"] == 60 + groups + 3
    # what applying each delta did is reported: a bullet added and then deduplicated or evicted shows up there
    applied = m["applied"]
    assert applied["added"] == sum(p["applied"].get("added", 0) for p in m["per_iteration"]) > 0
    kept = applied["added"] - applied.get("removed", 0) - applied.get("deduplicated", 0) - applied.get("evicted", 0)
    assert kept == m["playbook_entries"]
    assert m["eval"]["total"] == 20
    prompt = (out / "prompt.md").read_text()
    assert prompt.startswith("# Playbook\n") and prompt.endswith("\n(Playbook version 3.)\n")
    assert json.loads((out / "playbook.json").read_text())["version"] == 3


def test_missing_file_is_one_line() -> None:
    done = combee("learn", "--traces", "/nope/t.jsonl", "--out", "/tmp/x")
    assert done.returncode == 2
    assert done.stderr == "combee: error: trace file not found: /nope/t.jsonl\n"


def test_malformed_lines_are_reported_skipped_and_the_rest_learned(
    sim: SimThread, trace_file: Path, tmp_path: Path
) -> None:
    lines = trace_file.read_text().splitlines()[:10]
    lines.insert(3, '{"namespace": "demo", "task": ')
    lines.insert(7, '{"namespace": "demo"}')
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    done = combee("learn", "--traces", str(bad), "--batch-size", "5", "--out", str(tmp_path / "o"), "--quiet",
                  "--base-url", sim.base_url)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{bad}:4: skipped: not valid JSON" in done.stderr
    assert f"{bad}:8: skipped: invalid trace: task: Field required" in done.stderr
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["skipped_lines"] == 2
    assert "from 10 traces" in done.stdout


def test_unreachable_endpoint_is_one_line(trace_file: Path, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = combee("learn", "--traces", str(trace_file), "--out", str(tmp_path / "o"), "--quiet",
                  "--base-url", f"http://127.0.0.1:{port}/v1")  # fmt: skip
    assert done.returncode == 3
    assert done.stderr.startswith("combee: error: cannot use the LLM endpoint") and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["learn", "--traces", "t", "--out", "o", "--batch-size", "0"], "batch size must be a positive integer"),
        (["learn", "--traces", "t", "--out", "o", "--method", "magic"], "invalid choice: 'magic'"),
        (["learn", "--traces", "t"], "the following arguments are required: --out"),
        (["learn", "--traces", "t", "--out", "o", "--namespace", "a b"], "invalid namespace 'a b'"),
        (["sim", "traces", "--n", "5", "--out", "x.jsonl", "--world", "nowhere"], "unknown world 'nowhere'"),
    ],
)
def test_bad_options_are_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    done = combee(*args)
    assert done.returncode == 2
    assert message in done.stderr and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_sim_traces_without_out_writes_under_var_not_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from combee.cli.main import main

    monkeypatch.chdir(tmp_path)
    assert main(["sim", "traces", "--n", "3", "--seed", "2", "--test-n", "2"]) == 0
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == [
        "var/sim/demo-formula-n3-s2.jsonl",
        "var/sim/demo-formula-n3-s2.test.jsonl",
        "var/sim/demo-formula-n3-s2.truth.json",
    ]
    assert "var/sim/demo-formula-n3-s2.jsonl" in capsys.readouterr().out


def test_kafka_not_there_is_one_line_naming_it_and_how_to_start_it(trace_file: Path) -> None:
    # The message is the fast path's own (a socket probe before any client is built); kafka-python's bootstrap,
    # the slow path (~30 s), ends in "KafkaTimeoutError: Unable to bootstrap". No wall-clock bound: on a loaded
    # machine starting the process alone takes seconds.
    import os

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"COMBEE_KAFKA_BOOTSTRAP": f"127.0.0.1:{port}", "COMBEE_STATE_DIR": os.devnull}
    for verb in (["publish", "--traces", str(trace_file)], ["topics", "describe"], ["worker"]):
        done = combee(*verb, env=env)
        assert done.returncode == 4 and done.stderr.count("\n") == 1, (verb, done.stderr)
        assert done.stderr == (
            f"combee: error: Kafka is not reachable at 127.0.0.1:{port} (127.0.0.1:{port}: connection refused); "
            "start it, or for the local one run: combee dev up\n"
        )
