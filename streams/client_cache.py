"""The agent-side reader's bookkeeping: the local copy, when to ask Redis again, what a watch yields. Pure (the
clock is passed in); used by :mod:`streams.client`, which exports :class:`PromptVersion`."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["Backoff", "Cache", "PromptVersion", "is_news"]


@dataclass(frozen=True)
class PromptVersion:
    """One published prompt of a namespace. ``published_at`` is the publisher's wall clock (Unix seconds)."""

    version: int
    prompt: str
    namespace: str
    window_id: str | None = None
    published_at: float | None = None


class Backoff:
    """Capped exponential backoff with jitter: after n failures, a uniform draw from [d/2, d],
    d = min(cap, base * 2**(n-1))."""

    def __init__(self, base_s: float, cap_s: float, rng: random.Random) -> None:
        self.base_s, self.cap_s, self.rng = base_s, cap_s, rng

    def delay(self, failures: int) -> float:
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(max(failures, 1) - 1, 60))
        return ceiling / 2 + self.rng.random() * ceiling / 2


class Cache:
    """The local copy and when to ask Redis again. Pure bookkeeping (the clock is passed in)."""

    def __init__(self, max_age_s: float, backoff: Backoff) -> None:
        self.max_age_s = max_age_s
        self.backoff = backoff
        self.value: PromptVersion | None = None
        self.confirmed_at = -math.inf
        self.retry_at = -math.inf
        self.failures = 0
        self.serial = 0

    def answer_without_redis(self, now: float) -> PromptVersion | None:
        """The local copy when it is fresh, or while backing off after a failure; None means ask Redis."""
        if self.value is None:
            return None
        if now - self.confirmed_at < self.max_age_s or now < self.retry_at:
            return self.value
        return None

    def confirmed(self, found: PromptVersion | None, now: float, serial: int = 0) -> PromptVersion | None:
        """Redis answered ``found`` (None: no version to serve) under serving state ``serial``. Keep whichever is
        newer, unless the serving state changed since (a decision may serve a lower version: a rollback, a
        rejected candidate); return what to serve."""
        self.failures = 0
        self.retry_at = -math.inf
        self.confirmed_at = now
        moved = serial > self.serial
        if found is not None and (self.value is None or found.version > self.value.version or moved):
            self.value = found
            self.serial = max(self.serial, serial)
        return self.value

    def failed(self, now: float) -> PromptVersion | None:
        self.failures += 1
        self.retry_at = now + self.backoff.delay(self.failures)
        return self.value


def is_news(found: PromptVersion | None, serial: int, last: int, last_serial: int | None) -> bool:
    """Whether a watch yields ``found``: a newer version, or another one after a decision moved what is served."""
    if found is None:
        return False
    return found.version > last or (last_serial is not None and serial > last_serial and found.version != last)
