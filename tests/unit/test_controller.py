import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from combee.controller import BatchSizeController, fit_power_law, plateau_batch_size


@given(A=st.floats(0.1, 100), alpha=st.floats(0.2, 2.0))
def test_fit_recovers_a_and_alpha_from_exact_points(A, alpha):
    pts = [(b, A * b**-alpha) for b in (4, 8, 16, 32, 64)]
    fit = fit_power_law(pts)
    assert pytest.approx(A, rel=1e-6) == fit.A
    assert fit.alpha == pytest.approx(alpha, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)


def test_fit_needs_two_sizes():
    with pytest.raises(ValueError):
        fit_power_law([(8, 1.0), (8, 1.1)])


def test_known_choice():
    # T(bs) = 10 * bs^-1; steepest slope at 8 is -10/64; tau = 0.016 * 10/64;
    # bs* = (alpha*A/tau)^(1/2) = sqrt(10 / (0.016*10/64)) = sqrt(4000) = 63.25
    ctl = BatchSizeController(candidates=(8, 16, 32), bs_min=1, bs_max=500)
    for b in (8, 16, 32):
        ctl.observe(b, 10 * b**-1 * b)  # an iteration of b traces takes b * T(b) seconds
    d = ctl.decide()
    assert d.raw == pytest.approx(math.sqrt(4000))
    assert d.batch_size == 63
    assert d.fit is not None and d.fit.alpha == pytest.approx(1.0)
    assert "A=10" in d.explain() and "α=1.000" in d.explain()


def test_closed_form_matches_slope_condition():
    fit = fit_power_law([(b, 3.0 * b**-0.7) for b in (10, 20, 40)])
    bs = plateau_batch_size(fit, 10)
    assert abs(fit.slope(bs)) == pytest.approx(0.016 * abs(fit.slope(10)))


def test_paper_range_for_realistic_alpha():
    # With the smallest trial at 10 and alpha in 0.8-1.0 the plateau lands in the paper's 64-94 range.
    for alpha, lo, hi in ((1.0, 75, 85), (0.8, 95, 105)):
        fit = fit_power_law([(b, 5 * b**-alpha) for b in (10, 20, 40)])
        assert lo <= plateau_batch_size(fit, 10) <= hi


def test_clamping_and_trials():
    ctl = BatchSizeController(candidates=(32, 8, 16), bs_min=20, bs_max=40)
    assert ctl.candidates == (8, 16, 32)
    assert ctl.next_trial() == 8
    ctl.observe(8, 8.0)
    assert ctl.next_trial() == 16
    ctl.observe(16, 8.0)
    ctl.observe(32, 8.0)
    assert ctl.next_trial() is None
    d = ctl.decide()
    assert d.batch_size == 40 and "clamped" in d.reason


def test_no_speedup_uses_bs_max():
    ctl = BatchSizeController(candidates=(8, 16), bs_min=4, bs_max=128)
    ctl.observe(8, 8.0)
    ctl.observe(16, 32.0)  # per-trace time rises with batch size
    d = ctl.decide()
    assert d.batch_size == 128 and "no speed-up" in d.reason


def test_default_before_any_fit():
    d = BatchSizeController(default=32).decide()
    assert d.batch_size == 32 and d.fit is None


def test_keep_up_raises_the_window():
    ctl = BatchSizeController(candidates=(8, 16, 32), bs_min=1, bs_max=1000)
    for b in (8, 16, 32):
        ctl.observe(b, 10 * b**-0.5 * b)  # T(b) = 10 b^-0.5 s/trace
    calm = ctl.decide(arrival_rate=0.01)
    busy = ctl.decide(arrival_rate=1.0)
    # at 1 trace/s, T(b) <= 1/1.2 needs b >= (10*1.2)^2 = 144
    assert busy.batch_size == 144 and "keep up" in busy.reason
    assert calm.batch_size < busy.batch_size


def test_rejects_bad_config():
    with pytest.raises(ValueError):
        BatchSizeController(candidates=())
    with pytest.raises(ValueError):
        BatchSizeController(bs_min=10, bs_max=5)


@pytest.mark.parametrize("alpha", [0.6, 0.8, 1.0])
def test_the_choice_does_not_depend_on_the_profiling_grid(alpha):
    choices = []
    for grid in ((16, 32, 64), (8, 24, 72), (10, 20, 40)):
        ctl = BatchSizeController(candidates=grid, bs_min=1, bs_max=1000)
        for b in grid:
            ctl.observe(b, 5 * b**-alpha * b)
        choices.append(ctl.decide().batch_size)
    assert max(choices) - min(choices) <= 1
    # anchored at bs 8, realistic alphas land near the paper's 64-94
    assert 55 <= choices[0] <= 110
