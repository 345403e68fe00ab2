"""The promotion checks of the fault suite (tests/faults/promotion_checks.py) fail on the bookkeeping errors they
are there to catch. No services: they run in ``make test`` too."""

from __future__ import annotations

from typing import Any

from combee.outcomes import OutcomeCounts
from combee.serving import Serving
from tests.faults.promotion_checks import (
    applied_decisions,
    decision_violations,
    decisions_on,
    expected_outcomes,
    outcome_violations,
)

NS = "fx-gate"


def _d(action: str, version: int, serve: int | None, *, at: float, live: int | None = None, top: int = 0) -> Any:
    evidence = {} if live is None else {"baseline_version": live, "candidate_version": top or version}
    did = f"{action}/v{version}" if action != "policy" else f"policy/{at:.6f}"
    return {"id": did, "action": action, "version": version, "serve": serve, "decided_by": "gate", "at": at,
            "evidence": evidence}  # fmt: skip


#: A clean history: the policy set, v1 promoted (nothing live), v2..v3 rejected (the live content again as v4),
#: v4 promoted without an evaluation, v5 promoted.
CLEAN = [
    _d("policy", 0, None, at=1.0),
    _d("promote", 1, 1, at=2.0),
    _d("reject", 2, 1, at=3.0, live=1, top=3),
    _d("promote", 4, 4, at=4.0, live=1),
    _d("promote", 5, 5, at=5.0, live=4),
]
LOG = "\n".join(
    f"[x] [1] [WARNING] {NS}: {d['action']} v{d['version']} by gate under gate (serving v{d['serve']}): why"
    for d in CLEAN
    if d["action"] != "policy"
)
END = Serving(policy="gate", live=5, previous=4, rejected_through=3, serial=len(CLEAN))


def test_a_clean_history_passes() -> None:
    applied = applied_decisions([LOG, "unrelated line"], NS)
    assert applied == {"promote/v1": 1, "reject/v2": 1, "promote/v4": 1, "promote/v5": 1}
    assert (
        decision_violations(
            CLEAN, END, 5, applied, served=[(1.5, 1), (4.5, 4), (9.0, 5)], served_only_live=True, by="gate"
        )
        == []
    )
    assert [d["id"] for d in decisions_on(CLEAN, 2, "gate")] == ["reject/v2"]  # not the promotion of v4 too
    assert [d["id"] for d in decisions_on(CLEAN, 4, "gate")] == ["promote/v4"]


def test_a_decision_applied_twice_is_caught_by_the_serial_and_by_the_logs() -> None:
    applied = applied_decisions([LOG, LOG.splitlines()[-1]], NS)
    twice = Serving(policy="gate", live=5, previous=4, rejected_through=3, serial=len(CLEAN) + 1)
    found = decision_violations(CLEAN, twice, 5, applied)
    assert any("changed 6 times for 5 recorded decisions" in v for v in found)
    assert any("promote/v5 was applied 2 times" in v for v in found)


def test_a_promoted_or_served_rejected_version_and_a_pending_candidate_are_caught() -> None:
    bad = [*CLEAN, _d("promote", 3, 3, at=6.0, live=5)]  # v3 was rejected, then promoted (and live goes back)
    state = Serving(policy="gate", live=3, previous=5, rejected_through=3, serial=len(bad))
    applied = applied_decisions([LOG, f"{NS}: promote v3 by gate under gate (serving v3): x"], NS)
    served = [(1.5, 1), (2.5, 2), (3.5, 2), (5.5, 2), (2.9, 3)]  # v2 read well after its rejection at 3.0
    found = decision_violations(bad, state, 6, applied, served=served, served_only_live=True)
    text = "\n".join(found)
    assert "versions [3] were both promoted and rejected" in text
    assert "from v5 back to v3" in text
    assert "the live version at the end is v3" in text
    assert "agents were served versions after their rejection: [2]" in text
    assert "never promoted: [2]" in text
    assert "not every candidate was decided: head v6" in text
    assert [d["id"] for d in decisions_on(bad, 3, "gate")] == ["reject/v2"]


