"""Is a candidate version worse than the one it would replace? One-sided tests on outcomes. Pure.

A canary and a rollback on outcomes call :func:`compare_rates` through :mod:`combee.promotion`; the validation
gate calls the paired form through :mod:`combee.gate` (issue 24, item 2; docs/promotion.md). Two forms, both
*non-inferiority* tests with a margin and a minimum sample:

* :func:`compare_rates`: two independent samples (a canary's arms; a live version against its predecessor),
  each an :class:`combee.outcomes.OutcomeCounts`. The interval of the difference of success rates is
  Newcombe's hybrid score interval built from the two Wilson intervals, which keeps its coverage at the small
  samples and extreme rates a new version starts with, where the Wald interval does not.
* :func:`compare_paired`: the same tasks answered by both versions (a validation gate). Only the discordant
  pairs carry information; the interval of the difference is the Wald interval for paired proportions, for which
  the minimum sample is the guard.

Each test is one-sided at level ``alpha``: the candidate is ``not_worse`` when the lower bound of
(candidate − baseline) is above −``margin``; ``worse`` when the upper bound is below −``margin``; otherwise, or
below the minimum sample, ``undecided`` (collect more). A caller acting on ``worse`` (drop, roll back) and on
``not_worse`` (promote) never acts on an undecided comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

from combee.outcomes import OutcomeCounts, wilson_interval

__all__ = ["Comparison", "Verdict", "compare_paired", "compare_rates"]

Verdict = Literal["not_worse", "worse", "undecided"]


@dataclass(frozen=True)
class Comparison:
    """A verdict and its evidence: the observed difference (candidate − baseline), its one-sided bounds at
    level ``alpha`` (each from a (1 − 2·alpha) two-sided interval), the margin, the sample, and why."""

    verdict: Verdict
    difference: float | None
    lower: float | None
    upper: float | None
    margin: float
    alpha: float
    sample: int
    reason: str


def _check(margin: float, alpha: float, minimum: int) -> float:
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    if minimum < 1:
        raise ValueError(f"the minimum sample must be at least 1, got {minimum}")
    return NormalDist().inv_cdf(1.0 - alpha)


def _verdict(d: float, lower: float, upper: float, margin: float, alpha: float, n: int) -> Comparison:
    if lower > -margin:
        verdict: Verdict = "not_worse"
        why = f"lower bound {lower:+.3f} is above -{margin:.3f}"
    elif upper < -margin:
        verdict = "worse"
        why = f"upper bound {upper:+.3f} is below -{margin:.3f}"
    else:
        verdict = "undecided"
        why = f"[{lower:+.3f}, {upper:+.3f}] straddles -{margin:.3f}: more evidence needed"
    return Comparison(verdict, d, lower, upper, margin, alpha, n, why)


def compare_rates(
    candidate: OutcomeCounts, baseline: OutcomeCounts, *, margin: float, min_decided: int, alpha: float = 0.05
) -> Comparison:
    """Non-inferiority of ``candidate``'s success rate to ``baseline``'s (independent samples).

    Each side needs ``min_decided`` traces with a known outcome; below that the verdict is ``undecided``.
    Raises ValueError for a margin outside [0, 1), an alpha outside (0, 0.5) or a minimum below 1.
    """
    z = _check(margin, alpha, min_decided)
    n = min(candidate.decided, baseline.decided)
    if n < min_decided:
        why = f"{candidate.decided} and {baseline.decided} decided traces; each side needs {min_decided}"
        return Comparison("undecided", None, None, None, margin, alpha, n, why)
    p1, p2 = candidate.success / candidate.decided, baseline.success / baseline.decided
    l1, u1 = wilson_interval(candidate.success, candidate.decided, z)
    l2, u2 = wilson_interval(baseline.success, baseline.decided, z)
    d = p1 - p2
    lower = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    upper = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return _verdict(d, lower, upper, margin, alpha, n)


def compare_paired(
    both: int, candidate_only: int, baseline_only: int, neither: int, *, margin: float, min_pairs: int,
    alpha: float = 0.05,
) -> Comparison:  # fmt: skip
    """Non-inferiority on paired outcomes: each task answered by both versions, counted as succeeded by
    ``both``, by the ``candidate_only``, by the ``baseline_only`` or by ``neither``.

    Fewer than ``min_pairs`` pairs is ``undecided``. Raises ValueError for a negative count, and as
    :func:`compare_rates` for the margin, alpha and minimum.
    """
    z = _check(margin, alpha, min_pairs)
    if min(both, candidate_only, baseline_only, neither) < 0:
        raise ValueError("pair counts cannot be negative")
    n = both + candidate_only + baseline_only + neither
    if n < min_pairs:
        return Comparison("undecided", None, None, None, margin, alpha, n, f"{n} pairs; needs {min_pairs}")
    d = (candidate_only - baseline_only) / n
    var = max(0.0, (candidate_only + baseline_only) / n**2 - (candidate_only - baseline_only) ** 2 / n**3)
    half = z * math.sqrt(var)
    return _verdict(d, d - half, d + half, margin, alpha, n)
