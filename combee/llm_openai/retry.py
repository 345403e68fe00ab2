"""Retrying and pacing requests to an OpenAI-compatible endpoint.

Retry timing (the contract :func:`backoff_delay` and :func:`retry_after_from_headers` implement):

- Retried: HTTP 429, 408, 409 and 5xx, connection failures, timeouts (``timeout_s`` bounds each attempt end to
  end) and 2xx bodies that are not a chat completion. At most ``max_attempts`` HTTP attempts per request.
- After the n-th failed attempt the wait is drawn with *full jitter*: ``uniform(0, min(backoff_max_s,
  backoff_base_s * 2**(n-1)))``.
- A server hint (``retry-after-ms``, else ``Retry-After`` as seconds or an HTTP-date measured against the
  response's own ``Date`` header) is a floor, not a suggestion: the wait is ``max(hint, jittered backoff)``.
  Retrying earlier than the server asked only burns an attempt on a certain refusal.
- A hint longer than ``backoff_max_s`` is not slept on and not cut short: the request gives up at once with
  :class:`~combee.errors.LLMRateLimited` (carrying the hint as ``retry_after_s``) or
  :class:`~combee.errors.LLMUnavailable`, so the caller can turn it into backpressure instead of a worker
  silently stalling for minutes inside one call.
- A 429 with a hint also closes this instance's gate until the hint has passed: requests about to start wait
  for it instead of each collecting their own 429.

Pacing (:class:`RatePacer`): when the server announces its limits in OpenAI's ``x-ratelimit-*`` headers
(limit, remaining, time until full), this instance mirrors them in its own two buckets (requests, and tokens
estimated as the prompt plus ``max_tokens``) and holds each request until the buckets allow it, so a
rate-limited endpoint is used at its announced rate instead of being probed by 429s. The limits are learnt from
the first answers; a 429 still falls back to the rules above.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import math
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping

__all__ = ["RatePacer", "backoff_delay", "finite_non_negative", "reset_seconds", "retry_after_from_headers"]


def backoff_delay(
    failed_attempts: int,
    *,
    base_s: float,
    max_s: float,
    rng: random.Random,
    retry_after_s: float | None = None,
) -> float:
    """Seconds to wait after the ``failed_attempts``-th failed attempt (1-based) of one request.

    Full jitter: uniform in ``[0, min(max_s, base_s * 2**(failed_attempts - 1))]``. A server hint is a floor
    (``max(hint, jittered)``) and the result never exceeds ``max_s``. Draws exactly one number from ``rng``
    whether or not there is a hint, so a seeded run stays reproducible. Raises :class:`ValueError` if
    ``failed_attempts < 1``.
    """
    if failed_attempts < 1:
        raise ValueError(f"failed_attempts must be >= 1, got {failed_attempts}")
    # The exponent is capped only to keep the float finite; max_s caps the ceiling long before.
    ceiling = min(max_s, base_s * 2.0 ** min(failed_attempts - 1, 64))
    delay = rng.uniform(0.0, ceiling)
    if retry_after_s is not None:
        delay = max(delay, retry_after_s)
    return min(delay, max_s)


def finite_non_negative(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    return max(0.0, value)


def retry_after_from_headers(headers: Mapping[str, str], *, now: Callable[[], float] = time.time) -> float | None:
    """The server's retry hint in seconds, or ``None`` when it gave none (or an unreadable one).

    ``retry-after-ms`` wins over ``Retry-After`` (it is more precise). ``Retry-After`` may be seconds or an
    HTTP-date; a date is measured against the response's own ``Date`` header when present (immune to clock
    skew between us and the server), else against ``now()`` (wall-clock seconds since the epoch).
    Header names are matched case-insensitively; past dates and negative values give ``0.0``.
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis is not None:
        value = finite_non_negative(millis.strip())
        if value is not None:
            return value / 1000.0
    retry_after = lowered.get("retry-after")
    if retry_after is None:
        return None
    retry_after = retry_after.strip()
    seconds = finite_non_negative(retry_after)
    if seconds is not None:
        return seconds
    target = _http_date(retry_after)
    if target is None:
        return None
    reference = _http_date(lowered.get("date", ""))
    return max(0.0, target - (reference if reference is not None else now()))


