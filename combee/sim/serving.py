"""How the SIMULATED endpoint serves: named serving profiles, prefix caching, continuous batching, rate limits.

A *profile* is a preset of :class:`~combee.sim.config.SimConfig` fields (:data:`PROFILES`); a run picks one by name
(``combee bench --profile gpu``) and records it. The four profiles (sources and arithmetic in docs/simulator.md):

* ``unlimited`` — the simulator of issue 3: 256 slots, each request served at full single-stream speed whatever
  else is in flight. Kept for comparison; it makes the speed-up the ratio of serial stages.
* ``gpu`` — one vLLM-class GPU serving an 8B-class model with continuous batching: the requests in flight share
  an aggregate prefill throughput and an aggregate decode throughput (each decoding stream is also capped at
  the single-stream speed), at most 256 sequences at once (vLLM's default ``max_num_seqs``).
* ``api`` — a paid hosted tier: every request at hosted single-stream speed, but requests-per-minute and
  tokens-per-minute limits, answered with 429 and ``Retry-After`` and announced in OpenAI's ``x-ratelimit-*``
  headers on every answer.
* ``cpu`` — this machine's llama.cpp server (Qwen2.5-Coder-1.5B Q4_K_M, 2 threads, 4 slots): ~55 prompt tokens/s
  and ~20 generated tokens/s in aggregate (measured in issue 10), shared by the busy slots.

Every profile has prefix caching: the prompt's longest prefix already seen (in blocks) is not prefilled again and
is reported as ``usage.prompt_tokens_details.cached_tokens`` (vLLM's automatic prefix caching, hosted prompt
caching; the ``api`` profile caches only prompts of 1,024 tokens or more, in 128-token steps, as OpenAI's
prompt caching is documented to).

The pieces here are pure or clock-injected so they are tested without a server: :class:`PrefixCache`,
:class:`RateLimiter`, and :class:`SharedThroughput` (processor sharing over an event loop).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PROFILES",
    "PROFILE_NAMES",
    "Admission",
    "PrefixCache",
    "RateLimiter",
    "SharedThroughput",
    "format_duration",
]

CHARS_PER_TOKEN = 4  # as combee.tokens.estimate_tokens

PROFILES: dict[str, dict[str, Any]] = {
    "unlimited": {
        "profile": "unlimited",
        "max_concurrency": 256,
        "ttft_s": 0.4,
        "prefill_s_per_token": 0.0002,
        "decode_tokens_per_s": 60.0,
    },
    # One GPU (A100/H100 class), vLLM, an 8B-class model in bf16. Single-stream decode ~75 tok/s on an A100 40GB
    # and ~120-150 on an H100; aggregate decode plateaus near 1.4k tok/s for chat-sized requests on one H100;
    # prefill is compute-bound at roughly 10k tok/s. Sources in docs/simulator.md.
    "gpu": {
        "profile": "gpu",
        "max_concurrency": 256,
        "ttft_s": 0.05,
        "prefill_s_per_token": 0.0001,
        "decode_tokens_per_s": 100.0,
        "prefill_tokens_per_s_total": 10_000.0,
        "decode_tokens_per_s_total": 1_500.0,
        "prefix_block_tokens": 16,
    },
    # A hosted small model on a paid tier: fast single streams, limits of the order of OpenAI's usage tier 2 for
    # a small model (5,000 RPM, 2M TPM); caching from 1,024 prompt tokens in 128-token steps.
    "api": {
        "profile": "api",
        "max_concurrency": 4096,
        "ttft_s": 0.5,
        "prefill_s_per_token": 0.0001,
        "decode_tokens_per_s": 80.0,
        "requests_per_minute": 5_000,
        "tokens_per_minute": 2_000_000,
        "prefix_block_tokens": 128,
        "prefix_min_tokens": 1024,
    },
    # llama.cpp on this machine's 2 cores, 4 slots (the issue-10 measurements).
    "cpu": {
        "profile": "cpu",
        "max_concurrency": 4,
        "ttft_s": 0.1,
        "prefill_s_per_token": 1 / 55.0,
        "decode_tokens_per_s": 20.0,
        "prefill_tokens_per_s_total": 55.0,
        "decode_tokens_per_s_total": 20.0,
        "prefix_block_tokens": 16,
    },
}
"""SimConfig field presets by profile name (explicit SimConfig fields override them)."""

PROFILE_NAMES: tuple[str, ...] = tuple(PROFILES)


# ------------------------------------------------------------------------------------------------------------
# Prefix caching


class PrefixCache:
    """Which prompt prefixes the server has seen, in blocks of ``block_tokens`` (LRU, ``capacity_blocks``).

    A prompt's text is cut into blocks of ``block_tokens · 4`` characters; block i is identified by the hash of
    blocks 0..i (a chain, as vLLM's block hashes are), so only a shared *prefix* can hit. :meth:`admit` returns
    the cached tokens of a prompt (0 below ``min_tokens``) and records its blocks. Deterministic for a given
    order of prompts.
    """

    def __init__(self, block_tokens: int = 16, *, min_tokens: int = 0, capacity_blocks: int = 400_000) -> None:
        self.block_chars = max(1, block_tokens) * CHARS_PER_TOKEN
        self.block_tokens = max(1, block_tokens)
        self.min_tokens = min_tokens
        self.capacity = capacity_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def admit(self, text: str, prompt_tokens: int) -> int:
        """Cached tokens of a prompt whose text is ``text`` and size ``prompt_tokens``; records its blocks."""
        hits = 0
        still_hitting = True
        digest = b""
        whole = len(text) // self.block_chars
        for i in range(whole):
            chunk = text[i * self.block_chars : (i + 1) * self.block_chars]
            digest = hashlib.blake2b(digest + chunk.encode(), digest_size=16).digest()
            if still_hitting and digest in self._blocks:
                hits += 1
                self._blocks.move_to_end(digest)
                continue
            still_hitting = False
            self._blocks[digest] = None
            if len(self._blocks) > self.capacity:
                self._blocks.popitem(last=False)
        cached = min(prompt_tokens, hits * self.block_tokens)
        if prompt_tokens < self.min_tokens:
            return 0
        return cached


# ------------------------------------------------------------------------------------------------------------
# Rate limits (requests and tokens per minute, continuously replenished)


@dataclass(frozen=True)
class Admission:
    """The outcome of :meth:`RateLimiter.admit`: admitted or not, the wait hint, and the ``x-ratelimit-*``
    values (remaining, seconds until full) after this request, in *simulated* seconds."""

    admitted: bool
    retry_after_s: float
    limit_requests: int
    remaining_requests: int
    reset_requests_s: float
    limit_tokens: int
    remaining_tokens: int
    reset_tokens_s: float


@dataclass
class RateLimiter:
    """Two token buckets (requests, tokens) of one minute's capacity, refilled continuously.

    A request costs 1 request and ``tokens`` tokens (the server charges prompt tokens + ``max_tokens``, as
    hosted APIs estimate before generating). ``now`` is simulated seconds, injected by the caller.
    """

    requests_per_minute: int
    tokens_per_minute: int
    _requests: float = field(init=False)
    _tokens: float = field(init=False)
    _at: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._requests = float(self.requests_per_minute)
        self._tokens = float(self.tokens_per_minute)

    def _refill(self, now: float) -> None:
        if self._at is not None and now > self._at:
            elapsed = now - self._at
            self._requests = min(self.requests_per_minute, self._requests + elapsed * self.requests_per_minute / 60)
            self._tokens = min(self.tokens_per_minute, self._tokens + elapsed * self.tokens_per_minute / 60)
        self._at = now if self._at is None else max(self._at, now)

    def admit(self, tokens: int, now: float) -> Admission:
        self._refill(now)
        cost = min(
            float(tokens), float(self.tokens_per_minute)
        )  # a request larger than a minute's budget waits a minute
        r_rate, t_rate = self.requests_per_minute / 60, self.tokens_per_minute / 60
        ok = self._requests >= 1.0 and self._tokens >= cost
        if ok:
            self._requests -= 1.0
            self._tokens -= cost
            wait = 0.0
        else:
            wait = max((1.0 - self._requests) / r_rate, (cost - self._tokens) / t_rate, 0.0)
        # The reset time is stated for the whole units announced as remaining, so that (limit - remaining) / reset
        # is the refill rate exactly (a client paces by it).
        remaining_requests, remaining_tokens = max(0, math.floor(self._requests)), max(0, math.floor(self._tokens))
        return Admission(
            admitted=ok,
            retry_after_s=wait,
            limit_requests=self.requests_per_minute,
            remaining_requests=remaining_requests,
            reset_requests_s=(self.requests_per_minute - remaining_requests) / r_rate,
            limit_tokens=self.tokens_per_minute,
            remaining_tokens=remaining_tokens,
            reset_tokens_s=(self.tokens_per_minute - remaining_tokens) / t_rate,
        )


def format_duration(seconds: float) -> str:
    """OpenAI's reset spelling: ``"1m30s"``, ``"2.5s"``, ``"120ms"`` (read by
    :func:`combee.llm_openai.reset_seconds`)."""
    seconds = max(0.0, seconds)
    if seconds < 1.0:
        return f"{seconds * 1000:.6g}ms"
    minutes, rest = divmod(seconds, 60.0)
    return f"{int(minutes)}m{rest:.3g}s" if minutes >= 1 else f"{rest:.3g}s"


# ------------------------------------------------------------------------------------------------------------
# Continuous batching: processor sharing of aggregate prefill and decode throughput


@dataclass
class _Job:
    prefill: float
    decode: float
    first_token: asyncio.Future[None]
    done: asyncio.Future[None]


class SharedThroughput:
    """Requests in flight share an aggregate prefill rate and an aggregate decode rate (tokens per simulated
    second); a decoding stream never runs faster than ``decode_per_stream``. Prefill comes first, then decode.

    Between events (an arrival, a phase ending) every rate is constant, so the next event time is exact: the
    scheduler advances all jobs to it and re-plans. ``time_scale`` converts simulated seconds into real ones
    (0: everything finishes at once). ``clock`` is the event loop's time (real seconds).
    """

    def __init__(
        self,
        prefill_total: float,
        decode_total: float,
        decode_per_stream: float,
        time_scale: float,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.prefill_total = prefill_total
        self.decode_total = decode_total
        self.decode_per_stream = decode_per_stream
        self.time_scale = time_scale
        self._clock = clock
        self._jobs: list[_Job] = []
        self._at = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def _rates(self) -> tuple[float, float]:
        prefilling = sum(1 for j in self._jobs if j.prefill > 0)
        decoding = sum(1 for j in self._jobs if j.prefill <= 0)
        prefill = self.prefill_total / prefilling if prefilling else 0.0
        decode = min(self.decode_per_stream, self.decode_total / decoding) if decoding else 0.0
        return prefill, decode

    def _advance(self) -> None:
        now = self._now()
        sim = (now - self._at) / self.time_scale if self.time_scale > 0 else math.inf
        self._at = now
        if sim <= 0:
            return
        prefill, decode = self._rates()
        for job in self._jobs:
            if job.prefill > 0:
                job.prefill = max(0.0, job.prefill - prefill * sim)
            else:
                job.decode = max(0.0, job.decode - decode * sim)
        self._settle()

    def _settle(self) -> None:
        eps = 1e-6
        keep: list[_Job] = []
        for job in self._jobs:
            if job.prefill <= eps:
                job.prefill = 0.0
                if not job.first_token.done():
                    job.first_token.set_result(None)
            if job.prefill == 0.0 and job.decode <= eps:
                if not job.done.done():
                    job.done.set_result(None)
                continue
            keep.append(job)
        self._jobs = keep

    def _plan(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._jobs:
            return
        prefill, decode = self._rates()
        times = [j.prefill / prefill if j.prefill > 0 else j.decode / decode for j in self._jobs]
        delay = max(0.0, min(times)) * self.time_scale
        self._timer = asyncio.get_running_loop().call_later(delay, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._advance()
        self._plan()

    @property
    def in_flight(self) -> int:
        return len(self._jobs)

    async def serve(self, prefill_tokens: float, decode_tokens: float) -> tuple[float, float]:
        """Serve one request; returns (real seconds to its first token, real seconds in total)."""
        loop = asyncio.get_running_loop()
        started = self._now()
        job = _Job(max(0.0, prefill_tokens), max(0.0, decode_tokens), loop.create_future(), loop.create_future())
        if self.time_scale <= 0:
            return 0.0, 0.0
        self._advance()
        self._jobs.append(job)
        self._settle()
        self._plan()
        await job.first_token
        first = self._now() - started
        await job.done
        return first, self._now() - started
