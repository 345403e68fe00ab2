"""What one simulator process holds: its configuration, faults, counters, and the FIFO of concurrency slots."""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from typing import Any

from aiohttp import web

from combee.sim.config import SimConfig
from combee.sim.protocol import Responder
from combee.sim.serving import PrefixCache, RateLimiter, SharedThroughput

__all__ = ["STATE_KEY", "FifoSlots", "SimState"]


class FifoSlots:
    """A counting semaphore that grants slots strictly in arrival order.

    A released slot is handed directly to the oldest live waiter, so no late arrival can overtake it. A
    waiter cancelled after being granted a slot passes the slot on.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free = capacity
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.waiting = 0

    @property
    def busy(self) -> int:
        """Slots currently held."""
        return self.capacity - self._free

    async def acquire(self) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        self.waiting += 1
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()
            raise
        finally:
            self.waiting -= 1

    def release(self) -> None:
        while self._waiters:
            future = self._waiters.popleft()
            if not future.done():
                future.set_result(None)
                return
        self._free += 1


class SimState:
    """One server's mutable state: the current config (faults change at run time), slots and counters."""

    def __init__(self, config: SimConfig, responder: Responder | None) -> None:
        self.config = config
        self.responder = responder
        self.slots = FifoSlots(config.max_concurrency)
        self.prefix = (
            PrefixCache(config.prefix_block_tokens, min_tokens=config.prefix_min_tokens)
            if config.prefix_cache
            else None
        )
        limited = config.requests_per_minute is not None or config.tokens_per_minute is not None
        self.limiter = (
            RateLimiter(config.requests_per_minute or 10**9, config.tokens_per_minute or 10**12)
            if limited and config.time_scale > 0
            else None
        )
        self.engine = (
            SharedThroughput(
                config.prefill_tokens_per_s_total or 1.0,
                config.decode_tokens_per_s_total or 1.0,
                config.decode_tokens_per_s,
                config.time_scale,
            )
            if config.shared_throughput
            else None
        )
        self.counter = 0  # never reset: it feeds the fault rng
        self.in_flight = 0
        self.started = time.monotonic()
        self.reset_stats()

    def reset_stats(self) -> None:
        """Zero the counters (not ``in_flight``/``queued``, which describe the present)."""
        self.requests = 0
        self.by_status: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.answered_by: Counter[str] = Counter()
        self.finish_reasons: Counter[str] = Counter()
        self.service_s = 0.0
        self.queue_s = 0.0
        self.responder_s = 0.0
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.completion_tokens = 0
        self.rate_limited = 0
        # every malformed-content fault as (request digest hex, request counter): with these a replay can
        # give the same malformed answers (combee.sim.faults.malformed_again), so it follows the same path
        self.malformed: list[tuple[str, int]] = []
        self.cpu_mark = time.process_time()
        self.wall_mark = time.monotonic()

    def stats(self) -> dict[str, Any]:
        """The ``/admin/stats`` document (``cpu_s`` is this process's CPU time since the last reset)."""
        return {
            "simulated": True,
            "requests": self.requests,
            "by_status": dict(self.by_status),
            "faults": dict(self.faults),
            "answered_by": dict(self.answered_by),
            "finish_reasons": dict(self.finish_reasons),
            "in_flight": self.in_flight,
            "queued": self.slots.waiting,
            "busy_slots": self.slots.busy,
            "max_concurrency": self.slots.capacity,
            "service_s_total": self.service_s,
            "queue_s_total": self.queue_s,
            "responder_s_total": self.responder_s,
            "profile": self.config.profile,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "rate_limited": self.rate_limited,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "cpu_s": time.process_time() - self.cpu_mark,
            "wall_s": time.monotonic() - self.wall_mark,
            "uptime_s": time.monotonic() - self.started,
        }


STATE_KEY = web.AppKey("combee_sim_state", SimState)
