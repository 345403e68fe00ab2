import json
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from combee.controller import BatchSizeController, fit_floor, floor_batch_size, paper_batch_size

GRIDS = ((16, 32, 64), (8, 24, 72))


def floor_curve(c: float, L: float):
    return lambda b: c + L / b


def profiled(grid, per_trace, **kw) -> BatchSizeController:
    """A controller that has observed one iteration per size of ``grid``, each taking b·T(b) seconds."""
    ctl = BatchSizeController(candidates=grid, **kw)
    for b in grid:
        ctl.observe(b, per_trace(b) * b)
    return ctl


# --- the floor model -----------------------------------------------------------------------------------


@given(c=st.floats(0.001, 1.0), L=st.floats(0.01, 100.0), grid=st.sampled_from(GRIDS))
def test_fit_floor_recovers_c_and_l_from_exact_points(c, L, grid):
    fit = fit_floor([(b, c + L / b) for b in grid])
    assert fit.c == pytest.approx(c, rel=1e-6)
    assert pytest.approx(L, rel=1e-6) == fit.L
    assert fit.r2 == pytest.approx(1.0)
    assert fit.iteration_time(50) == pytest.approx(L + 50 * c)


def test_fit_floor_needs_two_sizes():
    with pytest.raises(ValueError):
        fit_floor([(8, 1.0), (8, 1.1)])


def test_fit_floor_keeps_c_and_l_non_negative():
    rising = fit_floor([(8, 0.10), (16, 0.12), (32, 0.14)])  # per-trace time rises: no speed-up at all
    assert rising.L == 0 and rising.c == pytest.approx(0.12, rel=0.05)
    steep = fit_floor([(8, 1.0), (16, 0.4), (32, 0.1)])  # falls faster than 1/bs: a free fit has c < 0
    assert steep.c == 0 and steep.L > 0


def test_floor_rule_means_within_the_tolerance_of_the_floor():
    fit = fit_floor([(b, 0.05 + 1.0 / b) for b in (16, 32, 64)])
    bs = floor_batch_size(fit, 0.25)
    assert bs == pytest.approx(80)  # L/(εc) = 1/(0.25·0.05)
    assert fit.time(bs) == pytest.approx(1.25 * fit.c)
    assert fit.time(bs - 1) > 1.25 * fit.c
    with pytest.raises(ValueError):
        floor_batch_size(fit, 0)


def test_known_choice_and_its_explanation():
    d = profiled((16, 32, 64), floor_curve(0.05, 1.0), bs_min=1, bs_max=500).decide()
    assert d.raw == pytest.approx(80) and d.floor_bs == pytest.approx(80)
    assert d.batch_size == 80 and "within 25% of the floor" in d.reason
    assert d.fit is not None and d.fit.c == pytest.approx(0.05) and pytest.approx(1.0) == d.fit.L
    assert d.paper_bs is not None and d.paper_bs > 80  # the paper's bound does not bind under a floor
    text = d.explain()
    assert "c=0.05 s" in text and "L=1 s" in text and "bs=80.0" in text


@pytest.mark.parametrize(
    ("c", "L", "expected"),
    [
        (0.046, 1.0, 87),  # the gpu run's curve: the floor rule, L/(0.25·c)
        (0.5, 2.0, 16),  # an early floor: small batches are as fast as any
        (0.1, 3.0, 112),  # L/c = 30: the paper's bound, just below the floor rule's 120
        (0.02, 1.0, 94),  # L/c = 50: the paper's bound
    ],
)
def test_the_choice_does_not_depend_on_the_profiling_grid(c, L, expected):
    grids = (*GRIDS, (10, 20, 40), (20, 50, 100, 200))
    choices = [profiled(grid, floor_curve(c, L), bs_min=1, bs_max=10_000).decide().batch_size for grid in grids]
    assert choices == [expected] * len(grids)


def test_the_choice_hardly_depends_on_the_grid_when_the_curve_is_only_roughly_c_plus_l_over_bs():
    # deeper merge trees make a big iteration a little slower than L + c·bs
    def curve(b):
        return 0.046 + (1.0 + 0.1 * math.log2(b)) / b

    choices = [profiled(grid, curve, bs_max=1000).decide().batch_size for grid in GRIDS]
    assert max(choices) / min(choices) <= 1.10


def test_the_choice_follows_the_measurements():
    # the ratio L/c, not a constant: a controller that ignored its timings would choose the same for all
    choices = [profiled((16, 32, 64), floor_curve(0.05, L), bs_max=1000).decide().batch_size for L in (0.25, 0.5, 1)]
    assert choices == [20, 40, 80]


