"""The simulator's latency model — pure functions of token counts, a config and an rng.

    service_time = (ttft + prompt_tokens · prefill + completion_tokens / decode_rate) · jitter · time_scale
    jitter       = lognormal(0, jitter_sigma), one draw from the request's latency rng

The same factor scales the first-token part and the decode part, so :func:`service_breakdown` splits one
service time into what a streaming client sees as time-to-first-token and the time to stream the rest. Queue
wait for a concurrency slot is *not* part of the service time (the server adds it by waiting, and reports it
apart).
"""

from __future__ import annotations

import random
from typing import NamedTuple

from combee.sim.config import SimConfig

__all__ = ["ServiceTime", "draw_jitter", "service_breakdown", "service_time"]


class ServiceTime(NamedTuple):
    """One request's simulated service, already multiplied by jitter and ``time_scale`` (seconds).

    ``total_s`` is computed in the order the formula is written (so it matches other implementations of the
    same formula bit for bit); ``first_token_s + decode_s`` equals it up to rounding.
    """

    first_token_s: float
    decode_s: float
    total_s: float


def draw_jitter(rng: random.Random, sigma: float) -> float:
    """One lognormal(0, sigma) factor; exactly 1.0 when ``sigma`` is 0 (and then ``rng`` is not consumed).

    Uses ``normalvariate`` (no hidden cached second deviate, unlike ``gauss``), so the draw depends only on
    the rng's state.
    """
    if sigma <= 0.0:
        return 1.0
    return rng.lognormvariate(0.0, sigma)


def service_breakdown(config: SimConfig, prompt_tokens: int, completion_tokens: int, rng: random.Random) -> ServiceTime:
    """The simulated service time of one request, split into first-token and decode parts.

    Promises: both parts are ≥ 0; the total is non-decreasing in either token count for a fixed rng state;
    it is linear in ``config.time_scale``; the same rng state gives the same result. Consumes at most one
    draw from ``rng``.
    """
    jitter = draw_jitter(rng, config.jitter_sigma)
    first_base = config.ttft_s + max(0, prompt_tokens) * config.prefill_s_per_token
    base = first_base + max(0, completion_tokens) / config.decode_tokens_per_s
    total = base * jitter * config.time_scale
    first = first_base * jitter * config.time_scale
    return ServiceTime(first, max(0.0, total - first), total)


def service_time(config: SimConfig, prompt_tokens: int, completion_tokens: int, rng: random.Random) -> float:
    """Total simulated service seconds of one request (see :func:`service_breakdown`)."""
    return service_breakdown(config, prompt_tokens, completion_tokens, rng).total_s