def _http_date(text: str) -> float | None:
    if not text:
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if parsed.tzinfo is None:  # RFC 9110 dates are GMT; a zone-less one is read the same way.
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.timestamp()


class _Bucket:
    """One mirrored limit: capacity ``limit``, refilled at ``rate`` per second (learnt from a reset time)."""

    def __init__(self) -> None:
        self.limit: float | None = None
        self.rate: float | None = None
        self.level = 0.0
        self.at = 0.0

    def learn(self, limit: float, remaining: float, reset_s: float | None, now: float, refused: bool) -> None:
        if reset_s is not None and reset_s > 0 and remaining < limit:
            # the slowest refill seen: a server that rounds its remaining count down overstates some estimates
            rate = (limit - remaining) / reset_s
            self.rate = rate if self.rate is None else min(self.rate, rate)
        if self.limit is None or refused:
            self.level = 0.0 if refused else remaining
            self.at = now
        self.limit = limit

    def _refill(self, now: float) -> None:
        if self.limit is not None and self.rate is not None and now > self.at:
            self.level = min(self.limit, self.level + (now - self.at) * self.rate)
        self.at = max(self.at, now)

    def wait_for(self, cost: float, now: float) -> float:
        if self.limit is None or self.rate is None:
            return 0.0
        self._refill(now)
        # Headroom for arrival jitter: requests paced apart can reach the server bunched (connection set-up,
        # scheduling), so the bucket keeps a small reserve (5 % of the limit, at least one unit) untouched.
        reserve = min(max(1.0, 0.05 * self.limit), 0.5 * self.limit)
        need = min(cost + reserve, self.limit) - self.level
        return max(0.0, need / self.rate)

    def take(self, cost: float, now: float) -> None:
        if self.limit is not None:
            self._refill(now)
            self.level -= min(cost, self.limit)


class RatePacer:
    """Paces requests by the limits a server announces in OpenAI's ``x-ratelimit-*`` headers.

    :meth:`observe` learns each limit (``x-ratelimit-limit-*``), the current ``remaining`` and the refill rate
    (what is missing divided by ``x-ratelimit-reset-*``, the time until full); from then on the pacer keeps its
    own bucket per limit and :meth:`acquire` waits (in arrival order) until a request's cost fits with a small
    reserve to spare (5 % of the limit, at least one unit: paced requests may still reach the server bunched). A
    refused request (429) empties the buckets. Servers that announce nothing are never paced.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._requests = _Bucket()
        self._tokens = _Bucket()
        self._lock = asyncio.Lock()

    def observe(self, headers: Mapping[str, str], *, refused: bool = False) -> None:
        lowered = {k.lower(): v for k, v in headers.items()}
        now = self._clock()
        for kind, bucket in (("requests", self._requests), ("tokens", self._tokens)):
            limit = finite_non_negative(lowered.get(f"x-ratelimit-limit-{kind}", ""))
            remaining = finite_non_negative(lowered.get(f"x-ratelimit-remaining-{kind}", ""))
            if limit is None or remaining is None or limit <= 0:
                continue
            reset = reset_seconds(lowered.get(f"x-ratelimit-reset-{kind}"))
            bucket.learn(limit, remaining, reset, now, refused)

    async def acquire(self, tokens: int, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> float:
        """Wait until one request of ``tokens`` estimated tokens fits both buckets; returns the seconds waited."""
        waited = 0.0
        async with self._lock:
            while True:
                now = self._clock()
                wait = max(self._requests.wait_for(1, now), self._tokens.wait_for(tokens, now))
                if wait <= 1e-9:
                    break
                waited += wait
                await sleep(wait)
            now = self._clock()
            self._requests.take(1, now)
            self._tokens.take(tokens, now)
        return waited


def reset_seconds(text: str | None) -> float | None:
    """Seconds in an ``x-ratelimit-reset-*`` value: ``"1m30s"``, ``"2.5s"``, ``"120ms"`` or a bare number."""
    if text is None:
        return None
    text = text.strip()
    plain = finite_non_negative(text)
    if plain is not None:
        return plain
    found = re.fullmatch(
        r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?", text
    )
    if not text or found is None:
        return None
    h, m, sec, ms = (float(g) if g else 0.0 for g in found.groups())
    return h * 3600 + m * 60 + sec + ms / 1000
