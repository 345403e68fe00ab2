"""The closed loop's bookkeeping (combee/closedloop.py), its SIMULATED task world (combee/bench/closed_loop.py) and
the one-version removal of several bullets its injection uses (Control.bullet_ids, combee.quarantine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from combee.bench.closed_loop import LoopConfig, fleet_task, hot_rules, lesson_bullets, summary_table, validation_text
from combee.closedloop import (
    AgentRecord,
    answering_decision,
    assess,
    per_version,
    seq_at,
    served_share,
    text_chart,
    timeline,
    version_table,
)
from combee.models import Bullet, Playbook, Provenance
from combee.quarantine import UnknownBullet, remove_bullets
from combee.sim.world import expected_answer, insight_keys_in
from combee.validation import parse_validation
from streams.codec import decode, encode
from streams.control_auth import canonical, sign
from streams.envelopes import Control


def rec(seq: int, version: int, success: bool, *, at: float | None = None, phase: str = "decide") -> AgentRecord:
    return AgentRecord(at=float(seq) if at is None else at, seq=seq, phase=phase, agent=f"a{seq % 7}",
                       version=version, success=success)  # fmt: skip


def test_per_version_counts_each_version_the_agents_ran_with() -> None:
    records = [rec(0, 0, False), rec(1, 0, True), rec(2, 3, True), rec(3, 3, True), rec(4, 3, False)]
    counts = per_version(records)
    assert list(counts) == [0, 3]
    assert (counts[0].success, counts[0].failure) == (1, 1)
    assert (counts[3].success, counts[3].failure, counts[3].unknown) == (2, 1, 0)
    assert per_version([]) == {}
    table = version_table(records)
    assert "v3" in table and "66.7%" in table


def test_the_timeline_cuts_tasks_into_blocks_one_row_per_version_present() -> None:
    records = [rec(i, 1 if i < 5 else 2, i % 2 == 0) for i in range(10)]
    rows = timeline(reversed(records), 4)  # order of arrival does not matter: task order does
    assert [(r.start, r.version, r.n, r.success) for r in rows] == [
        (0, 1, 4, 2), (4, 1, 1, 1), (4, 2, 3, 1), (8, 2, 2, 1),
    ]  # fmt: skip
    assert rows[0].rate == 0.5
    assert "v2" in text_chart(rows)
    with pytest.raises(ValueError):
        timeline(records, 0)


def test_served_share_is_the_share_of_tasks_that_ran_one_of_the_versions() -> None:
    records = [rec(i, 5 if i % 4 == 0 else 4, True) for i in range(20)]
    assert served_share(records, [5]) == 0.25
    assert served_share(records, range(5, 9)) == 0.25
    assert served_share(records, [7]) == 0.0
    assert served_share([], [5]) is None
    assert seq_at(records, 10.0) == 10 and seq_at(records, 99.0) is None


DECISIONS = [
    {"action": "policy", "version": 0, "decided_by": "operator:x", "at": 5.0},
    {"action": "reject", "version": 2, "decided_by": "gate", "at": 9.0},  # before the injection: not the answer
    {"action": "rollback", "version": 4, "decided_by": "outcomes", "at": 30.0},
    {"action": "reject", "version": 4, "decided_by": "canary", "at": 25.0},
    {"action": "reject", "version": 4, "decided_by": "gate", "at": 21.0},
]


def test_the_answering_decision_is_the_first_expected_one_after_the_injection() -> None:
    assert answering_decision(DECISIONS, "gate", after=10.0)["at"] == 21.0  # type: ignore[index]
    assert answering_decision(DECISIONS, "gate", after=1.0)["at"] == 9.0  # type: ignore[index]
    assert answering_decision(DECISIONS, "canary", after=10.0)["decided_by"] == "canary"  # type: ignore[index]
    assert answering_decision(DECISIONS, "direct", after=10.0)["action"] == "rollback"  # type: ignore[index]
    assert answering_decision(DECISIONS, "direct", after=31.0) is None


def _run(bad_served: int, *, total: int = 100) -> list[AgentRecord]:
    """Tasks 0..9 before the injection (at 10); task i of 10..39 at time i, the first ``bad_served`` of them on v4
    (bad), the others on the live v3; the ``after`` phase from task 40 on v5."""
    out = [rec(i, 3, True, phase="before") for i in range(10)]
    out += [rec(i, 4 if i - 10 < bad_served else 3, False) for i in range(10, 40)]
    out += [rec(i, 5, True, at=100.0 + i, phase="after") for i in range(40, total)]
    return out


def test_assess_gate_holds_only_when_no_agent_ran_the_bad_version() -> None:
    kept = assess("gate", _run(0), DECISIONS, injected_at=10.0, live_before=3, bad_version=4, last_bad=4)
    assert kept.passed and kept.checks == {"decided": True, "never_served": True, "none_after": True}
    assert kept.traces_to_decide == 11 and kept.bad_traces_to_decide == 0  # tasks 10..20 come before at=21
    leaked = assess("gate", _run(1), DECISIONS, injected_at=10.0, live_before=3, bad_version=4, last_bad=4)
    assert not leaked.passed and leaked.checks["never_served"] is False and leaked.served_bad_total == 1
    undecided = assess("gate", _run(0), DECISIONS[:2], injected_at=10.0, live_before=3, bad_version=4, last_bad=4)
    assert not undecided.passed and undecided.traces_to_decide is None


def test_assess_canary_measures_the_served_share_against_the_fraction() -> None:
    # until the canary's decision (at 25: tasks 10..24, 15 tasks) 3 ran the bad version: share 0.2
    def share(fraction: float) -> tuple[bool, float | None]:
        a = assess("canary", _run(3), DECISIONS, injected_at=10.0, live_before=3, bad_version=4, last_bad=6,
                   fraction=fraction)  # fmt: skip
        return a.checks["share_within_2_points"], a.served_share

    assert share(0.2) == (True, 0.2)
    assert share(0.19)[0] and share(0.215)[0]
    assert not share(0.17)[0] and not share(0.23)[0]
    assert not assess("canary", _run(3), DECISIONS, injected_at=10.0, live_before=3, bad_version=4,
                      last_bad=6).passed  # no fraction given: nothing to compare with  # fmt: skip


def test_assess_direct_needs_the_bad_version_served_and_gone_after_the_decision() -> None:
    served = assess("direct", _run(30), DECISIONS, injected_at=10.0, live_before=3, bad_version=4, last_bad=4)
    assert served.passed and served.traces_to_decide == served.bad_traces_to_decide == 20  # tasks 10..29
    never = assess("direct", _run(0), DECISIONS, injected_at=10.0, live_before=3, bad_version=4, last_bad=4)
    assert never.checks["served"] is False
    still = [*_run(30), rec(200, 4, False, at=300.0, phase="after")]
    lingering = assess("direct", still, DECISIONS, injected_at=10.0, live_before=3, bad_version=4, last_bad=4)
    assert lingering.checks["none_after"] is False
    doc = {"policies": {"direct": {"assessment": served.as_json()}}}
    assert "rollback v4 by outcomes" in summary_table(doc) and "SIMULATED" in summary_table(doc)


def test_fleet_tasks_name_their_rule_and_the_validation_set_never_repeats_a_task() -> None:
    cfg = LoopConfig(hot_rules=5, validation_tasks=20)
    rules = hot_rules(cfg)
    assert len(rules) == 5 and hot_rules(cfg) == rules
    task, truth = fleet_task(rules, 7, cfg.seed)
    assert (task, truth) == fleet_task(rules, 7, cfg.seed) and truth == expected_answer(task)
    assert insight_keys_in(task)[0] in rules  # what the simulated generator keys its answer on
    val = parse_validation(validation_text(cfg, rules))
    fleet = {fleet_task(rules, j, cfg.seed)[0] for j in range(2000)}
    assert len(val) == 20 and not {t.task for t in val} & fleet


def _bullet(n: int, content: str) -> Bullet:
    prov = Provenance(window_id="w0", version=1)
    return Bullet(id=f"b{n:05d}", section="s", content=content, created=prov, updated=prov)


def test_the_bad_version_removes_every_lesson_bullet_in_one_version() -> None:
    pb = Playbook(namespace="ns", version=3, next_id=4, bullets=(
        _bullet(1, "Rule FX-0001: use diluted shares."), _bullet(2, "Double-check the units."),
        _bullet(3, "For EBITDA questions: see rule FX-0042."),
    ))  # fmt: skip
    doomed = lesson_bullets(pb)
    assert doomed == ("b00001", "b00003")
    bad = remove_bullets(pb, doomed)
    assert bad.version == 4 and [b.id for b in bad.bullets] == ["b00002"] and bad.next_id == 4
    with pytest.raises(UnknownBullet, match="b00009"):
        remove_bullets(pb, ("b00001", "b00009"))  # one unknown: nothing removed, no version


def test_a_control_record_names_several_bullets_only_for_a_remove_and_old_records_are_unchanged() -> None:
    plain = Control(namespace="ns", kind="remove", bullet_id="b00001", requested_at=1.0)
    assert "bullet_ids" not in json.loads(encode(plain))  # byte for byte what older workers read and sign
    assert b"bullet_ids" not in canonical(plain)
    several = Control(namespace="ns", kind="remove", bullet_ids=("b00001", "b00002"), requested_at=1.0)
    back = decode(encode(sign(several, b"k" * 32)))
    assert isinstance(back, Control) and back.bullet_ids == ("b00001", "b00002") and back.signature is not None
    assert canonical(back) != canonical(plain.model_copy(update={"bullet_id": None}))  # the signature covers them
    with pytest.raises(ValidationError):
        Control(namespace="ns", kind="pin", bullet_ids=("b00001",), requested_at=1.0)
    with pytest.raises(ValidationError):
        Control(namespace="ns", kind="remove", bullet_id="b00003", bullet_ids=("b00001",), requested_at=1.0)


def test_the_demo_options_choose_the_policies_and_the_rate() -> None:
    import argparse

    from combee.cli.demo_loop import loop_config

    def args(**kw: object) -> argparse.Namespace:
        return argparse.Namespace(**{"time_scale": 0.02, "policies": None, "rate": None, **kw})

    assert loop_config(args()).policies == ("gate", "canary", "direct") and loop_config(args()).rate == 25.0
    assert loop_config(args(policies="direct, gate", rate=10.0)).policies == ("direct", "gate")
    assert loop_config(args(rate=10.0)).rate == 10.0
    with pytest.raises(SystemExit, match="manual"):
        loop_config(args(policies="gate,manual"))


def test_the_result_files_hold_the_table_the_records_and_the_plot(tmp_path: Path) -> None:
    import gzip

    from combee.bench.closed_loop import write_results

    records = _run(30)
    result = assess("direct", records, DECISIONS, injected_at=10.0, live_before=3, bad_version=4, last_bad=4)
    part = {"assessment": result.as_json(), "timeline": [vars(r) for r in timeline(records, 10)],
            "marks": {"injected": 10, "decided": 30}}  # fmt: skip
    doc = {"config": {"block": 10}, "policies": {"direct": part}}
    write_results(doc, {"direct": records}, tmp_path)
    assert json.loads((tmp_path / "closed-loop.json").read_text())["policies"]["direct"]["assessment"]["passed"]
    with gzip.open(tmp_path / "records.jsonl.gz", "rt") as fh:
        assert sum(1 for _ in fh) == len(records)
    text = (tmp_path / "closed-loop.txt").read_text()
    assert "rollback v4 by outcomes" in text and "SIMULATED" in text and "v4" in text
    assert doc["plot"] == "closed-loop.png" and (tmp_path / "closed-loop.png").stat().st_size > 0