def test_noise_moves_the_choice_but_not_the_time_it_buys():
    # one iteration per trial size, each off by ~5 % (log-normal): the choice spreads, but the per-trace time at
    # the chosen size stays near the intended 1.25 × floor, because the curve is flat there.
    c, L = 0.05, 1.0
    rng = random.Random(7)
    choices, times = [], []
    for _ in range(300):
        for grid in GRIDS:
            ctl = BatchSizeController(candidates=grid, bs_max=10_000)
            for b in grid:
                ctl.observe(b, (c + L / b) * b * math.exp(rng.gauss(0, 0.05)))
            bs = ctl.decide().batch_size
            choices.append(bs)
            times.append((c + L / bs) / c)
    choices.sort()
    times.sort()
    assert 72 <= choices[len(choices) // 2] <= 88  # the median within 10 % of the noiseless 80
    assert times[int(0.95 * len(times))] <= 1.45
    assert times[int(0.05 * len(times))] >= 1.12


def test_one_slow_iteration_per_size_is_outvoted():
    ctl = BatchSizeController(candidates=(16, 32, 64), bs_max=1000)
    for b in (16, 32, 64):
        for slow in (1.0, 3.0 if b == 64 else 1.0, 1.0):  # a straggler at 64: the median per size drops it
            ctl.observe(b, (0.05 + 1.0 / b) * b * slow)
    assert ctl.decide().batch_size == 80


# --- degenerate timings --------------------------------------------------------------------------------


def test_default_before_two_sizes_are_timed():
    assert BatchSizeController(default=32).decide().batch_size == 32
    ctl = BatchSizeController(candidates=(16,), default=40)
    ctl.observe(16, 3.0)
    ctl.observe(16, 2.0)
    d = ctl.decide()
    assert d.batch_size == 40 and d.fit is None and "not enough timings" in d.explain()


@pytest.mark.parametrize("per_trace", [lambda b: 0.2, lambda b: 0.1 + 0.001 * b])
def test_no_speedup_uses_the_smallest_allowed_size(per_trace):
    # identical or rising per-trace times: a bigger batch buys no time and only risks quality
    d = profiled((8, 16, 32), per_trace, bs_min=4, bs_max=128).decide()
    assert d.fit is not None and d.fit.L == 0
    assert d.batch_size == 4 and "no speed-up" in d.reason


def test_without_a_floor_the_papers_rule_bounds_the_batch():
    # latency-bound (unlimited serving): larger is always faster; the floor rule alone would run to bs_max
    for grid in GRIDS:
        d = profiled(grid, lambda b: 5.0 / b, bs_max=1000).decide()
        assert d.fit is not None and d.fit.c == 0 and d.floor_bs == math.inf
        assert d.alpha == pytest.approx(1.0) and d.batch_size == 63 and "paper's plateau" in d.reason
        assert json.loads(json.dumps(d.as_dict()))["floor_bs"] is None  # written as null, not as Infinity


@pytest.mark.parametrize(("alpha", "lo", "hi"), [(0.8, 74, 80), (0.6, 93, 106)])
def test_the_papers_bound_follows_the_measured_curve(alpha, lo, hi):
    # a power law without a floor: c + L/bs fits it only roughly, but the bound still moves with the curve
    for grid in GRIDS:
        d = profiled(grid, lambda b: 5 * b**-alpha, bs_max=1000).decide()
        assert lo <= d.batch_size <= hi and "paper's plateau" in d.reason


def test_the_papers_bound_is_grid_free_on_a_floor_curve():
    # L/c = 50: the floor rule wants 200, the paper's bound (α over bs 8-64 of the fitted curve) says 94 — and
    # says it for both grids, since it is computed from (c, L), not from a power law fitted to the trial points
    choices = [profiled(grid, floor_curve(0.02, 1.0), bs_max=1000).decide().batch_size for grid in GRIDS]
    assert choices == [94, 94]


def test_paper_batch_size_is_the_slope_condition():
    fit = fit_floor([(b, 0.02 + 1.0 / b) for b in (16, 32, 64)])
    alpha, bs = paper_batch_size(fit, 8, 0.016)
    assert alpha == pytest.approx(math.log(fit.time(8) / fit.time(64)) / math.log(8))

    def slope(b):  # of the matched power law A·b^-alpha
        return -alpha * b ** (-alpha - 1)

    assert slope(bs) == pytest.approx(0.016 * slope(8))
    assert paper_batch_size(fit_floor([(8, 1.0), (16, 1.0)]))[0] == 0  # no speed-up: α = 0


def test_clamping():
    d = profiled((8, 16, 32), floor_curve(0.05, 1.0), bs_min=20, bs_max=40).decide()
    assert d.batch_size == 40 and "clamped" in d.reason
    d = profiled((8, 16, 32), floor_curve(0.5, 1.0), bs_min=20, bs_max=40).decide()  # L/(εc) = 8
    assert d.batch_size == 20 and "clamped" in d.reason


# --- the streaming guard -------------------------------------------------------------------------------


def test_keep_up_size():
    ctl = profiled((16, 32, 64), floor_curve(0.05, 1.0), bs_min=1, bs_max=256)
    # budget 1/(1.2·10) = 0.0833 s per trace: 0.05 + 1/b ≤ 0.0833 ⇔ b ≥ 30
    assert ctl.keep_up_size(10.0) == 30
    assert ctl.keep_up_size(0.1) == 1  # a trickle: any window keeps up
    assert ctl.keep_up_size(16.0) == 256  # b ≥ 480 would keep up: the largest allowed is the fastest
    assert ctl.keep_up_size(20.0) == 256  # the floor alone is over budget
    assert ctl.keep_up_size(0.0) is None
    assert BatchSizeController().keep_up_size(10.0) is None  # nothing timed yet
    flat = profiled((16, 32, 64), lambda b: 0.1)
    assert flat.keep_up_size(5.0) == 1 and flat.keep_up_size(20.0) is None  # size makes no difference


def test_keep_up_raises_the_window():
    ctl = profiled((16, 32, 64), floor_curve(0.05, 1.0), bs_min=1, bs_max=1000)
    calm = ctl.decide(arrival_rate=0.01)
    assert calm.batch_size == 80 and "keep up" not in calm.reason
    busy = ctl.decide(arrival_rate=15.0)  # budget 0.0556 s: b ≥ 1/0.00556 = 180
    assert busy.batch_size == 180 and "raised to 180 to keep up" in busy.reason and busy.keep_up == 180
    hopeless = ctl.decide(arrival_rate=30.0)
    assert hopeless.batch_size == 1000 and "no allowed size keeps up" in hopeless.reason


# --- the decision's record ------------------------------------------------------------------------------


def test_as_dict_reports_the_fit():
    d = profiled((16, 32, 64), floor_curve(0.05, 1.0)).decide(arrival_rate=1.0)
    doc = json.loads(json.dumps(d.as_dict()))
    assert doc["chosen"] == 80 and doc["model"] == "T(bs) = c + L/bs"
    assert doc["c"] == pytest.approx(0.05) and doc["L"] == pytest.approx(1.0) and doc["r2"] == pytest.approx(1.0)
    assert doc["floor_tolerance"] == 0.25 and doc["floor_bs"] == pytest.approx(80)
    assert doc["alpha"] > 0 and doc["paper_bs"] > 80 and doc["raw"] == pytest.approx(80)
    assert doc["profiled"] == [[16, 0.05 + 1 / 16], [32, 0.05 + 1 / 32], [64, 0.05 + 1 / 64]]
    assert doc["explain"] == d.explain()


# --- the trial sizes ------------------------------------------------------------------------------------


def test_the_default_trials_bracket_the_rules_choices():
    # Trials are real iterations that each pay the latency L: the default grid must not sit below the sizes the
    # rule chooses (the old 16/32/64 did: every trial was smaller than the 63-114 the paper's bound gives).
    ctl = BatchSizeController(bs_min=1, bs_max=10_000)
    raws = [profiled(ctl.candidates, floor_curve(1.0, r), bs_min=1, bs_max=10_000).decide().raw for r in range(1, 2000)]
    top = max(c for c in raws if c is not None)
    assert 100 < top < 128 <= max(ctl.candidates)  # the rule's ceiling, ~114, is inside the grid
    assert min(ctl.candidates) <= top / 2  # and the grid spans it: a 4x range of 1/bs for the fit
    no_floor = profiled(ctl.candidates, floor_curve(0.0, 1.0), bs_min=1, bs_max=10_000).decide().batch_size
    assert min(abs(no_floor - b) / b for b in ctl.candidates) < 0.05  # the answer without a floor, 63, is ~a trial


def test_trials_are_clamped_to_the_allowed_sizes():
    # COMBEE_BS_MAX=100 with the default trials: a trial at 128 could never be run at its size, so it would never
    # count as profiled and the controller would never decide.
    ctl = BatchSizeController(bs_max=100)
    assert ctl.candidates == (32, 64, 100)
    assert BatchSizeController(candidates=(4, 16, 32), bs_min=16).candidates == (16, 32)
    sizes = []
    while (b := ctl.next_trial()) is not None:
        sizes.append(b)
        ctl.observe(b, (0.05 + 1.0 / b) * b)
    assert sizes == [32, 64, 100] and ctl.decide().fit is not None


def test_a_long_run_at_one_size_profiles_again():
    # the streaming workers observe every window; once the trials have left the history, they are run again
    ctl = BatchSizeController(history=8)
    for b in ctl.candidates:
        ctl.observe(b, (0.05 + 1.0 / b) * b)
    assert ctl.next_trial() is None
    chosen = ctl.decide().batch_size
    for _ in range(5):
        ctl.observe(chosen, (0.07 + 1.0 / chosen) * chosen)  # the floor has risen: a bigger playbook
        assert ctl.next_trial() is None  # the trials are still in the history
    ctl.observe(chosen, (0.07 + 1.0 / chosen) * chosen)  # 32 leaves the history
    assert ctl.next_trial() == 32
    for b in ctl.candidates:
        ctl.observe(b, (0.07 + 1.0 / b) * b)
    assert ctl.next_trial() is None and ctl.decide().fit.c == pytest.approx(0.07)


def test_rejects_bad_config():
    with pytest.raises(ValueError):
        BatchSizeController(candidates=())
    with pytest.raises(ValueError):
        BatchSizeController(bs_min=10, bs_max=5)
    with pytest.raises(ValueError):
        BatchSizeController(floor_tolerance=0)
