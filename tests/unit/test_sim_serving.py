"""Serving profiles of the SIMULATED endpoint (combee.sim.serving): prefix caching, rate limits, continuous
batching — the pieces alone, then through the HTTP server (issue 12, item 3)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from combee.llm_openai import reset_seconds
from combee.sim.config import SimConfig
from combee.sim.runner import SimThread
from combee.sim.serving import PROFILES, PrefixCache, RateLimiter, SharedThroughput, format_duration


def test_prefix_cache_hits_only_a_shared_prefix_in_whole_blocks() -> None:
    cache = PrefixCache(block_tokens=4)  # 16 characters a block
    head = "A" * 64
    assert cache.admit(head + "first tail .....", 20) == 0
    assert cache.admit(head + "second tail ....", 20) == 16  # the 4 blocks of the shared head
    assert cache.admit("B" + head, 20) == 0  # same blocks, different prefix: no hit
    big = PrefixCache(block_tokens=4, min_tokens=100)
    big.admit(head * 4, 64)
    assert big.admit(head * 4, 64) == 0  # below the minimum cached prompt size


def test_rate_limiter_refills_continuously_and_says_how_long_to_wait() -> None:
    limiter = RateLimiter(requests_per_minute=60, tokens_per_minute=600)
    first = limiter.admit(300, now=0.0)
    assert first.admitted and first.remaining_requests == 59 and first.remaining_tokens == 300
    assert first.reset_tokens_s == pytest.approx(30.0)
    assert limiter.admit(300, now=0.0).admitted
    refused = limiter.admit(300, now=0.0)
    assert not refused.admitted and refused.retry_after_s == pytest.approx(30.0)
    assert not limiter.admit(300, now=10.0).admitted
    assert limiter.admit(300, now=30.0).admitted


@pytest.mark.parametrize(("seconds", "text"), [(0.12, "120ms"), (2.5, "2.5s"), (90.0, "1m30s")])
def test_durations_round_trip_in_openais_spelling(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert reset_seconds(text) == pytest.approx(seconds)
    assert reset_seconds("6m0s") == 360.0 and reset_seconds("1h2m3s") == 3723.0 and reset_seconds("x") is None


# The engine runs on the event loop's real clock, so these tests compare durations measured in the same run
# (ratios) rather than absolute times: a loaded machine wakes the loop late and stretches every duration alike.
# The nominal durations are long enough (0.4 s and up) that a wake-up a few tens of milliseconds late does not
# move a ratio out of its bounds.


async def test_shared_throughput_splits_aggregate_decode_among_streams() -> None:
    # aggregate 100 tok/s, streams capped at 100: one stream of 40 tokens takes 0.4 s; two at once 0.8 s each.
    engine = SharedThroughput(prefill_total=1e9, decode_total=100.0, decode_per_stream=100.0, time_scale=1.0)
    _, alone = await engine.serve(0, 40)
    both = await asyncio.gather(engine.serve(0, 40), engine.serve(0, 40))
    assert [total / alone for _, total in both] == pytest.approx([2.0, 2.0], rel=0.2)
    # a per-stream cap below the aggregate share binds instead: four at once take as long as one alone
    capped = SharedThroughput(prefill_total=1e9, decode_total=1000.0, decode_per_stream=100.0, time_scale=1.0)
    results = await asyncio.gather(*(capped.serve(0, 40) for _ in range(4)))
    assert max(total for _, total in results) / alone == pytest.approx(1.0, rel=0.2)


async def test_shared_throughput_prefills_before_decoding_and_reports_the_first_token() -> None:
    engine = SharedThroughput(prefill_total=1000.0, decode_total=100.0, decode_per_stream=100.0, time_scale=0.5)
    first, total = await engine.serve(800, 40)  # 0.8 s prefill, then 0.4 s decode; halved
    assert first / total == pytest.approx(2 / 3, rel=0.15)


async def _post(url: str, body: Any) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as session, session.post(url + "/chat/completions", json=body) as r:
        return r.status, dict(r.headers), await r.json(content_type=None)


def _body(i: int, words: int = 40) -> dict[str, Any]:
    shared = "The playbook the calls share. " * words
    return {"model": "m", "messages": [{"role": "user", "content": f"{shared} item {i}"}], "max_tokens": 50}


async def test_the_api_profile_limits_and_announces_its_rate() -> None:
    # real time, but instant service: the bucket refills one request per 20 s, so a slow machine cannot refill it
    config = SimConfig.for_profile(
        "api",
        time_scale=1.0,
        ttft_s=0.0,
        prefill_s_per_token=0.0,
        decode_tokens_per_s=1e9,
        jitter_sigma=0.0,
        requests_per_minute=3,
        tokens_per_minute=10**6,
    )
    with SimThread(config) as server:
        answers = [await _post(server.base_url, _body(i)) for i in range(4)]
        stats = server.stats()
    statuses = [status for status, _, _ in answers]
    assert statuses == [200, 200, 200, 429]
    ok_headers, refused_headers = answers[0][1], answers[3][1]
    assert ok_headers["x-ratelimit-limit-requests"] == "3" and ok_headers["x-ratelimit-remaining-requests"] == "2"
    assert float(refused_headers["retry-after-ms"]) > 0 and "x-ratelimit-reset-requests" in refused_headers
    assert stats["rate_limited"] == 1 and stats["profile"] == "api"


async def test_the_gpu_profile_shares_throughput_and_caches_prefixes() -> None:
    config = SimConfig.for_profile("gpu", time_scale=0.05, jitter_sigma=0.0)
    with SimThread(config) as server:
        one = await _post(server.base_url, _body(0, words=200))
        together = await asyncio.gather(*(_post(server.base_url, _body(i, words=200)) for i in range(1, 33)))
        stats = server.stats()
    alone_s = float(one[1]["x-combee-service-time"])
    shared_s = max(float(h["x-combee-service-time"]) for _, h, _ in together)
    assert shared_s > alone_s  # 32 streams in flight share the aggregate rates
    cached = [doc["usage"]["prompt_tokens_details"]["cached_tokens"] for _, _, doc in together]
    assert all(c > 0 for c in cached) and stats["cached_prompt_tokens"] == sum(cached)


def test_every_profile_is_a_valid_config() -> None:
    for name in PROFILES:
        config = SimConfig.for_profile(name)
        assert config.profile == name
    assert SimConfig.for_profile("gpu").shared_throughput and not SimConfig.for_profile("api").shared_throughput
    with pytest.raises(ValueError, match="unknown serving profile"):
        SimConfig.for_profile("tpu")


def test_the_pacer_learns_a_limit_and_its_refill_rate_from_the_headers() -> None:
    from combee.llm_openai import RatePacer

    now = [0.0]
    pacer = RatePacer(lambda: now[0])
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    headers = {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "58",
        "x-ratelimit-reset-requests": "2s",  # 2 missing, full in 2 s: one request a second
        "x-ratelimit-limit-tokens": "1000000",
        "x-ratelimit-remaining-tokens": "1000000",
        "x-ratelimit-reset-tokens": "0ms",
    }
    pacer.observe(headers)

    async def drain() -> None:
        for _ in range(55):  # 58 remaining, 3 (5 % of 60) kept in reserve
            assert await pacer.acquire(10, sleep) == 0.0
        assert await pacer.acquire(10, sleep) == pytest.approx(1.0)

    asyncio.run(drain())
    assert slept == [pytest.approx(1.0)]


async def test_the_openai_client_paces_itself_instead_of_bouncing_off_429s() -> None:
    from combee.llm import ChatMessage, ChatRequest, Role
    from combee.llm_openai import EndpointConfig, OpenAILLM

    config = SimConfig.for_profile("api", time_scale=0.02, requests_per_minute=10, tokens_per_minute=10**7)
    with SimThread(config) as server:
        llm = OpenAILLM(EndpointConfig(base_url=server.base_url, default_model="m", max_concurrency=64))
        try:

            def ask(i: int) -> ChatRequest:
                return ChatRequest(role=Role.GENERATOR, messages=(ChatMessage(role="user", content=f"q{i}"),))

            await llm.complete(ask(0))  # learns the limits
            await asyncio.gather(*(llm.complete(ask(i)) for i in range(1, 25)))
            stats = llm.stats
        finally:
            await llm.aclose()
        server_stats = server.stats()
    # Unpaced, the burst of 24 meets 9 remaining requests and 15 are refused. Paced, requests leave one refill
    # apart (0.12 s); on a loaded machine a few can still reach the server bunched beyond the pacer's reserve of
    # one, so a stray refusal or two is the machine, not the pacer.
    assert server_stats["rate_limited"] <= 2 and stats.retries.get("rate_limited", 0) == server_stats["rate_limited"]
    assert stats.paced_waits > 0
