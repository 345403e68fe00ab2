"""Dynamic batch-size controller (paper §3.3), offline and streaming.

Model: the time to learn from a fixed amount of traces at batch size ``bs`` falls as a power law,
``T(bs) = A · bs^(−α)`` (per trace: one iteration's wall time divided by its batch size). Trial iterations
at candidate sizes give points; a least-squares fit in log-log space gives ``A`` and ``α``. The curve's slope
``−αA·bs^(−α−1)`` is steepest at the smallest batch size considered; ``τ`` is ``tau_fraction`` (1.6 %) of that
steepest slope, and the controller picks the plateau where the slope has flattened to ``τ``:
``bs* = (αA/τ)^(1/(α+1))``, clamped to ``[bs_min, bs_max]``. Where the steepest slope is measured is fixed
(``reference_bs``, 8), not the smallest size that happened to be profiled: since
``bs* = reference · tau_fraction^(−1/(α+1))``, anchoring it on the profiling grid made the choice proportional
to the grid's smallest trial (trials 16/32/64 chose ~2× what trials 8/16/32 chose on the same curve).
Beyond ``bs*`` a bigger batch buys almost no time and only risks quality.

Streaming adds one guard: a window must be big enough that the pipeline keeps up with the arrival rate
(:meth:`BatchSizeController.keep_up_size`). Everything here is pure: timings come in as numbers.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BatchSizeController",
    "ControllerDecision",
    "PowerLawFit",
    "fit_power_law",
    "plateau_batch_size",
]

DEFAULT_TAU_FRACTION = 0.016


@dataclass(frozen=True)
class PowerLawFit:
    """``T(bs) = A · bs^(−alpha)`` fitted on ``points`` (bs, seconds per trace); ``r2`` in log space."""

    A: float
    alpha: float
    r2: float
    points: tuple[tuple[float, float], ...]

    def time(self, bs: float) -> float:
        return self.A * bs ** (-self.alpha)

    def slope(self, bs: float) -> float:
        """dT/dbs (negative when larger batches are faster)."""
        return -self.alpha * self.A * bs ** (-self.alpha - 1)


def fit_power_law(points: Iterable[tuple[float, float]]) -> PowerLawFit:
    """Least squares of ``log T = log A − α log bs`` over points with positive coordinates.

    Raises ValueError with fewer than two distinct batch sizes.
    """
    pts = tuple((float(b), float(t)) for b, t in points if b > 0 and t > 0)
    xs = [math.log(b) for b, _ in pts]
    ys = [math.log(t) for _, t in pts]
    if len(set(xs)) < 2:
        raise ValueError("need timings at two or more distinct batch sizes to fit T(bs) = A·bs^(-alpha)")
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return PowerLawFit(A=math.exp(intercept), alpha=-slope, r2=r2, points=pts)


def plateau_batch_size(fit: PowerLawFit, steepest_at: float, tau_fraction: float = DEFAULT_TAU_FRACTION) -> float:
    """Unclamped ``bs* = (αA/τ)^(1/(α+1))`` with ``τ = tau_fraction · |slope(steepest_at)|``.

    Returns ``inf`` when the fit shows no speed-up from batching (α ≤ 0): then the largest allowed size is
    as good as any and the caller's clamp decides.
    """
    if fit.alpha <= 0:
        return math.inf
    tau = tau_fraction * abs(fit.slope(steepest_at))
    return float((fit.alpha * fit.A / tau) ** (1.0 / (fit.alpha + 1.0)))


@dataclass(frozen=True)
class ControllerDecision:
    """What the controller chose and why — printed by ``combee learn --batch-size auto`` and ``combee status``."""

    batch_size: int
    reason: str
    fit: PowerLawFit | None = None
    tau: float | None = None
    raw: float | None = None
    keep_up: int | None = None

    def explain(self) -> str:
        if self.fit is None:
            return f"batch size {self.batch_size}: {self.reason}"
        pts = ", ".join(f"{int(b)}→{t:.4g}s" for b, t in self.fit.points)
        raw = "inf" if self.raw is None or math.isinf(self.raw) else f"{self.raw:.1f}"
        return (
            f"batch size {self.batch_size}: {self.reason}; fitted T(bs)=A·bs^-α with A={self.fit.A:.4g}, "
            f"α={self.fit.alpha:.3f} (r²={self.fit.r2:.3f}) on [{pts}] s/trace; τ={self.tau:.3g}; "
            f"plateau bs*={raw}" + (f"; keep-up minimum {self.keep_up}" if self.keep_up else "")
        )

    def as_dict(self) -> dict[str, Any]:
        """The decision as JSON-ready data (``metrics.json``, the benchmark's results)."""
        return {
            "chosen": self.batch_size,
            "reason": self.reason,
            "explain": self.explain(),
            "A": self.fit.A if self.fit else None,
            "alpha": self.fit.alpha if self.fit else None,
            "r2": self.fit.r2 if self.fit else None,
            "tau": self.tau,
            "raw": None if self.raw is None or math.isinf(self.raw) else self.raw,
            "profiled": [[b, t] for b, t in self.fit.points] if self.fit else [],
        }


@dataclass
class BatchSizeController:
    """Profiles candidate sizes, fits, and chooses; refits as new timings arrive.

    Use: while ``next_trial()`` returns a size, run one (real) iteration of that size and ``observe`` its
    wall time; then ``decide()``. In streaming, keep calling ``observe`` for every window and ``decide`` with
    the current arrival rate; the fit uses the most recent ``history`` observations.
    """

    candidates: Sequence[int] = (16, 32, 64)
    bs_min: int = 8
    bs_max: int = 256
    tau_fraction: float = DEFAULT_TAU_FRACTION
    reference_bs: int = 8  # where the fitted curve's steepest slope is taken (independent of the trial grid)
    history: int = 64
    default: int = 32
    _obs: deque[tuple[int, float]] = field(init=False)

    def __post_init__(self) -> None:
        if not self.candidates or any(c < 1 for c in self.candidates):
            raise ValueError("candidates must be positive batch sizes")
        if not 1 <= self.bs_min <= self.bs_max:
            raise ValueError(f"need 1 <= bs_min <= bs_max, got {self.bs_min}, {self.bs_max}")
        self.candidates = tuple(sorted(set(self.candidates)))
        self._obs = deque(maxlen=self.history)

    @property
    def observations(self) -> tuple[tuple[int, float], ...]:
        return tuple(self._obs)

    def observe(self, batch_size: int, seconds: float) -> None:
        """Record that an iteration of ``batch_size`` traces took ``seconds`` of wall time."""
        if batch_size > 0 and seconds > 0:
            self._obs.append((batch_size, seconds))

    def next_trial(self) -> int | None:
        """The next candidate size not yet profiled, or None when profiling is done."""
        seen = {b for b, _ in self._obs}
        for c in self.candidates:
            if c not in seen:
                return c
        return None

    def _per_trace_points(self) -> list[tuple[float, float]]:
        by_size: dict[int, list[float]] = {}
        for b, s in self._obs:
            by_size.setdefault(b, []).append(s / b)
        # median per size: robust to one slow iteration
        return [(float(b), sorted(v)[len(v) // 2]) for b, v in sorted(by_size.items())]

    def keep_up_size(self, arrival_rate: float, fit: PowerLawFit | None = None) -> int | None:
        """Smallest window that processes traces at least as fast as they arrive (with 20 % headroom).

        One window of ``b`` traces takes ``b · T(b)`` seconds, so the pipeline keeps up when
        ``b / (b·T(b)) ≥ rate``, i.e. ``T(b) ≤ 1/rate`` → ``b ≥ (A·rate)^(1/α)``. None if unknown.
        """
        if arrival_rate <= 0:
            return None
        fit = fit or self._fit()
        if fit is None or fit.alpha <= 0:
            return None
        needed = (fit.A * arrival_rate * 1.2) ** (1.0 / fit.alpha)
        return max(1, math.ceil(needed - 1e-9))  # tolerate float noise at exact integers

    def _fit(self) -> PowerLawFit | None:
        pts = self._per_trace_points()
        if len({b for b, _ in pts}) < 2:
            return None
        return fit_power_law(pts)

    def _clamp(self, value: float) -> int:
        if math.isinf(value):
            return self.bs_max
        return int(min(self.bs_max, max(self.bs_min, round(value))))

    def decide(self, arrival_rate: float | None = None) -> ControllerDecision:
        """Choose a batch size from what has been observed so far."""
        fit = self._fit()
        if fit is None:
            return ControllerDecision(
                batch_size=self._clamp(self.default),
                reason=f"not enough timings yet (need two distinct sizes); using the default {self.default}",
            )
        steepest_at = float(self.reference_bs)
        tau = self.tau_fraction * abs(fit.slope(steepest_at))
        raw = plateau_batch_size(fit, steepest_at, self.tau_fraction)
        chosen = self._clamp(raw)
        if fit.alpha <= 0:
            reason = "timings show no speed-up from larger batches (α ≤ 0); using bs_max"
        elif raw < self.bs_min or raw > self.bs_max:
            reason = f"plateau clamped to [{self.bs_min}, {self.bs_max}]"
        else:
            reason = f"plateau where the slope is {self.tau_fraction:.1%} of its steepest (at bs={steepest_at:g})"
        keep_up = self.keep_up_size(arrival_rate, fit) if arrival_rate else None
        if keep_up is not None and keep_up > chosen:
            chosen = min(self.bs_max, keep_up)
            reason += f"; raised to {chosen} to keep up with {arrival_rate:.3g} traces/s"
        return ControllerDecision(batch_size=chosen, reason=reason, fit=fit, tau=tau, raw=raw, keep_up=keep_up)
