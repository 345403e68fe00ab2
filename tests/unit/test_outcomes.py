"""The algebra of outcomes per version (combee/outcomes.py): the Wilson interval on cases worked by hand, the
counter record's merge laws, exactly-once recording under redelivery, and the bound on version labels."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from combee.models import Feedback, Trace
from combee.outcomes import (
    MAX_SCORE,
    OLDER_VERSIONS,
    UNKNOWN_VERSION,
    Ledger,
    Observation,
    OutcomeCounts,
    fold_versions,
    observe,
    record,
    version_key,
    version_order,
    wilson_interval,
)

# --- the Wilson interval ----------------------------------------------------------------------------------
# With z = 2 the closed forms are easy: 0 of n gives [0, z²/(n+z²)], n of n gives [n/(n+z²), 1], and n/2 of n
# gives 1/2 ± z / (2·sqrt(n+z²)).


def test_wilson_none_of_four_at_z2_is_zero_to_a_half() -> None:
    lo, hi = wilson_interval(0, 4, z=2.0)
    assert lo == pytest.approx(0.0, abs=1e-12)
    assert hi == pytest.approx(4 / (4 + 4))


def test_wilson_all_of_four_at_z2_is_a_half_to_one() -> None:
    lo, hi = wilson_interval(4, 4, z=2.0)
    assert (lo, hi) == (pytest.approx(0.5), pytest.approx(1.0))


def test_wilson_six_of_twelve_at_z2_is_a_quarter_either_side() -> None:
    assert wilson_interval(6, 12, z=2.0) == (pytest.approx(0.25), pytest.approx(0.75))


def test_wilson_at_z0_is_the_point_estimate() -> None:
    assert wilson_interval(3, 10, z=0.0) == (pytest.approx(0.3), pytest.approx(0.3))


@settings(deadline=None)
@given(st.integers(1, 500).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_contains_the_rate_and_mirrors_failures(kn: tuple[int, int]) -> None:
    k, n = kn
    lo, hi = wilson_interval(k, n)
    assert 0.0 <= lo <= k / n <= hi <= 1.0
    flo, fhi = wilson_interval(n - k, n)
    assert (lo, hi) == (pytest.approx(1 - fhi), pytest.approx(1 - flo))


def test_wilson_narrows_with_more_trials_at_the_same_rate() -> None:
    widths = [hi - lo for lo, hi in (wilson_interval(3 * m, 10 * m) for m in (1, 4, 16))]
    assert widths[0] > widths[1] > widths[2]


@pytest.mark.parametrize(("k", "n"), [(0, 0), (-1, 3), (4, 3)])
def test_wilson_refuses_impossible_counts(k: int, n: int) -> None:
    with pytest.raises(ValueError):
        wilson_interval(k, n)


# --- observations and the counter record ------------------------------------------------------------------


def trace(version: int | None, success: bool | None = None, score: float | None = None) -> Trace:
    return Trace(
        trace_id="t", namespace="ns", task="x", playbook_version=version,
        feedback=Feedback(success=success, score=score),
    )  # fmt: skip


def test_observe_reads_version_outcome_and_score() -> None:
    assert observe(7, trace(None, True)) is None
    assert observe(7, trace(3, True, 0.5)) == Observation(7, 3, "success", 0.5)
    assert observe(8, trace(3, False)) == Observation(8, 3, "failure", None)
    assert observe(9, trace(0)) == Observation(9, 0, "unknown", None)
    assert observe(9, trace(1, True, MAX_SCORE * 10)) == Observation(9, 1, "success", None)


def test_counts_rates_and_interval() -> None:
    c = OutcomeCounts(success=6, failure=6, unknown=3, score_sum=4.5, score_count=9)
    assert (c.n, c.decided, c.success_rate, c.mean_score) == (15, 12, 0.5, 0.5)
    assert c.interval(z=2.0) == (pytest.approx(0.25), pytest.approx(0.75))
    assert OutcomeCounts(unknown=2).interval() is None
    assert OutcomeCounts().success_rate is None and OutcomeCounts().mean_score is None


counts_st = st.builds(
    OutcomeCounts,
    st.integers(0, 50), st.integers(0, 50), st.integers(0, 50),
    st.integers(-100, 100).map(lambda i: i / 4), st.integers(0, 50),
)  # fmt: skip


@settings(deadline=None)
@given(counts_st, counts_st, counts_st)
def test_merge_is_associative_and_commutative(a: OutcomeCounts, b: OutcomeCounts, c: OutcomeCounts) -> None:
    assert (a + b) + c == a + (b + c)
    assert a + b == b + a
    assert a + OutcomeCounts() == a


# --- exactly once ------------------------------------------------------------------------------------------

obs_st = st.builds(
    Observation,
    st.just(0), st.integers(0, 6), st.sampled_from(["success", "failure", "unknown"]),
    st.one_of(st.none(), st.integers(-8, 8).map(lambda i: i / 4)),
)  # fmt: skip
stream_st = st.lists(obs_st, min_size=1, max_size=40).map(
    lambda obs: [Observation(i, o.version, o.outcome, o.score) for i, o in enumerate(obs)]
)


@settings(deadline=None)
@given(stream_st, st.data())
def test_redelivery_counts_every_offset_once(stream: list[Observation], data: st.DataObject) -> None:
    """Deliver a partition's observations in batches that restart anywhere at or before the last one counted
    (a restart from an older committed offset), some batches twice: the ledger equals one clean pass."""
    clean, _ = record(Ledger(), 0, stream, live=4)
    ledger, start = Ledger(), 0
    while start < len(stream):
        restart = data.draw(st.integers(0, start))
        end = data.draw(st.integers(start + 1, len(stream)))
        batch = stream[restart:end]
        ledger, _ = record(ledger, 0, batch, live=4)
        if data.draw(st.booleans()):
            ledger, again = record(ledger, 0, batch, live=4)
            assert again == 0
        start = end
    assert ledger == clean
    assert sum(c.n for c in ledger.counts.values()) == len(stream)


def test_partitions_have_marks_of_their_own() -> None:
    a = [Observation(5, 1, "success")]
    ledger, n1 = record(Ledger(), 0, a, live=1)
    ledger, n2 = record(ledger, 1, a, live=1)  # the same offset on another partition is another trace
    assert (n1, n2) == (1, 1)
    assert ledger.counts["1"].success == 2 and dict(ledger.marks) == {0: 5, 1: 5}


def test_a_version_above_the_live_one_counts_as_unknown() -> None:
    batch = [Observation(0, 2, "success"), Observation(1, 3, "failure"), Observation(2, 9, "success")]
    ledger, _ = record(Ledger(), 0, batch, live=2)
    assert set(ledger.counts) == {"2", UNKNOWN_VERSION}
    assert ledger.counts[UNKNOWN_VERSION] == OutcomeCounts(success=1, failure=1)
    assert version_key(0, None) == UNKNOWN_VERSION  # nothing published: no version can be named


# --- bounded labels ----------------------------------------------------------------------------------------


@settings(deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=60), st.integers(1, 10), st.booleans())
def test_fold_keeps_at_most_keep_plus_two_labels_and_every_count(versions: list[int], keep: int, unknown: bool) -> None:
    counts = {str(v): OutcomeCounts(success=v + 1) for v in versions}
    if unknown:
        counts[UNKNOWN_VERSION] = OutcomeCounts(failure=3)
    live = max(versions)
    folded = fold_versions(counts, live, keep)
    assert len(folded) <= keep + 2
    assert {k for k in folded if k.isdigit()} == {str(v) for v in versions if v > live - keep}
    total = OutcomeCounts()
    for c in counts.values():
        total = total + c
    merged = OutcomeCounts()
    for c in folded.values():
        merged = merged + c
    assert merged == total


def test_fold_names_older_and_orders_keys() -> None:
    counts = {"1": OutcomeCounts(success=1), "2": OutcomeCounts(success=2), "3": OutcomeCounts(failure=1)}
    folded = fold_versions(counts, live=3, keep=1)
    assert folded == {"3": OutcomeCounts(failure=1), OLDER_VERSIONS: OutcomeCounts(success=3)}
    keys = sorted(["2", UNKNOWN_VERSION, "10", OLDER_VERSIONS], key=version_order)
    assert keys == ["10", "2", OLDER_VERSIONS, UNKNOWN_VERSION]
