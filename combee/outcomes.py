"""Outcomes per playbook version: what the fleet says about each prompt it ran with. Pure.

A trace that names the version it ran with (``playbook_version``) and says how it went (``feedback.success``,
``feedback.score``) is one *observation* of that version. This module holds the algebra the counting follows;
the Redis script in :mod:`streams.redis_outcomes` is its effect at the edge and does exactly what
:func:`record` does, in one atomic step.

Exactly once. Observations are taken in offset order per (namespace, source partition of the traces topic) and
carry their offset. A ledger keeps, per source partition, the last offset it counted (its *mark*); a batch
counts only the observations above the mark and moves the mark in the same step. Offering a batch again, or a
batch that overlaps one already counted (a redelivery after a restart, a zombie worker's late write), counts
nothing twice: :func:`record` is idempotent and the union of overlapping batches counts each offset once.

Versions. An observation naming a version above the live one (no agent can have run with a version not yet
published) counts under :data:`UNKNOWN_VERSION`, never under its number, so a hostile or confused producer can
neither invent versions nor grow the set of keys beyond the versions really published.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from combee.models import Trace

__all__ = [
    "MAX_SCORE",
    "OLDER_VERSIONS",
    "OUTCOMES",
    "UNKNOWN_VERSION",
    "Z95",
    "Ledger",
    "Observation",
    "Outcome",
    "OutcomeCounts",
    "as_json",
    "describe",
    "fold_versions",
    "observe",
    "record",
    "version_key",
    "version_order",
    "wilson_interval",
]

Outcome = Literal["success", "failure", "unknown"]
OUTCOMES: Final[tuple[Outcome, ...]] = ("success", "failure", "unknown")
UNKNOWN_VERSION: Final = "unknown"
"""The key of observations naming a version above the live one (or any version while none is published)."""
OLDER_VERSIONS: Final = "older"
"""The label under which :func:`fold_versions` sums the versions too old to get a label of their own."""
MAX_SCORE: Final = 1e12
"""A score of larger magnitude is not summed (the observation still counts): one absurd value must not swamp a
version's mean, nor overflow the stored sum."""
Z95: Final = 1.959963984540054
"""The two-sided 95 % quantile of the standard normal distribution."""


@dataclass(frozen=True)
class Observation:
    """One trace's report on the version it ran with, at ``offset`` of its traces partition."""

    offset: int
    version: int
    outcome: Outcome
    score: float | None = None


def observe(offset: int, trace: Trace) -> Observation | None:
    """The observation ``trace`` makes (None: it names no version). ``success`` True/False is a success or a
    failure, absent is ``unknown``; a score beyond ±:data:`MAX_SCORE` is dropped."""
    if trace.playbook_version is None:
        return None
    fb = trace.feedback
    success = fb.success if fb is not None else None
    outcome: Outcome = "unknown" if success is None else ("success" if success else "failure")
    score = fb.score if fb is not None else None
    if score is not None and not (math.isfinite(score) and abs(score) <= MAX_SCORE):
        score = None
    return Observation(offset, trace.playbook_version, outcome, score)


@dataclass(frozen=True)
class OutcomeCounts:
    """The counter record of one version: outcomes and the sum and number of scores."""

    success: int = 0
    failure: int = 0
    unknown: int = 0
    score_sum: float = 0.0
    score_count: int = 0

    @property
    def n(self) -> int:
        """Observations counted, whatever their outcome."""
        return self.success + self.failure + self.unknown

    @property
    def decided(self) -> int:
        """Observations with a known outcome (the success rate's denominator)."""
        return self.success + self.failure

    @property
    def success_rate(self) -> float | None:
        return self.success / self.decided if self.decided else None

    @property
    def mean_score(self) -> float | None:
        return self.score_sum / self.score_count if self.score_count else None

    def interval(self, z: float = Z95) -> tuple[float, float] | None:
        """The Wilson interval of the success rate (None: no decided observation)."""
        return wilson_interval(self.success, self.decided, z) if self.decided else None

    def count(self, outcome: Outcome) -> int:
        return {"success": self.success, "failure": self.failure, "unknown": self.unknown}[outcome]

    def add(self, obs: Observation) -> OutcomeCounts:
        scored = obs.score is not None
        return replace(
            self,
            success=self.success + (obs.outcome == "success"),
            failure=self.failure + (obs.outcome == "failure"),
            unknown=self.unknown + (obs.outcome == "unknown"),
            score_sum=self.score_sum + (obs.score or 0.0),
            score_count=self.score_count + scored,
        )

    def __add__(self, other: OutcomeCounts) -> OutcomeCounts:
        """Merge two disjoint sets of observations (associative, commutative, identity ``OutcomeCounts()``)."""
        return OutcomeCounts(
            self.success + other.success,
            self.failure + other.failure,
            self.unknown + other.unknown,
            self.score_sum + other.score_sum,
            self.score_count + other.score_count,
        )


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion: ``successes`` of ``trials`` (> 0) at quantile ``z``.

    Unlike the normal approximation it stays inside [0, 1] and is not empty at 0 or ``trials`` successes.
    Raises ValueError for ``trials`` < 1 or ``successes`` outside 0..trials.
    """
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials >= 1, got {successes}/{trials}")
    p = successes / trials
    z2 = z * z
    centre = (p + z2 / (2 * trials)) / (1 + z2 / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / (1 + z2 / trials)
    # At 0 or ``trials`` successes the bound is exactly 0 or 1; rounding would leave it a hair inside.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == trials else min(1.0, centre + half)
    return lo, hi


def version_key(version: int, live: int | None) -> str:
    """Where an observation of ``version`` counts when ``live`` is the namespace's live version."""
    return str(version) if live is not None and 0 <= version <= live else UNKNOWN_VERSION


