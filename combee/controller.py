"""Dynamic batch-size controller (paper §3.3), offline and streaming.

**Model.** One iteration of ``bs`` traces takes ``W(bs) = L + c·bs`` seconds: ``L`` is the serial latency every
iteration pays whatever its size (reflect, curate and merge rounds, each waiting for its slowest call), ``c`` the
cost of one more trace once the server's throughput is what limits (a GPU's shared prefill and decode, a
tokens-per-minute budget). Per trace, ``T(bs) = W(bs)/bs = c + L/bs``: a curve that falls towards the floor ``c``.
Under the ``gpu`` serving profile the measured per-trace times follow it (b20 0.095, b50 0.064, b100 0.0575, b200
0.0505 → c ≈ 0.046, L ≈ 1.0). The paper's power law ``A·bs^−α`` does not: fitted to such a curve, α depends on the
range profiled (0.22–0.25 over 16–64, 0.37–0.42 over 8–72), and so did every choice made from it (218–238 against
147–166 on the same curve).

**Fit** (:func:`fit_floor`). Least squares of ``T`` on ``x = 1/bs``: linear in ``(c, L)``, so three trial sizes
determine it in closed form, with no starting values and no iterations. Residuals are relative (weights ``1/T²``):
timing noise is proportional to the time, and a 5 % wobble at bs 8 should count no more than one at bs 64. The fit
is constrained to ``c ≥ 0`` and ``L ≥ 0`` (the best of the unconstrained solution, when it is feasible, and the two
boundary fits). The power law with a floor, ``c + A·bs^−α``, is not used: with three trial sizes its three
parameters pass through every point, noise included, and over a 4–9× range of sizes a lower floor with a steeper
power fits about as well as a higher floor with a flatter one, so the fitted floor would swing with the noise.

**Rule** (:func:`floor_batch_size`). The smallest batch whose per-trace time is within ``floor_tolerance`` ε (25 %)
of the floor: ``c + L/bs ≤ (1+ε)·c`` ⇔ ``bs ≥ L/(ε·c)``. Operationally: no larger batch can learn from the same
traces more than ``1+ε`` times faster, while every further trace in a window risks quality (retention falls with
the batch size, docs/benchmarks-history.md). The choice depends on the measured ratio ``L/c`` — the batch at which the
fixed latency weighs as much as the traces — and not on the sizes where it was measured.

**A quality bound where there is no floor.** When the server is not throughput-bound (``unlimited`` serving, a
lightly loaded endpoint) ``c ≈ 0``: a larger batch is always faster and ``L/(ε·c)`` runs off to infinity, where
quality is lost. A bound there cannot come from the timings alone: ``T = L/bs`` has no batch-size scale of its own
(any rule computed from it returns the same size whatever ``L``), so it comes from the paper, whose rule landed in
64–94 and kept quality. The paper's rule (:func:`paper_batch_size`): the plateau of a power law ``A·bs^−α`` where
its slope has flattened to ``tau_fraction`` (1.6 %) of its slope at ``reference_bs`` (8),
``bs_paper = 8 · 0.016^(−1/(α+1))``, with α taken from the fitted curve itself — its mean log-log slope from bs 8
to 64, a fixed span — rather than from a power law fitted to the trial points, whose α moves with the profiled
range. So ``bs_paper`` is, like the floor rule, a function of ``(c, L)``: 63 with no floor (α = 1), larger the
sooner the floor is reached. The choice is ``min(bs_floor, bs_paper)``, clamped to ``[bs_min, bs_max]``:
continuous in ``c``, with no threshold on what counts as "c ≈ 0". As ``L/c`` grows the choice rises as
``4·L/c`` up to ~114 (``L/c`` ≈ 29), then the paper's bound takes over and falls towards 63 (94 at ``L/c`` = 50,
80 at 100). Under the ``gpu`` profile (``L/c`` ≈ 22) the floor rule decides. (Applying the paper's slope rule
to ``c + L/bs`` directly would not do: the slope of ``L/bs`` is ``−L/bs²`` whatever ``L`` and ``c``, so the rule
gives ``8/√0.016 ≈ 63`` whatever was measured.)

**Degenerate timings.** Fewer than two distinct sizes: nothing to fit; the default size. Per-trace time flat, or
rising with the batch size (fitted ``L = 0``: noise, or a server that charges every trace the same): a larger
batch buys no time, so the smallest allowed size, which risks the least quality. Per-trace time falling faster
than ``1/bs`` (the free fit would put the floor below zero): ``c = 0``, latency-bound, the paper's bound decides.

**Trial sizes.** The trials are real iterations: each learns from its traces, and each pays the whole latency
``L``. A trial smaller than the size finally chosen therefore costs ``L·(1 − s/bs)`` more than running its traces
at that size, and on a latency-bound endpoint (a hosted API, where ``L/c`` ≈ 100) that is nearly a whole
iteration per trial. The rule's choices lie in ``[bs_min, ~114]`` — the floor rule up to ``L/c`` ≈ 29, the paper's
bound (63–114) above it — so the default trials bracket that range instead of sitting below it: 32, 64 (the
answer with no floor at all) and 128 (just above the largest choice), a 4× span in ``1/bs`` for the fit. Measured
under the simulator's ``api`` profile, 500 traces (SIMULATED; docs/benchmarks-history.md): trials at 16/32/64 spent
3 of 8 iterations on 112 traces, 1.34× the wall time of the best fixed size; at 32/64/128 they learn 224 traces in
3 iterations, about what 224 traces cost at the chosen ~78, and the run took 1.25×. A trial larger than the choice
costs quality instead (one iteration at 128 where ~80 would be chosen). Candidates are clamped to
``[bs_min, bs_max]``: a trial the windowing cannot produce would never be observed, and profiling would not end.

**Streaming** adds one guard: a window must be big enough that the pipeline keeps up with the arrival rate
(:meth:`BatchSizeController.keep_up_size`). Everything here is pure: timings come in as numbers.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_BS",
    "DEFAULT_BS_MAX",
    "DEFAULT_BS_MIN",
    "DEFAULT_TRIAL_SIZES",
    "BatchSizeController",
    "ControllerDecision",
    "FloorFit",
    "fit_floor",
    "floor_batch_size",
    "paper_batch_size",
]

DEFAULT_TAU_FRACTION = 0.016
DEFAULT_FLOOR_TOLERANCE = 0.25
DEFAULT_TRIAL_SIZES: tuple[int, ...] = (32, 64, 128)  # see "Trial sizes" above; COMBEE_BS_CANDIDATES
DEFAULT_BS_MIN = 8  # COMBEE_BS_MIN: the smallest size the controller chooses
DEFAULT_BS_MAX = 256  # COMBEE_BS_MAX: the largest, and the most traces a window holds
DEFAULT_BS = 32  # COMBEE_BS_DEFAULT: the size used until the controller has decided
KEEP_UP_HEADROOM = 1.2
PAPER_SPAN = 8  # the paper's bound matches a power law to the fitted curve from reference_bs to 8× it


@dataclass(frozen=True)
class FloorFit:
    """``T(bs) = c + L/bs`` fitted on ``points`` (bs, seconds per trace).

    ``c`` is the floor (seconds per trace that no batch size removes), ``L`` the seconds every iteration costs
    whatever its size; ``r2`` is computed on relative residuals (the weights of the fit).
    """

    c: float
    L: float
    r2: float
    points: tuple[tuple[float, float], ...]

    def time(self, bs: float) -> float:
        """Seconds per trace at batch size ``bs``."""
        return self.c + self.L / bs

    def iteration_time(self, bs: float) -> float:
        """Seconds for one iteration of ``bs`` traces: ``L + c·bs``."""
        return self.L + self.c * bs


def fit_floor(points: Iterable[tuple[float, float]]) -> FloorFit:
    """Weighted least squares of ``T = c + L·(1/bs)`` with weights ``1/T²``, subject to ``c ≥ 0``, ``L ≥ 0``.

    Points with a non-positive coordinate are ignored. Raises ValueError with fewer than two distinct batch sizes.
    """
    pts = tuple((float(b), float(t)) for b, t in points if b > 0 and t > 0)
    if len({b for b, _ in pts}) < 2:
        raise ValueError("need timings at two or more distinct batch sizes to fit T(bs) = c + L/bs")
    xs = [1.0 / b for b, _ in pts]
    ts = [t for _, t in pts]
    ws = [1.0 / (t * t) for t in ts]

    def sse(c: float, lat: float) -> float:
        return sum(w * (t - c - lat * x) ** 2 for w, x, t in zip(ws, xs, ts, strict=True))

    sw = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs, strict=True)) / sw
    mt = sum(w * t for w, t in zip(ws, ts, strict=True)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs, strict=True))
    sxt = sum(w * (x - mx) * (t - mt) for w, x, t in zip(ws, xs, ts, strict=True))
    lat = sxt / sxx  # sxx > 0: two distinct sizes
    candidates = [(mt, 0.0)]  # L = 0: no speed-up from batching, the floor is the weighted mean
    through_origin = sum(w * x * t for w, x, t in zip(ws, xs, ts, strict=True)) / sum(
        w * x * x for w, x in zip(ws, xs, strict=True)
    )
    candidates.append((0.0, through_origin))  # c = 0: latency-bound
    if lat >= 0 and mt - lat * mx >= 0:
        candidates.append((mt - lat * mx, lat))  # the free fit, when feasible, is the best of all
    c, lat = min(candidates, key=lambda p: sse(*p))
    # Rounding leaves ~1e-17 where the answer is 0 (identical per-trace times, an exact 1/bs curve): call it 0,
    # so that the degenerate cases are recognised as such.
    scale = max(ts)
    c = 0.0 if c < 1e-9 * scale else c
    lat = 0.0 if lat < 1e-9 * scale * max(b for b, _ in pts) else lat
    ss_tot = sum(w * (t - mt) ** 2 for w, t in zip(ws, ts, strict=True))
    r2 = 1.0 - sse(c, lat) / ss_tot if ss_tot > 0 else 1.0
    return FloorFit(c=c, L=lat, r2=r2, points=pts)


def floor_batch_size(fit: FloorFit, tolerance: float = DEFAULT_FLOOR_TOLERANCE) -> float:
    """Unclamped smallest ``bs`` with ``T(bs) ≤ (1 + tolerance)·c``, i.e. ``L/(tolerance·c)``.

    ``0`` when ``L = 0`` (every size is at the floor); ``inf`` when ``c = 0`` and ``L > 0`` (no floor: every
    larger size is faster).
    """
    if tolerance <= 0:
        raise ValueError("tolerance must be positive")
    if fit.L <= 0:
        return 0.0
    if fit.c <= 0:
        return math.inf
    return fit.L / (tolerance * fit.c)


def paper_batch_size(
    fit: FloorFit, reference_bs: float = 8, tau_fraction: float = DEFAULT_TAU_FRACTION
) -> tuple[float, float]:
    """The paper's plateau rule on the power law matched to ``fit`` over a fixed span: ``(alpha, bs)``.

    ``alpha`` is the fitted curve's mean log-log slope from ``reference_bs`` to ``PAPER_SPAN × reference_bs``
    (8 to 64), ``−ln(T(64)/T(8)) / ln 8``: 1 without a floor, smaller the sooner the floor is reached. On
    ``A·bs^−α`` the slope is ``tau_fraction`` of its value at the reference where
    ``bs = reference · tau_fraction^(−1/(α+1))``. The span is fixed, not the profiled range, so that the bound
    is a function of ``(c, L)`` alone, like the floor rule.
    """
    lo, hi = float(reference_bs), float(reference_bs) * PAPER_SPAN
    alpha = math.log(fit.time(lo) / fit.time(hi)) / math.log(PAPER_SPAN) if fit.L > 0 else 0.0
    return alpha, lo * tau_fraction ** (-1.0 / (alpha + 1.0))


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _fmt_bs(value: float | None) -> str:
    return "inf" if value is None or math.isinf(value) else f"{value:.1f}"


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isinf(value) else value


@dataclass(frozen=True)
class ControllerDecision:
    """What the controller chose and why — printed by ``combee learn --batch-size auto`` and ``combee status``.

    ``fit`` is the floor model; ``floor_bs`` its rule's unclamped size; ``alpha`` and ``paper_bs`` the paper's
    bound on the same fit (:func:`paper_batch_size`); ``raw = min(floor_bs, paper_bs)``, before clamping to
    ``[bs_min, bs_max]`` and before the keep-up guard (``keep_up``) may raise it.
    """

    batch_size: int
    reason: str
    fit: FloorFit | None = None
    floor_tolerance: float | None = None
    floor_bs: float | None = None
    alpha: float | None = None
    paper_bs: float | None = None
    raw: float | None = None
    keep_up: int | None = None

    def explain(self) -> str:
        if self.fit is None:
            return f"batch size {self.batch_size}: {self.reason}"
        pts = ", ".join(f"{int(b)}→{t:.4g}s" for b, t in self.fit.points)
        return (
            f"batch size {self.batch_size}: {self.reason}; fitted T(bs)=c+L/bs with c={self.fit.c:.4g} s, "
            f"L={self.fit.L:.4g} s (r²={self.fit.r2:.3f}) on [{pts}] per trace; "
            f"within {self.floor_tolerance or 0:.0%} of the floor from bs={_fmt_bs(self.floor_bs)}; "
            f"paper's bound (α={self.alpha or 0:.3f} over bs 8–64) bs={_fmt_bs(self.paper_bs)}"
            + (f"; keep-up minimum {self.keep_up}" if self.keep_up else "")
        )

    def as_dict(self) -> dict[str, Any]:
        """The decision as JSON-ready data (``metrics.json``, the benchmark's results); infinities as None."""
        return {
            "chosen": self.batch_size,
            "reason": self.reason,
            "explain": self.explain(),
            "model": "T(bs) = c + L/bs",
            "c": self.fit.c if self.fit else None,
            "L": self.fit.L if self.fit else None,
            "r2": self.fit.r2 if self.fit else None,
            "floor_tolerance": self.floor_tolerance,
            "floor_bs": _finite(self.floor_bs),
            "alpha": self.alpha,
            "paper_bs": _finite(self.paper_bs),
            "raw": _finite(self.raw),
            "keep_up": self.keep_up,
            "profiled": [[b, t] for b, t in self.fit.points] if self.fit else [],
        }


@dataclass
class BatchSizeController:
    """Profiles candidate sizes, fits, and chooses; refits as new timings arrive.

    Use: while ``next_trial()`` returns a size, run one (real) iteration of that size and ``observe`` its
    wall time; then ``decide()``. In streaming, keep calling ``observe`` for every window and ``decide`` with
    the current arrival rate; the fit uses the most recent ``history`` observations. A trial size that has left
    that history (``history`` windows at other sizes) is profiled again: the curve moves as the playbook grows,
    and a fit on the chosen size alone could not separate ``c`` from ``L``.
    """

    candidates: Sequence[int] = DEFAULT_TRIAL_SIZES
    bs_min: int = DEFAULT_BS_MIN
    bs_max: int = DEFAULT_BS_MAX
    floor_tolerance: float = DEFAULT_FLOOR_TOLERANCE
    tau_fraction: float = DEFAULT_TAU_FRACTION
    reference_bs: int = 8  # where the paper's bound takes the steepest slope (independent of the trial grid)
    history: int = 64
    default: int = DEFAULT_BS
    _obs: deque[tuple[int, float]] = field(init=False)

    def __post_init__(self) -> None:
        if not self.candidates or any(c < 1 for c in self.candidates):
            raise ValueError("candidates must be positive batch sizes")
        if not 1 <= self.bs_min <= self.bs_max:
            raise ValueError(f"need 1 <= bs_min <= bs_max, got {self.bs_min}, {self.bs_max}")
        if self.floor_tolerance <= 0:
            raise ValueError(f"floor_tolerance must be positive, got {self.floor_tolerance}")
        # a trial outside [bs_min, bs_max] could never be run at its size, so it would never count as profiled
        self.candidates = tuple(sorted({min(self.bs_max, max(self.bs_min, c)) for c in self.candidates}))
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

    def trials_left(self) -> tuple[int, ...]:
        """The candidate sizes not yet profiled, in the order they will be tried (empty when profiling is done).
        Only a window of exactly a candidate's size counts as its trial."""
        seen = {b for b, _ in self._obs}
        return tuple(c for c in self.candidates if c not in seen)

    def profiling_note(self) -> str | None:
        """What profiling has left, in words (None when it is done): the trial windows still to run and the
        traces they take."""
        left = self.trials_left()
        if not left:
            return None
        sizes = ", ".join(str(b) for b in left)
        return (
            f"profiling candidate sizes: {_count(len(left), 'trial window')} of {len(self.candidates)} left "
            f"({sizes} traces; {sum(left)} traces in all), then it fits T(bs) and chooses; only a window of "
            "exactly a trial's size counts (one closed early by max_wait does not)"
        )

    def _per_trace_points(self) -> list[tuple[float, float]]:
        by_size: dict[int, list[float]] = {}
        for b, s in self._obs:
            by_size.setdefault(b, []).append(s / b)
        # median per size: robust to one slow iteration
        return [(float(b), sorted(v)[len(v) // 2]) for b, v in sorted(by_size.items())]

    def keep_up_size(self, arrival_rate: float, fit: FloorFit | None = None) -> int | None:
        """Smallest window with which the pipeline keeps up with ``arrival_rate`` traces/s (20 % headroom).

        A window of ``b`` traces takes ``b·T(b) = L + c·b`` seconds, so it keeps up when
        ``T(b) ≤ 1/(1.2·rate)``, i.e. ``b ≥ L / (1/(1.2·rate) − c)``. The answer is at most ``bs_max``: when no
        size up to it keeps up (the floor ``c`` alone exceeds the budget, or the size needed is larger), the
        largest allowed window is the fastest. None when the rate or the fit is unknown, and when no size keeps
        up and the size makes no difference (``L = 0``).
        """
        if arrival_rate <= 0:
            return None
        fit = fit or self._fit()
        if fit is None:
            return None
        budget = 1.0 / (KEEP_UP_HEADROOM * arrival_rate)
        if fit.c >= budget:
            return self.bs_max if fit.L > 0 else None
        needed = fit.L / (budget - fit.c)
        return min(self.bs_max, max(1, math.ceil(needed - 1e-9)))  # tolerate float noise at exact integers

    def _fit(self) -> FloorFit | None:
        pts = self._per_trace_points()
        if len({b for b, _ in pts}) < 2:
            return None
        return fit_floor(pts)

    def _clamp(self, value: float) -> int:
        if math.isinf(value):
            return self.bs_max
        return int(min(self.bs_max, max(self.bs_min, round(value))))

    def decide(self, arrival_rate: float | None = None) -> ControllerDecision:
        """Choose a batch size from what has been observed so far."""
        pts = self._per_trace_points()
        if len({b for b, _ in pts}) < 2:
            return ControllerDecision(
                batch_size=self._clamp(self.default),
                reason=f"not enough timings yet (need two distinct sizes); using the default {self.default}",
            )
        fit = fit_floor(pts)
        floor_bs = floor_batch_size(fit, self.floor_tolerance)
        alpha, paper_bs = paper_batch_size(fit, self.reference_bs, self.tau_fraction)
        raw = min(floor_bs, paper_bs)
        chosen = self._clamp(raw)
        if fit.L <= 0:
            reason = "timings show no speed-up from larger batches (fitted L = 0); the smallest allowed size"
        elif paper_bs < floor_bs:
            reason = (
                f"the floor (c={fit.c:.3g} s per trace) is too low to bound the batch: the paper's plateau, where "
                f"the slope is {self.tau_fraction:.1%} of its slope at bs={self.reference_bs}"
            )
        else:
            reason = f"smallest size whose per-trace time is within {self.floor_tolerance:.0%} of the floor"
        if raw < self.bs_min or raw > self.bs_max:
            reason += f"; clamped to [{self.bs_min}, {self.bs_max}]"
        keep_up = self.keep_up_size(arrival_rate, fit) if arrival_rate else None
        if arrival_rate and keep_up is not None and keep_up > chosen:
            chosen = keep_up
            if fit.time(chosen) * KEEP_UP_HEADROOM * arrival_rate > 1.0 + 1e-9:
                reason += f"; raised to {chosen}: no allowed size keeps up with {arrival_rate:.3g} traces/s"
            else:
                reason += f"; raised to {chosen} to keep up with {arrival_rate:.3g} traces/s"
        return ControllerDecision(
            batch_size=chosen,
            reason=reason,
            fit=fit,
            floor_tolerance=self.floor_tolerance,
            floor_bs=floor_bs,
            alpha=alpha,
            paper_bs=paper_bs,
            raw=raw,
            keep_up=keep_up,
        )