def test_a_decision_lost_between_the_log_and_redis_is_caught() -> None:
    applied = applied_decisions([LOG, f"{NS}: promote v6 by gate under gate (serving v6): x"], NS)
    found = decision_violations(CLEAN, END, 5, applied)
    assert found == ["a worker applied decision promote/v6, which Redis does not record"]


def test_outcomes_counted_twice_or_lost_are_caught() -> None:
    traces: list[dict[str, Any]] = [
        {"playbook_version": 1, "feedback": {"success": True}},
        {"playbook_version": 1, "feedback": {"success": False}},
        {"playbook_version": 2, "feedback": {}},
        {"feedback": {"success": True}},  # names no version: counted nowhere
    ]
    expected = expected_outcomes(traces)
    assert expected == {"1": OutcomeCounts(1, 1, 0), "2": OutcomeCounts(0, 0, 1)}
    assert outcome_violations(expected, dict(expected)) == []
    counted = {"1": OutcomeCounts(2, 1, 0), "unknown": OutcomeCounts(0, 0, 1)}
    assert outcome_violations(expected, counted) == [
        "outcomes of v1: counted (success, failure, unknown) = (2, 1, 0), the traces say (1, 1, 0)",
        "outcomes of v2: counted (success, failure, unknown) = (0, 0, 0), the traces say (0, 0, 1)",
        "outcomes of vunknown: counted (success, failure, unknown) = (0, 0, 1), the traces say (0, 0, 0)",
    ]


def test_a_version_decided_twice_or_never_is_caught() -> None:
    twice = [*CLEAN[:-1], _d("promote", 5, 5, at=5.0, live=4), _d("promote", 6, 6, at=6.0, live=4)]
    state = Serving(policy="gate", live=6, previous=5, rejected_through=3, serial=len(twice))
    log = LOG + f"\n{NS}: promote v6 by gate under gate (serving v6): x"
    found = decision_violations(twice, state, 6, applied_decisions([log], NS), by="gate")
    assert found == ["v5 has 2 decisions of the gate: ['promote/v5', 'promote/v6'] (exactly one expected)"]
    # v4 promoted over a live v3 that no decision made live: v2 and v3 were never decided
    never = [*CLEAN[:2], _d("promote", 4, 4, at=4.0, live=3), CLEAN[-1]]
    log = "\n".join(line for line in LOG.splitlines() if "reject" not in line)
    state = Serving(policy="gate", live=5, previous=4, serial=len(never))
    found = decision_violations(never, state, 5, applied_decisions([log], NS), by="gate")
    assert found == [f"v{v} has 0 decisions of the gate: [] (exactly one expected)" for v in (2, 3)]


def test_successive_rejections_decide_each_version_once() -> None:
    """A canary whose arm is worse: v2..v3 rejected, the live content committed as v4, which (and v5) is rejected
    next: each version has one decision, the second rejection's does not reach back to v2."""
    canary = [
        {**d, "decided_by": "canary"}
        for d in (
            CLEAN[0],
            CLEAN[1],
            _d("reject", 2, 1, at=3.0, live=1, top=3),
            _d("reject", 4, 1, at=4.0, live=1, top=5),
        )
    ]
    state = Serving(policy="canary", live=1, rejected_through=5, serial=len(canary))
    log = "\n".join(f"{NS}: {d['action']} v{d['version']} by canary under canary (serving v1): x" for d in canary[1:])
    assert decision_violations(canary, state, 6, applied_decisions([log], NS), settled=False, by="canary") == []
    assert [d["id"] for d in decisions_on(canary, 2, "canary")] == ["reject/v2"]
    assert [d["id"] for d in decisions_on(canary, 5, "canary")] == ["reject/v4"]
