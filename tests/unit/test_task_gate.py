"""``combee task gate`` (combee/cli/task_gate.py): the gate's evaluation and decision on two playbook files, run
against the in-process SIMULATED model; the decision logic itself is tested in tests/unit/test_gate.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from combee.cli.main import main
from combee.models import Bullet, Playbook, Provenance

PROV = Provenance(window_id="w", version=1)


def _files(tmp_path: Path, tasks: int) -> list[str]:
    live = Playbook(namespace="formula")
    lesson = Bullet(id="b00001", section="s", content="Give two decimals.", created=PROV, updated=PROV)
    candidate = Playbook(namespace="formula", version=1, bullets=(lesson,), next_id=2)
    (tmp_path / "live.json").write_text(live.model_dump_json())
    (tmp_path / "candidate.json").write_text(candidate.model_dump_json())
    lines = [json.dumps({"id": f"q{i}", "task": f"What is {i} + {i}?", "truth": str(2 * i)}) for i in range(tasks)]
    (tmp_path / "val.jsonl").write_text("\n".join(lines) + "\n")
    playbooks = ["--candidate", str(tmp_path / "candidate.json"), "--live", str(tmp_path / "live.json")]
    return [*playbooks, "--validation", str(tmp_path / "val.jsonl"), "--out", str(tmp_path / "out"), "--sim", "--quiet"]


@pytest.mark.timeout(120)
def test_gate_on_two_playbooks_writes_both_sides_task_by_task_and_the_decision_they_imply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["task", "gate", *_files(tmp_path, 30), "--min-pairs", "30"]) == 0
    assert "SIMULATED" in capsys.readouterr().out
    doc = json.loads((tmp_path / "out" / "gate.json").read_text())
    assert doc["simulated"] is True and len(doc["tasks"]) == 30
    assert (doc["candidate"]["version"], doc["live"]["version"]) == (1, 0)
    ev = doc["decision"]["evidence"]
    right = {side: sum(bool(t[side] and t[side]["success"]) for t in doc["tasks"]) for side in ("candidate", "live")}
    assert ev["candidate"]["success"] == right["candidate"] and ev["baseline"]["success"] == right["live"]
    assert sum(ev["pairs"].values()) == 30
    both = sum(
        bool(t["candidate"] and t["candidate"]["success"] and t["live"] and t["live"]["success"]) for t in doc["tasks"]
    )
    assert ev["pairs"]["both"] == both
    verdict = ev["comparison"]["verdict"]
    assert doc["decision"]["action"] == ("promote" if verdict == "not_worse" else "reject")
    assert doc["phase"]["calls"] >= 60  # every task answered with each playbook
    assert "Decision:" in (tmp_path / "out" / "gate.md").read_text()


def test_too_few_tasks_is_refused_before_any_model_call(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["task", "gate", *_files(tmp_path, 5), "--min-pairs", "30"]) == 2
    assert "has 5 tasks; the gate needs at least 30" in capsys.readouterr().err
    assert not (tmp_path / "out" / "gate.json").exists()


def test_gate_needs_both_playbooks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["task", "gate", "--out", str(tmp_path / "out"), "--sim"]) == 2
    assert "--candidate FILE and --live FILE" in capsys.readouterr().err
