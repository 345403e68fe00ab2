"""Serving, the canary arm and the promotion decisions (combee/serving.py, combee/promotion.py): pure."""

from __future__ import annotations

import pytest

from combee.outcomes import OutcomeCounts
from combee.promotion import Rule, candidate_counts, decide_canary, decide_rollback, plan_operator
from combee.serving import Serving, arm_position, in_canary_arm, pending_candidate, served_version

RULE = Rule(margin=0.05, min_decided=100, alpha=0.05)


def counts(success: int, failure: int) -> OutcomeCounts:
    return OutcomeCounts(success=success, failure=failure)


# -- the canary arm ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fraction", [0.05, 0.1, 0.25, 0.5, 0.9])
def test_the_arm_share_is_within_two_points_of_the_fraction(fraction: float) -> None:
    ids = [f"agent-{i}" for i in range(20_000)]
    share = sum(in_canary_arm("support", a, fraction) for a in ids) / len(ids)
    assert abs(share - fraction) < 0.02, share


def test_an_agent_keeps_its_arm_and_a_larger_fraction_only_adds_agents() -> None:
    ids = [f"a{i}" for i in range(2000)]
    small = {a for a in ids if in_canary_arm("ns", a, 0.1)}
    assert small == {a for a in ids if in_canary_arm("ns", a, 0.1)}  # the same answer every time
    large = {a for a in ids if in_canary_arm("ns", a, 0.3)}
    assert small < large


def test_the_arm_depends_on_the_namespace_and_an_agent_without_id_is_never_in_it() -> None:
    ids = [f"a{i}" for i in range(2000)]
    assert [arm_position("one", a) for a in ids] != [arm_position("two", a) for a in ids]
    assert not in_canary_arm("ns", None, 1.0)
    assert all(0.0 <= arm_position("ns", a) < 1.0 for a in ids)


# -- what is served ---------------------------------------------------------------------------------------------


def test_direct_serves_the_head_and_has_no_candidate() -> None:
    direct = Serving()
    assert served_version(direct, 7, canary_arm=False) == 7
    assert served_version(direct, 7, canary_arm=True) == 7
    assert pending_candidate(direct, 7) is None
    assert served_version(direct, None, canary_arm=False) is None


def test_manual_serves_the_live_version_to_everyone() -> None:
    manual = Serving(policy="manual", live=4)
    assert pending_candidate(manual, 6) == 6
    assert served_version(manual, 6, canary_arm=False) == 4
    assert served_version(manual, 6, canary_arm=True) == 4  # no canary arm under manual
    assert served_version(Serving(policy="manual"), 3, canary_arm=False) is None  # nothing live yet


def test_canary_serves_the_candidate_to_the_arm_only_and_never_a_rejected_one() -> None:
    canary = Serving(policy="canary", live=4, fraction=0.1)
    assert served_version(canary, 6, canary_arm=True) == 6
    assert served_version(canary, 6, canary_arm=False) == 4
    rejected = Serving(policy="canary", live=4, fraction=0.1, rejected_through=6)
    assert pending_candidate(rejected, 6) is None
    assert served_version(rejected, 6, canary_arm=True) == 4
    assert served_version(rejected, 7, canary_arm=True) == 7  # built after the rejection: a new candidate


