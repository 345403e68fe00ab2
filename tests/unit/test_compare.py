"""The one-sided non-inferiority tests of combee/compare.py (not wired into the workers yet): verdicts on cases
worked by hand, the minimum sample, and the arguments refused."""

from __future__ import annotations

import math

import pytest

from combee.compare import compare_paired, compare_rates
from combee.outcomes import OutcomeCounts, wilson_interval

Z = 1.6448536269514722  # one-sided 5 %


def rate(k: int, n: int) -> OutcomeCounts:
    return OutcomeCounts(success=k, failure=n - k, unknown=3)  # unknown outcomes never enter the rate


def test_equal_rates_bound_the_difference_by_root_two_wilson_half_widths() -> None:
    # p1 = p2 and n1 = n2: Newcombe's lower bound is -sqrt(2) * (p - wilson_low), its upper the mirror
    got = compare_rates(rate(500, 1000), rate(500, 1000), margin=0.1, min_decided=100)
    lo = wilson_interval(500, 1000, Z)[0]
    assert got.difference == 0.0
    assert got.lower == pytest.approx(-math.sqrt(2) * (0.5 - lo))
    assert got.upper == pytest.approx(math.sqrt(2) * (0.5 - lo))
    assert got.verdict == "not_worse" and got.sample == 1000


def test_a_clearly_worse_candidate_is_worse_and_margin_zero_leaves_a_tie_undecided() -> None:
    assert compare_rates(rate(300, 1000), rate(600, 1000), margin=0.05, min_decided=100).verdict == "worse"
    assert compare_rates(rate(500, 1000), rate(500, 1000), margin=0.0, min_decided=100).verdict == "undecided"


def test_below_the_minimum_sample_nothing_is_decided() -> None:
    got = compare_rates(rate(0, 20), rate(20, 20), margin=0.05, min_decided=30)
    assert got.verdict == "undecided" and got.difference is None and "needs 30" in got.reason
    assert compare_rates(rate(0, 30), rate(30, 30), margin=0.05, min_decided=30).verdict == "worse"


def test_paired_counts_use_only_the_discordant_pairs() -> None:
    # 100 pairs, 10 won by each side alone: d = 0, var = 20 / 100², half width = z * sqrt(0.002)
    got = compare_paired(40, 10, 10, 40, margin=0.1, min_pairs=50)
    assert got.difference == 0.0 and got.lower == pytest.approx(-Z * math.sqrt(0.002))
    assert got.verdict == "not_worse"
    assert compare_paired(40, 10, 10, 40, margin=0.05, min_pairs=50).verdict == "undecided"
    worse = compare_paired(30, 0, 30, 40, margin=0.1, min_pairs=50)  # d = -0.3, var = 0.003 - 0.0009
    assert worse.upper == pytest.approx(-0.3 + Z * math.sqrt(0.0021)) and worse.verdict == "worse"
    assert compare_paired(5, 0, 30, 5, margin=0.1, min_pairs=50).verdict == "undecided"  # 40 pairs < 50


@pytest.mark.parametrize(
    ("margin", "alpha", "minimum"), [(-0.1, 0.05, 10), (1.0, 0.05, 10), (0.1, 0.0, 10), (0.1, 0.5, 10), (0.1, 0.05, 0)]
)
def test_impossible_settings_are_refused(margin: float, alpha: float, minimum: int) -> None:
    with pytest.raises(ValueError):
        compare_rates(rate(1, 2), rate(1, 2), margin=margin, min_decided=minimum, alpha=alpha)
    with pytest.raises(ValueError):
        compare_paired(1, 1, 1, 1, margin=margin, min_pairs=minimum, alpha=alpha)