def version_order(key: str) -> tuple[int, int]:
    """Sort key: numbered versions newest first, then ``older``, then ``unknown``."""
    if key.isdigit():
        return (0, -int(key))
    return (1, 0) if key == OLDER_VERSIONS else (2, 0)


@dataclass(frozen=True)
class Ledger:
    """A namespace's counts per version key and, per source partition, the last offset counted."""

    counts: Mapping[str, OutcomeCounts] = field(default_factory=dict)
    marks: Mapping[int, int] = field(default_factory=dict)


def record(ledger: Ledger, partition: int, batch: Iterable[Observation], live: int | None) -> tuple[Ledger, int]:
    """Count ``batch`` (observations of one source partition) into ``ledger``: only those above the
    partition's mark, in offset order, each under :func:`version_key`. Returns the new ledger and how many
    observations were counted. Idempotent: recording the same batch again counts 0."""
    mark = ledger.marks.get(partition, -1)
    counts = dict(ledger.counts)
    counted = 0
    for obs in sorted(batch, key=lambda o: o.offset):
        if obs.offset <= mark:
            continue
        key = version_key(obs.version, live)
        counts[key] = counts.get(key, OutcomeCounts()).add(obs)
        mark = obs.offset
        counted += 1
    marks = {**ledger.marks, partition: mark} if counted else dict(ledger.marks)
    return Ledger(counts, marks), counted


def fold_versions(counts: Mapping[str, OutcomeCounts], live: int | None, keep: int) -> dict[str, OutcomeCounts]:
    """``counts`` with at most ``keep`` numbered versions: the newest ``keep`` up to ``live`` (the highest
    counted when None) keep their key, every other numbered version is summed under :data:`OLDER_VERSIONS`;
    ``unknown`` stays. So a namespace has at most ``keep`` + 2 keys, however many versions it published."""
    numbered = sorted((int(k) for k in counts if k.isdigit()), reverse=True)
    top = live if live is not None else (numbered[0] if numbered else 0)
    out: dict[str, OutcomeCounts] = {}
    for key, value in counts.items():
        label = key
        if key.isdigit() and not top - keep < int(key) <= top:
            label = OLDER_VERSIONS
        out[label] = out.get(label, OutcomeCounts()) + value
    return out


def describe(counts: OutcomeCounts) -> str:
    """One line: ``n=40 success 62% [47%, 76%] (25/40 decided) mean score 0.71`` (95 % Wilson interval)."""
    parts = [f"n={counts.n}"]
    interval = counts.interval()
    if interval is None or counts.success_rate is None:
        parts.append("success rate - (no success/failure reported)")
    else:
        lo, hi = interval
        parts.append(
            f"success {counts.success_rate:.0%} [{lo:.0%}, {hi:.0%}] ({counts.success}/{counts.decided} decided)"
        )
    if counts.mean_score is not None:
        parts.append(f"mean score {counts.mean_score:.3g}")
    return " ".join(parts)


def as_json(counts: OutcomeCounts) -> dict[str, object]:
    """The record with its derived figures, for ``--json`` outputs and the UI's API."""
    interval = counts.interval()
    return {
        "n": counts.n,
        "success": counts.success,
        "failure": counts.failure,
        "unknown": counts.unknown,
        "score_sum": counts.score_sum,
        "score_count": counts.score_count,
        "success_rate": counts.success_rate,
        "wilson95": list(interval) if interval is not None else None,
        "mean_score": counts.mean_score,
    }
