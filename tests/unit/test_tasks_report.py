"""The finance report: bootstrap intervals, the results document and the Markdown table."""

from __future__ import annotations

import math

from combee.tasks.report import _paired, bootstrap_indices, interval


def test_bootstrap_draws_are_seeded() -> None:
    assert bootstrap_indices(10, 50, 3) == bootstrap_indices(10, 50, 3)
    assert bootstrap_indices(10, 50, 3) != bootstrap_indices(10, 50, 4)
    draws = bootstrap_indices(10, 50, 3)
    assert len(draws) == 50 and all(len(d) == 10 and all(0 <= i < 10 for i in d) for d in draws)
    assert bootstrap_indices(0, 50, 3) == []


def test_interval_brackets_the_mean_and_degenerates_for_constant_values() -> None:
    values = [1.0] * 30 + [0.0] * 70
    draws = bootstrap_indices(len(values), 2000, 0)
    lo, hi = interval(values, draws)
    assert lo < 0.3 < hi
    assert lo > 0.19 and hi < 0.41  # about ±1.96·sqrt(.3·.7/100) = ±0.09
    assert interval([1.0] * 5, bootstrap_indices(5, 100, 0)) == (1.0, 1.0)
    assert all(math.isnan(x) for x in interval([], []))


def test_a_paired_interval_resamples_both_methods_on_the_same_questions() -> None:
    b = [1.0, 0.0] * 20
    a = [1.0] * 2 + b[2:]  # a answers one more question than b, the rest alike
    draws = bootstrap_indices(len(a), 500, 1)
    paired = _paired(a, b, draws)
    assert paired["delta"] == 0.025
    lo, hi = paired["ci95"]
    assert 0.0 <= lo <= hi <= 0.075  # no resample can find a worse than b: every question is paired
    unpaired_lo = interval(a, draws)[0] - interval(b, draws)[1]
    assert unpaired_lo < -0.1  # unpaired intervals could not tell the two apart