def test_bad_states_are_refused() -> None:
    with pytest.raises(ValueError):
        Serving(policy="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Serving(policy="canary", fraction=1.5)


# -- the canary's decision --------------------------------------------------------------------------------------


def test_the_canary_pools_the_chain_of_candidates_above_the_live_version() -> None:
    state = Serving(policy="canary", live=4, rejected_through=5)
    table = {"4": counts(50, 50), "5": counts(9, 0), "6": counts(3, 1), "7": counts(2, 2)}
    assert candidate_counts(state, 7, table) == counts(5, 3)


def test_the_canary_promotes_a_candidate_that_is_not_worse() -> None:
    state = Serving(policy="canary", live=4, fraction=0.2)
    table = {"4": counts(140, 60), "5": counts(100, 20), "6": counts(60, 20)}
    decision = decide_canary(state, 6, table, RULE, at=1.0)
    assert decision is not None
    assert (decision.action, decision.version, decision.serve, decision.decided_by) == ("promote", 6, 6, "canary")
    assert decision.evidence["candidate_version"] == 6 and decision.evidence["baseline_version"] == 4
    assert decision.id == "promote/v6"


def test_the_canary_rejects_a_candidate_that_is_worse_by_more_than_the_margin() -> None:
    state = Serving(policy="canary", live=4, fraction=0.2)
    table = {"4": counts(160, 40), "5": counts(50, 100)}
    decision = decide_canary(state, 5, table, RULE, at=1.0)
    assert decision is not None
    assert (decision.action, decision.version, decision.serve) == ("reject", 5, 4)
    comparison = decision.evidence["comparison"]
    assert isinstance(comparison, dict) and comparison["verdict"] == "worse"


def test_the_canary_waits_below_the_minimum_sample_and_when_it_is_undecided() -> None:
    state = Serving(policy="canary", live=4, fraction=0.2)
    assert decide_canary(state, 5, {"4": counts(160, 40), "5": counts(10, 80)}, RULE, at=1.0) is None
    assert decide_canary(state, 5, {"4": counts(100, 100), "5": counts(95, 105)}, RULE, at=1.0) is None


def test_the_canary_promotes_at_once_when_nothing_is_live_and_acts_only_under_its_policy() -> None:
    first = decide_canary(Serving(policy="canary", fraction=0.1), 1, {}, RULE, at=1.0)
    assert first is not None and (first.action, first.serve) == ("promote", 1)
    table = {"4": counts(160, 40), "5": counts(50, 100)}
    assert decide_canary(Serving(policy="manual", live=4), 5, table, RULE, at=1.0) is None
    assert decide_canary(Serving(policy="canary", live=5), 5, table, RULE, at=1.0) is None  # nothing pending


# -- rollback on outcomes ---------------------------------------------------------------------------------------


def test_rollback_when_the_live_version_is_worse_than_its_predecessor() -> None:
    table = {"3": counts(160, 40), "4": counts(60, 140)}
    decision = decide_rollback("direct", 4, 3, table, RULE, at=2.0)
    assert decision is not None
    assert (decision.action, decision.version, decision.serve, decision.decided_by) == ("rollback", 4, 3, "outcomes")
    assert decision.id == "rollback/v4-to-v3"


def test_no_rollback_when_not_worse_undecided_or_without_a_predecessor() -> None:
    assert decide_rollback("direct", 4, 3, {"3": counts(160, 40), "4": counts(158, 42)}, RULE, at=2.0) is None
    assert decide_rollback("direct", 4, 3, {"3": counts(160, 40), "4": counts(5, 40)}, RULE, at=2.0) is None
    assert decide_rollback("direct", 4, None, {"4": counts(0, 400)}, RULE, at=2.0) is None
    assert decide_rollback("direct", 3, 4, {"3": counts(0, 400), "4": counts(400, 0)}, RULE, at=2.0) is None


# -- an operator's request --------------------------------------------------------------------------------------


def test_an_operator_promotes_or_rejects_only_a_pending_candidate() -> None:
    state = Serving(policy="manual", live=4, rejected_through=5)
    promoted = plan_operator("promote", 7, state, 7, {}, actor="ana", at=3.0)
    assert not isinstance(promoted, str)
    assert (promoted.action, promoted.serve, promoted.decided_by) == ("promote", 7, "operator:ana")
    rejected = plan_operator("reject", 7, state, 7, {}, actor="ana", at=3.0)
    assert not isinstance(rejected, str)
    assert (rejected.action, rejected.version, rejected.serve) == ("reject", 7, 4)
    for version in (4, 5, 8):
        assert isinstance(plan_operator("promote", version, state, 7, {}, actor="ana", at=3.0), str)
    assert isinstance(plan_operator("promote", 7, Serving(), 7, {}, actor="ana", at=3.0), str)
