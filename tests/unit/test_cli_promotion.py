"""How ``combee status`` and ``combee prompt history`` show promotion (combee/cli/promote.py, combee/cli/status.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from combee.cli.promote import gate_sets
from combee.cli.status import promotion_lines
from combee.gate import PairedScores, decide_gate
from combee.outcomes import OutcomeCounts
from combee.promotion import GateRule, Rule, decide_canary
from combee.promotion_text import describe_decision, serving_summary
from combee.serving import Serving


def test_status_shows_the_policy_the_pending_candidate_and_the_last_decision_with_its_evidence() -> None:
    state = Serving(policy="canary", live=4, fraction=0.2)
    table = {"4": OutcomeCounts(160, 40), "5": OutcomeCounts(50, 100)}
    decision = decide_canary(state, 5, table, Rule(min_decided=100), at=0.0)
    assert decision is not None
    row = {**vars(state), "candidate": 5, "decisions": [decision.as_json()]}
    lines = promotion_lines(row, 5)
    assert lines[0] == "  promotion: policy canary (fraction 0.2): live v4, candidate v5 pending"
    assert "reject v5 by canary under canary, serving v4: worse:" in lines[1]
    assert "[candidate n=150 success=50; baseline n=200 success=160]" in lines[1]


def test_direct_and_no_state_say_so() -> None:
    assert serving_summary(Serving(), 7) == "policy direct: every new version is served (head v7)"
    assert promotion_lines({}, 7) == []
    rejected = Serving(policy="manual", live=3, rejected_through=6)
    assert serving_summary(rejected, 6) == "policy manual: live v3, no candidate pending, rejected through v6"
    assert "policy" in describe_decision({"action": "policy", "version": 0, "decided_by": "operator:ana"})


def test_a_gate_decision_shows_its_paired_evidence() -> None:
    state = Serving(policy="gate", live=4)
    pairs = PairedScores(both=20, candidate_only=0, baseline_only=15, neither=5)
    decision = decide_gate(state, 5, pairs, GateRule(min_pairs=20), at=0.0)
    assert decision is not None
    line = describe_decision(decision.as_json())
    assert "reject v5 by gate under gate, serving v4: worse:" in line
    assert "[candidate n=40 success=20; baseline n=40 success=35]" in line


def test_policy_gate_checks_its_validation_file_before_touching_redis(tmp_path: Path) -> None:
    bad = tmp_path / "v.jsonl"
    bad.write_text('{"task": "t", "truth": "x"}\n{"task": "t", "truth": "x", "grader": "nope"}\n')
    env = {**os.environ, "COMBEE_REDIS_URL": "redis://127.0.0.1:1/0"}  # nothing listens: never reached

    def policy(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "combee.cli", "prompt", "policy", "ns", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)

    done = policy("gate", "--validation", str(bad))
    assert done.returncode != 0 and "line 2: unknown grader 'nope'" in done.stderr
    done = policy("manual", "--validation", str(bad))
    assert done.returncode != 0 and "--validation goes with the gate policy" in done.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    done = policy("gate", "--validation", str(empty))
    assert done.returncode != 0 and "holds no task" in done.stderr


def test_a_gated_namespace_says_where_its_validation_tasks_come_from() -> None:
    assert gate_sets(None, 0) == "the workers' default validation file and 0 held-out traces"
    assert gate_sets('{"task": "a", "truth": "1"}\n\n{"task": "b", "truth": "2"}\n', 3) == (
        "its own validation set (2 tasks) and 3 held-out traces"
    )
