"""The retry rules of the OpenAI-compatible client (``combee.llm_openai.retry``): backoff and server hints."""

from __future__ import annotations

import email.utils
import random

import pytest

from combee.llm_openai import backoff_delay, retry_after_from_headers


def test_backoff_grows_exponentially_under_full_jitter_and_caps() -> None:
    rng = random.Random(3)
    for attempt in range(1, 12):
        ceiling = min(10.0, 0.5 * 2 ** (attempt - 1))
        draws = [backoff_delay(attempt, base_s=0.5, max_s=10.0, rng=rng) for _ in range(300)]
        assert all(0.0 <= delay <= ceiling for delay in draws)
        # Full jitter spreads over the whole window, not just near the ceiling.
        assert min(draws) < 0.1 * ceiling and max(draws) > 0.9 * ceiling


def test_backoff_is_reproducible_with_a_seeded_rng_and_hint_keeps_the_stream() -> None:
    first = [backoff_delay(n, base_s=1, max_s=60, rng=random.Random(9)) for n in (1, 2, 3)]
    second = [backoff_delay(n, base_s=1, max_s=60, rng=random.Random(9)) for n in (1, 2, 3)]
    assert first == second

    rng_a, rng_b = random.Random(5), random.Random(5)
    backoff_delay(1, base_s=1, max_s=60, rng=rng_a, retry_after_s=30)
    backoff_delay(1, base_s=1, max_s=60, rng=rng_b)
    assert rng_a.random() == rng_b.random()  # a hint draws exactly as much randomness as no hint


def test_backoff_hint_is_a_floor_and_max_is_a_ceiling() -> None:
    rng = random.Random(0)
    assert backoff_delay(1, base_s=0.5, max_s=10, rng=rng, retry_after_s=4) == 4
    assert backoff_delay(1, base_s=0.5, max_s=10, rng=rng, retry_after_s=99) == 10
    assert 0 <= backoff_delay(100_000, base_s=0.5, max_s=10, rng=rng) <= 10  # no overflow
    with pytest.raises(ValueError):
        backoff_delay(0, base_s=0.5, max_s=10, rng=rng)


def test_retry_after_parsing() -> None:
    assert retry_after_from_headers({}) is None
    assert retry_after_from_headers({"Retry-After": "7"}) == 7.0
    assert retry_after_from_headers({"retry-after": " 2.5 "}) == 2.5
    assert retry_after_from_headers({"RETRY-AFTER-MS": "250"}) == 0.25
    assert retry_after_from_headers({"retry-after-ms": "junk", "retry-after": "3"}) == 3.0
    assert retry_after_from_headers({"retry-after": "-4"}) == 0.0
    assert retry_after_from_headers({"retry-after": "soon"}) is None
    assert retry_after_from_headers({"retry-after": "nan"}) is None
    date = email.utils.formatdate(1_000_060.0, usegmt=True)
    assert retry_after_from_headers({"retry-after": date}, now=lambda: 1_000_000.0) == 60.0
    assert retry_after_from_headers({"retry-after": date}, now=lambda: 2_000_000.0) == 0.0
    server_date = email.utils.formatdate(1_000_050.0, usegmt=True)
    assert retry_after_from_headers({"retry-after": date, "date": server_date}, now=lambda: 0.0) == 10.0
