"""The latency model is a pure function: monotonic in tokens, linear in time_scale, deterministic per rng."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from combee.sim.config import SimConfig
from combee.sim.latency import draw_jitter, service_breakdown, service_time

_tokens = st.integers(0, 200_000)
_seeds = st.integers(0, 2**64)
_configs = st.builds(
    SimConfig,
    ttft_s=st.floats(0, 5),
    prefill_s_per_token=st.floats(0, 0.01),
    decode_tokens_per_s=st.floats(1, 500),
    jitter_sigma=st.floats(0, 1),
    time_scale=st.floats(0, 10),
)


def test_the_formula_without_jitter() -> None:
    config = SimConfig(ttft_s=0.4, prefill_s_per_token=0.0002, decode_tokens_per_s=60, jitter_sigma=0, time_scale=2)
    expected = (0.4 + 1000 * 0.0002 + 120 / 60) * 2
    assert service_time(config, 1000, 120, random.Random(0)) == pytest.approx(expected)
    first, decode, total = service_breakdown(config, 1000, 120, random.Random(0))
    assert first == pytest.approx((0.4 + 0.2) * 2) and decode == pytest.approx(4.0)
    assert total == pytest.approx(first + decode) and total == (0.4 + 1000 * 0.0002 + 120 / 60) * 1.0 * 2


@given(config=_configs, prompt=_tokens, completion=_tokens, more=st.integers(0, 10_000), seed=_seeds)
def test_monotonic_in_both_token_counts(config: SimConfig, prompt: int, completion: int, more: int, seed: int) -> None:
    parts = service_breakdown(config, prompt, completion, random.Random(seed))
    assert parts.first_token_s >= 0 and parts.decode_s >= 0
    assert math.isclose(parts.first_token_s + parts.decode_s, parts.total_s, rel_tol=1e-9, abs_tol=1e-12)
    base = service_time(config, prompt, completion, random.Random(seed))
    assert service_time(config, prompt + more, completion, random.Random(seed)) >= base
    assert service_time(config, prompt, completion + more, random.Random(seed)) >= base
    assert base >= 0


@given(config=_configs, prompt=_tokens, completion=_tokens, seed=_seeds, factor=st.floats(0, 100))
def test_linear_in_time_scale(config: SimConfig, prompt: int, completion: int, seed: int, factor: float) -> None:
    scaled = config.model_copy(update={"time_scale": config.time_scale * factor})
    a = service_time(config, prompt, completion, random.Random(seed))
    b = service_time(scaled, prompt, completion, random.Random(seed))
    assert math.isclose(b, a * factor, rel_tol=1e-9, abs_tol=1e-12)


@given(config=_configs, prompt=_tokens, completion=_tokens, seed=_seeds)
def test_deterministic_per_rng_seed_and_consumes_at_most_one_draw(
    config: SimConfig, prompt: int, completion: int, seed: int
) -> None:
    rng_a, rng_b = random.Random(seed), random.Random(seed)
    assert service_breakdown(config, prompt, completion, rng_a) == service_breakdown(config, prompt, completion, rng_b)
    reference = random.Random(seed)
    if config.jitter_sigma > 0:
        reference.normalvariate(0.0, 1.0)
    assert rng_a.random() == reference.random()


def test_jitter_is_lognormal_with_the_configured_sigma() -> None:
    rng = random.Random(1)
    logs = [math.log(draw_jitter(rng, 0.3)) for _ in range(20_000)]
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / len(logs))
    assert abs(mean) < 0.01 and sd == pytest.approx(0.3, abs=0.01)
    assert draw_jitter(rng, 0.0) == 1.0
