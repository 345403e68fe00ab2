"""The LLM port implemented for any OpenAI-compatible chat-completions endpoint.

:class:`OpenAILLM` turns a :class:`~combee.llm.ChatRequest` into one ``POST {base_url}/chat/completions``
with the ``openai`` package and owns everything transport-shaped around it: structured-output negotiation,
bounded retries with backoff, a per-instance concurrency limit, usage and cost accounting, and the optional
on-disk :class:`~combee.llm_cache.ResponseCache`. It never parses the content; that is the caller's job.

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
import importlib
import json
import logging
import math
import random
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, get_args
from urllib.parse import urlsplit, urlunsplit

import openai
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from combee.errors import ConfigError, LLMError, LLMRateLimited, LLMUnavailable
from combee.llm import DEFAULT_REASONING_MODELS, ChatRequest, ChatResponse, Role, Usage
from combee.llm_cache import ResponseCache, cache_key
from combee.tokens import estimate_tokens

__all__ = [
    "DEFAULT_API_KEY",
    "DEFAULT_CONTEXT_TOKENS",
    "DEFAULT_REASONING_MODELS",
    "EndpointConfig",
    "LLMStats",
    "OpenAILLM",
    "RatePacer",
    "RoleRouter",
    "StructuredMode",
    "StructuredOutput",
    "backoff_delay",
    "context_from_models",
    "context_from_props",
    "is_reasoning_model",
    "reset_seconds",
    "retry_after_from_headers",
]

log = logging.getLogger(__name__)

DEFAULT_API_KEY = "not-needed"
"""What local servers (llama.cpp, the Combee simulator) get as a bearer token when no key is configured."""

DEFAULT_CONTEXT_TOKENS = 32_768
"""Context window assumed when the server does not say (a hosted model's is usually larger)."""

StructuredMode = Literal["json_schema", "json_object_schema", "json_object", "none"]
"""How a request's JSON schema is sent: see :class:`EndpointConfig`."""

StructuredOutput = Literal["auto", "json_schema", "json_object_schema", "json_object", "none"]

HttpTransport = Literal["auto", "aiohttp", "httpx"]
"""The HTTP library under the ``openai`` client: see :class:`EndpointConfig`."""

# "auto" tries these in order and keeps the first the endpoint accepts.
_FALLBACK_ORDER: tuple[StructuredMode, ...] = get_args(StructuredMode)

_RETRYABLE_STATUS_REASONS = {408: "request_timeout", 409: "conflict", 429: "rate_limited"}
_SERVER_MESSAGE_LIMIT = 300
_SCHEMA_NAME_INVALID = re.compile(r"[^A-Za-z0-9_-]")
_STRUCTURED_OUTPUT_WORDS = (
    "response_format",
    "response format",
    "json_schema",
    "json schema",
    "json_object",
    "schema",
    "structured output",
)


def _http_response_class() -> type[Any]:
    """The response class of the HTTP library under the installed ``openai`` (httpx2 from openai 3, httpx before).

    Passed as ``cast_to`` so the client hands back the raw HTTP response instead of parsing it.
    """
    for base in openai.DefaultAsyncHttpxClient.__mro__:
        library = base.__module__.split(".")[0]
        if library in ("httpx", "httpx2"):
            response_class: type[Any] = importlib.import_module(library).Response
            return response_class
    raise ImportError("cannot tell which HTTP library the installed openai package is built on")


_HTTP_RESPONSE = _http_response_class()


def _http_client(transport: HttpTransport, timeout_s: float) -> Any:
    """The ``http_client`` for ``openai.AsyncOpenAI`` (None: the client's own httpx default).

    Raises :class:`~combee.errors.ConfigError` if ``aiohttp`` is asked for and the installed ``openai`` lacks it.
    """
    if transport == "httpx":
        return None
    factory = getattr(openai, "DefaultAioHttpClient", None)
    try:
        if factory is None:
            raise RuntimeError("this openai version has no DefaultAioHttpClient")
        return factory(timeout=timeout_s)
    except RuntimeError as exc:  # the openai package without its aiohttp extra
        if transport == "aiohttp":
            raise ConfigError(f"http_transport='aiohttp' is not available: {exc}") from None
        return None


def _display_url(url: str) -> str:
    """``url`` without user-info, query or fragment: safe to put in logs and error messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class EndpointConfig(BaseModel):
    """One OpenAI-compatible endpoint and how to talk to it. Frozen; invalid values raise
    :class:`pydantic.ValidationError` naming the field and the reason.

    ``base_url`` includes the API prefix, as ``OPENAI_BASE_URL`` does (``http://127.0.0.1:8080/v1``). An empty
    or missing ``api_key`` becomes :data:`DEFAULT_API_KEY`, so
    ``EndpointConfig(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ.get("OPENAI_API_KEY"),
    default_model=...)`` works for hosted and local servers alike. The key is a :class:`SecretStr`: it never
    appears in ``repr``, logs or error messages.

    ``structured_output`` decides how a request's JSON schema is sent: ``json_schema`` (OpenAI's strict
    ``{"type": "json_schema", ...}``), ``json_object_schema`` (llama.cpp's ``{"type": "json_object", "schema":
    ...}``), ``json_object`` (JSON mode, no schema), ``none`` (nothing; the caller's strict parser copes), or
    ``auto``: try them in that order, falling back when the server rejects one with 400/422, and remember
    the first that works.

    ``http_transport`` picks the HTTP library under the ``openai`` client: ``aiohttp`` (the client's
    ``DefaultAioHttpClient``; about half the client CPU per request of the default, which matters when a
    hundred calls start at once), ``httpx`` (the client's default), or ``auto``: aiohttp when the installed
    ``openai`` offers it, httpx otherwise. Requests, answers, errors and retries are the same either way.

    ``context_tokens`` is the context window assumed for a model whose server does not report one
    (:meth:`OpenAILLM.context_tokens` asks the server first). ``reasoning_models`` is a regular expression
    searched in the model name: a match is sent ``max_completion_tokens`` instead of ``max_tokens`` and no
    temperature (an empty pattern matches nothing).

    Costs are computed only when at least one price is set; a missing price counts as zero.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str
    api_key: SecretStr = SecretStr(DEFAULT_API_KEY)
    default_model: str
    models: Mapping[Role, str] = Field(default_factory=dict)
    structured_output: StructuredOutput = "auto"
    max_concurrency: int = Field(default=64, ge=1)
    timeout_s: float = Field(default=120.0, gt=0, allow_inf_nan=False)
    max_attempts: int = Field(default=6, ge=1)
    backoff_base_s: float = Field(default=0.5, gt=0, allow_inf_nan=False)
    backoff_max_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    http_transport: HttpTransport = "auto"
    price_per_1k_prompt: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    price_per_1k_completion: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    cache_dir: Path | None = None
    context_tokens: int = Field(default=DEFAULT_CONTEXT_TOKENS, ge=256)
    reasoning_models: str = DEFAULT_REASONING_MODELS

    @field_validator("reasoning_models")
    @classmethod
    def _check_reasoning_models(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        value = value.strip()
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "must be an absolute http(s) URL including the API prefix, e.g. http://127.0.0.1:8080/v1"
                f" (got {_display_url(value)!r})"
            )
        return value

    @field_validator("api_key", mode="before")
    @classmethod
    def _default_api_key(cls, value: object) -> object:
        raw = value.get_secret_value() if isinstance(value, SecretStr) else value
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return SecretStr(DEFAULT_API_KEY)
        if isinstance(raw, str):
            # A key read from a file often carries a trailing newline, which would be an invalid header.
            return SecretStr(raw.strip())
        return value

    @field_validator("default_model")
    @classmethod
    def _check_default_model(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must name a model (sent as `model` by every role without its own model)")
        return value.strip()

    @field_validator("models")
    @classmethod
    def _check_models(cls, value: Mapping[Role, str]) -> Mapping[Role, str]:
        empty = sorted(role.value for role, model in value.items() if not model.strip())
        if empty:
            raise ValueError(f"empty model name for role(s) {', '.join(empty)}; omit a role to use default_model")
        return {role: model.strip() for role, model in value.items()}

    @model_validator(mode="after")
    def _check_backoff(self) -> EndpointConfig:
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError(f"backoff_max_s ({self.backoff_max_s}) must be >= backoff_base_s ({self.backoff_base_s})")
        return self

    def model_for(self, role: Role) -> str:
        """The model name sent for ``role``: ``models[role]`` if set, else ``default_model``."""
        return self.models.get(role, self.default_model)

    @property
    def display_url(self) -> str:
        """``base_url`` without credentials, query or fragment, for logs and messages."""
        return _display_url(self.base_url)

    def cost_usd(self, usage: Usage) -> float | None:
        """Dollar cost of ``usage`` at the configured prices, or ``None`` when no price is configured."""
        if self.price_per_1k_prompt is None and self.price_per_1k_completion is None:
            return None
        prompt = (self.price_per_1k_prompt or 0.0) * usage.prompt_tokens / 1000.0
        completion = (self.price_per_1k_completion or 0.0) * usage.completion_tokens / 1000.0
        return prompt + completion


class LLMStats(BaseModel):
    """A snapshot of one :class:`OpenAILLM`'s counters since it was created.

    ``usage``/``usage_by_role``/``cost_usd`` count answers that came over HTTP (what the endpoint bills);
    answers replayed from the cache are counted in ``cached_usage`` only. ``retries`` maps a reason
    (``rate_limited``, ``server_error``, ``request_timeout``, ``conflict``, ``timeout``, ``connection``,
    ``bad_response``) to how many retries it caused. ``structured_mode`` is what a schema request would be
    sent with now; ``structured_mode_settled`` is false while ``auto`` is still probing.
    """

    model_config = ConfigDict(frozen=True)

    requests: int = 0
    successes: int = 0
    failures: int = 0
    attempts: int = 0
    retries: Mapping[str, int] = Field(default_factory=dict)
    backoff_s: float = 0.0
    cooldown_waits: int = 0
    paced_waits: int = 0
    paced_s: float = 0.0
    structured_mode: StructuredMode = "json_schema"
    structured_mode_settled: bool = False
    structured_fallbacks: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    usage: Usage = Field(default_factory=Usage)
    usage_by_role: Mapping[Role, Usage] = Field(default_factory=dict)
    estimated_usage_responses: int = 0
    cached_usage: Usage = Field(default_factory=Usage)
    cost_usd: float | None = None


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


def _finite_non_negative(text: str) -> float | None:
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
        value = _finite_non_negative(millis.strip())
        if value is not None:
            return value / 1000.0
    retry_after = lowered.get("retry-after")
    if retry_after is None:
        return None
    retry_after = retry_after.strip()
    seconds = _finite_non_negative(retry_after)
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


def is_reasoning_model(model: str, pattern: str = DEFAULT_REASONING_MODELS) -> bool:
    """True if ``model`` names a reasoning model by ``pattern`` (searched, case-insensitive; "" matches none)."""
    return bool(pattern) and re.search(pattern, model, re.IGNORECASE) is not None


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def context_from_props(body: object) -> int | None:
    """The per-slot context in llama.cpp's ``/props`` answer (``default_generation_settings.n_ctx``), or None."""
    if isinstance(body, Mapping):
        settings = body.get("default_generation_settings")
        if isinstance(settings, Mapping):
            return _positive_int(settings.get("n_ctx"))
    return None


def context_from_models(body: object, model: str) -> int | None:
    """The context of ``model`` in a ``/models`` answer, or None.

    vLLM says ``max_model_len``; some servers ``context_length``; llama.cpp ``meta.n_ctx`` (the context it
    runs with). ``meta.n_ctx_train`` is the *training* context, not what a request may use, so it is ignored.
    """
    data = body.get("data") if isinstance(body, Mapping) else None
    if not isinstance(data, list):
        return None
    entries = [e for e in data if isinstance(e, Mapping)]
    named = [e for e in entries if e.get("id") == model] or (entries if len(entries) == 1 else [])
    for entry in named:
        for key in ("max_model_len", "context_length", "context_window"):
            if (value := _positive_int(entry.get(key))) is not None:
                return value
        meta = entry.get("meta")
        if isinstance(meta, Mapping) and (value := _positive_int(meta.get("n_ctx"))) is not None:
            return value
    return None


def _server_root(base_url: str) -> str:
    """``base_url`` without its API prefix (``/v1``): where llama.cpp serves ``/props``."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


@dataclass(frozen=True)
class _Failure:
    """One failed attempt that may be retried."""

    reason: str  # key of LLMStats.retries
    detail: str  # human-readable, already free of the API key
    status: int | None = None
    retry_after_s: float | None = None


class _BadResponse(Exception):
    """A 2xx whose body is not a usable chat completion."""


@dataclass
class _Counters:
    requests: int = 0
    successes: int = 0
    failures: int = 0
    attempts: int = 0
    backoff_s: float = 0.0
    cooldown_waits: int = 0
    paced_waits: int = 0
    paced_s: float = 0.0
    structured_fallbacks: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    estimated_usage_responses: int = 0


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
            limit = _finite_non_negative(lowered.get(f"x-ratelimit-limit-{kind}", ""))
            remaining = _finite_non_negative(lowered.get(f"x-ratelimit-remaining-{kind}", ""))
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
    plain = _finite_non_negative(text)
    if plain is not None:
        return plain
    found = re.fullmatch(
        r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?", text
    )
    if not text or found is None:
        return None
    h, m, sec, ms = (float(g) if g else 0.0 for g in found.groups())
    return h * 3600 + m * 60 + sec + ms / 1000


class OpenAILLM:
    """:class:`~combee.llm.LLM` over an OpenAI-compatible endpoint.

    ``complete`` returns the answer (``text`` is ``""`` when the server sent no content) or raises, after its
    bounded attempts (see the module docstring for timing):

    - :class:`~combee.errors.LLMRateLimited` if the last failure was a 429 (``retry_after_s`` = its hint);
    - :class:`~combee.errors.LLMUnavailable` for everything else, immediately for requests the server will
      never accept (400/422 other than a structured-output rejection ``auto`` can fall back from, 401, 403,
      404, other 4xx). Messages carry the status and the server's message, never the API key.

    At most ``config.max_concurrency`` HTTP requests of this instance are in flight; waiting for a slot and
    backing off do not hold one. With ``config.cache_dir`` set, a cache hit returns
    ``ChatResponse(cached=True, service_time_s=None)`` with no HTTP request and no slot.

    ``sleep``, ``clock`` (monotonic seconds) and ``rng`` are injected so tests need no real waiting and retry
    timing is reproducible. ``client`` replaces the ``AsyncOpenAI`` this instance would build (then it must
    have ``max_retries=0`` and is not closed by :meth:`aclose`).
    """

    def __init__(
        self,
        config: EndpointConfig,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        self._config = config
        self._sleep = sleep
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        # The cache first: if its directory is unusable (ConfigError) no HTTP client is left unclosed.
        self._cache = ResponseCache(config.cache_dir) if config.cache_dir is not None else None
        self._owns_client = client is None
        self._client = client or openai.AsyncOpenAI(
            api_key=config.api_key.get_secret_value(),
            base_url=config.base_url,
            max_retries=0,  # retries are ours: one policy, one set of counters, an injectable clock
            timeout=config.timeout_s,
            http_client=_http_client(config.http_transport, config.timeout_s),
        )
        self._semaphore = asyncio.Semaphore(config.max_concurrency)
        self._auto = config.structured_output == "auto"
        self._mode_index = 0
        self._settled = not self._auto
        self._rejected_modes: list[StructuredMode] = []
        self._cooldown_until = -math.inf
        self._pacer = RatePacer(clock)
        self._counters = _Counters()
        self._retries: Counter[str] = Counter()
        self._usage_by_role: dict[Role, Usage] = {}
        self._cached_usage = Usage()
        self._closed = False
        self._context: dict[str, int] = {}
        self._context_lock = asyncio.Lock()

    @property
    def config(self) -> EndpointConfig:
        return self._config

    @property
    def cache(self) -> ResponseCache | None:
        """The response cache, when ``config.cache_dir`` is set."""
        return self._cache

    @property
    def structured_mode(self) -> StructuredMode:
        """How a request with a schema is sent right now (while ``auto`` probes, the mode being tried)."""
        mode = self._config.structured_output
        return _FALLBACK_ORDER[self._mode_index] if mode == "auto" else mode

    @property
    def stats(self) -> LLMStats:
        """A consistent snapshot of the counters (cheap; safe to read at any time)."""
        c = self._counters
        usage = sum(self._usage_by_role.values(), Usage())
        return LLMStats(
            requests=c.requests,
            successes=c.successes,
            failures=c.failures,
            attempts=c.attempts,
            retries=dict(self._retries),
            backoff_s=c.backoff_s,
            cooldown_waits=c.cooldown_waits,
            paced_waits=c.paced_waits,
            paced_s=c.paced_s,
            structured_mode=self.structured_mode,
            structured_mode_settled=self._settled,
            structured_fallbacks=c.structured_fallbacks,
            cache_hits=c.cache_hits,
            cache_misses=c.cache_misses,
            usage=usage,
            usage_by_role=dict(self._usage_by_role),
            estimated_usage_responses=c.estimated_usage_responses,
            cached_usage=self._cached_usage,
            cost_usd=self._config.cost_usd(usage),
        )

    # ------------------------------------------------------------------ context window

    async def context_tokens(self, role: Role) -> int:
        """Tokens (prompt + completion) one request of ``role`` may use; the core sizes requests by it.

        Asked of the server once per model: llama.cpp's ``/props`` (``default_generation_settings.n_ctx``, the
        per-slot context, which is what one request gets), else ``{base_url}/models`` (see
        :func:`context_from_models`). When the server says nothing, ``config.context_tokens``. Never raises:
        a failed probe means the configured value.
        """
        model = self._config.model_for(role)
        if model not in self._context:
            async with self._context_lock:
                if model not in self._context:
                    found = await self._probe_context(model)
                    self._context[model] = found if found is not None else self._config.context_tokens
                    log.info(
                        "%s: context window of %r: %d tokens (%s)",
                        self._config.display_url,
                        model,
                        self._context[model],
                        "reported by the server" if found is not None else "configured; the server reports none",
                    )
        return self._context[model]

    async def _probe_context(self, model: str) -> int | None:
        probes: tuple[tuple[str, Callable[[object], int | None]], ...] = (
            (f"{_server_root(self._config.base_url)}/props", context_from_props),
            ("/models", lambda body: context_from_models(body, model)),
        )
        for url, read in probes:
            try:
                async with asyncio.timeout(min(10.0, self._config.timeout_s)):
                    raw = await self._client.get(url, cast_to=_HTTP_RESPONSE)
                found = read(json.loads(raw.content))
            except (openai.APIError, TimeoutError, ValueError) as exc:
                log.debug("%s: no context window from %s (%s)", self._config.display_url, url, type(exc).__name__)
                continue
            if found is not None:
                return found
        return None

    # ------------------------------------------------------------------ the port

    async def complete(self, request: ChatRequest) -> ChatResponse:
        """Answer ``request``; see the class docstring for what is raised and when.

        Raises :class:`RuntimeError` after :meth:`aclose` (a programming error, not an endpoint failure).
        """
        if self._closed:
            raise RuntimeError("OpenAILLM.complete() called after aclose()")
        self._counters.requests += 1
        try:
            response = await self._complete(request)
        except LLMError:
            self._counters.failures += 1
            raise
        self._counters.successes += 1
        return response

    async def _complete(self, request: ChatRequest) -> ChatResponse:
        model = self._config.model_for(request.role)
        messages = [{"role": message.role, "content": message.content} for message in request.messages]
        schema = _plain_json(request.json_schema) if request.json_schema is not None else None
        schema_name = _schema_name(request.schema_name)

        if self._cache is not None:
            hit = await self._cache_lookup(request, model, messages, schema, schema_name)
            if hit is not None:
                return hit

        failed_attempts = 0
        while True:
            mode = self.structured_mode if schema is not None else None
            kwargs: dict[str, Any] = {"model": model, "messages": messages}
            if is_reasoning_model(model, self._config.reasoning_models):
                # Reasoning models refuse max_tokens (their budget includes hidden reasoning) and any
                # temperature but their default.
                kwargs["max_completion_tokens"] = request.max_tokens
            else:
                kwargs["max_tokens"] = request.max_tokens
                kwargs["temperature"] = request.temperature
            if request.seed is not None:
                kwargs["seed"] = request.seed
            response_format = _response_format(mode, schema_name, schema)
            if response_format is not None:
                kwargs["response_format"] = response_format

            await self._wait_for_cooldown()
            await self._pace(messages, request.max_tokens)
            try:
                response = await self._attempt(kwargs, model)
            except openai.APIStatusError as exc:
                if mode is not None and self._fall_back_from(mode, exc):
                    continue  # a negotiation step, not a failure: does not count against max_attempts
                failure = self._classify_status(exc, model, mode)
            except (openai.APITimeoutError, TimeoutError) as exc:
                if _connection_refused(exc):  # the aiohttp transport reports a refused connect as a timeout
                    failure = _Failure("connection", f"connection failed ({self._redact(_cause_text(exc))})")
                else:
                    failure = _Failure("timeout", f"timed out (no answer within {self._config.timeout_s:g}s)")
            except openai.APIConnectionError as exc:
                failure = _Failure("connection", f"connection failed ({self._redact(_cause_text(exc))})")
            except _BadResponse as exc:
                failure = _Failure("bad_response", f"unusable response body ({exc})")
            else:
                if mode is not None:
                    self._settle(mode)
                self._account(request.role, response)
                if self._cache is not None:
                    await self._cache_store(model, messages, response_format, request, response)
                return response

            failed_attempts += 1
            await self._back_off(failure, failed_attempts)

    # ------------------------------------------------------------------ one HTTP attempt

    async def _attempt(self, kwargs: dict[str, Any], model: str) -> ChatResponse:
        async with self._semaphore:
            self._counters.attempts += 1
            # Bounds the whole attempt; the client's own timeout is per connect/read/write phase.
            async with asyncio.timeout(self._config.timeout_s):
                # The client's generic POST with a raw-response cast: the same request body, status handling
                # and errors as ``chat.completions.create``, without its per-request walk of the parameters
                # against the SDK's typed signature and without building a pydantic ``ChatCompletion`` —
                # together most of the client's CPU per request (see docs/benchmarks.md). The body is our
                # own plain JSON, so that walk had nothing to change.
                raw = await self._client.post("/chat/completions", body=kwargs, cast_to=_HTTP_RESPONSE)
        self._pacer.observe(raw.headers)
        response, estimated = _read_response(raw.headers, raw.content, model, kwargs["messages"])
        if estimated:
            self._counters.estimated_usage_responses += 1
        return response

    def _classify_status(self, exc: openai.APIStatusError, model: str, mode: StructuredMode | None) -> _Failure:
        """A retryable failure, or raise :class:`LLMUnavailable` for a request the server won't accept."""
        status = exc.status_code
        message = self._server_message(exc)
        detail = f"HTTP {status}" + (f": {message}" if message else "")
        where = self._config.display_url
        if status in _RETRYABLE_STATUS_REASONS or status >= 500:
            reason = _RETRYABLE_STATUS_REASONS.get(status, "server_error")
            hint = retry_after_from_headers(exc.response.headers)
            if status == 429:
                self._pacer.observe(exc.response.headers, refused=True)
            return _Failure(reason, detail, status=status, retry_after_s=hint)
        if status == 401:
            explanation = "the endpoint rejected the API key (check OPENAI_API_KEY / api_key)"
        elif status == 403:
            explanation = f"the API key may not use model {model!r} or this endpoint"
        elif status == 404:
            explanation = (
                f"not found: check that base_url includes the API prefix (e.g. /v1) and that model {model!r} exists"
            )
        elif mode is not None and mode != "none" and _mentions_structured_output(exc):
            if self._auto:
                explanation = (
                    f"the endpoint refused this request's response_format in mode {mode!r}, which it has"
                    " accepted before: check this request's JSON schema"
                )
            else:
                explanation = (
                    f"the endpoint refused the request's response_format (structured_output={mode!r};"
                    " structured_output='auto' finds a form the endpoint accepts)"
                )
        else:
            explanation = "the endpoint refused the request; retrying would not help"
        # `from None`: the openai exception's text may quote whatever the server echoed back.
        raise LLMUnavailable(f"{where}: {explanation} ({detail})") from None

    def _server_message(self, exc: openai.APIStatusError) -> str:
        body = exc.body
        if isinstance(body, Mapping):
            text = body.get("message") if isinstance(body.get("message"), str) else None
            if not text:
                text = json.dumps(body, default=str, ensure_ascii=False)
        elif isinstance(body, str):
            text = body
        elif body is None:
            text = ""
        else:
            text = json.dumps(body, default=str, ensure_ascii=False)
        # Redact before truncating, so a cut can never leave a prefix of the key behind.
        text = self._redact(" ".join(text.split()))
        if len(text) > _SERVER_MESSAGE_LIMIT:
            text = text[: _SERVER_MESSAGE_LIMIT - 1] + "…"
        return text

    def _redact(self, text: str) -> str:
        key = self._config.api_key.get_secret_value()
        # Very short "keys" are placeholders, and replacing them would garble the message.
        if len(key) >= 4:
            text = text.replace(key, "[redacted]")
        return text

    # ------------------------------------------------------------------ retries

    async def _back_off(self, failure: _Failure, failed_attempts: int) -> None:
        """Sleep before the next attempt, or raise if this request has had its attempts."""
        config = self._config
        hint = failure.retry_after_s
        if failed_attempts >= config.max_attempts:
            raise self._give_up(failure, failed_attempts, reason="attempts exhausted")
        if hint is not None and hint > config.backoff_max_s:
            raise self._give_up(
                failure,
                failed_attempts,
                reason=f"server asked to wait {hint:g}s, longer than backoff_max_s={config.backoff_max_s:g}s",
            )
        delay = backoff_delay(
            failed_attempts,
            base_s=config.backoff_base_s,
            max_s=config.backoff_max_s,
            rng=self._rng,
            retry_after_s=hint,
        )
        if failure.status == 429 and hint is not None:
            self._cooldown_until = max(self._cooldown_until, self._clock() + hint)
        self._retries[failure.reason] += 1
        self._counters.backoff_s += delay
        log.debug(
            "%s: attempt %d failed (%s); retrying in %.3fs",
            config.display_url,
            failed_attempts,
            failure.detail,
            delay,
        )
        await self._sleep(delay)

    async def _pace(self, messages: list[dict[str, str]], max_tokens: int) -> None:
        cost = sum(estimate_tokens(m["content"]) + 4 for m in messages) + max_tokens
        wait = await self._pacer.acquire(cost, self._sleep)
        if wait > 0:
            self._counters.paced_waits += 1
            self._counters.paced_s += wait

    async def _wait_for_cooldown(self) -> None:
        wait = self._cooldown_until - self._clock()
        if wait > 0:
            self._counters.cooldown_waits += 1
            await self._sleep(wait)

    def _give_up(self, failure: _Failure, attempts: int, *, reason: str) -> LLMError:
        where = self._config.display_url
        plural = "s" if attempts > 1 else ""
        message = f"{where}: {failure.detail} ({reason} after {attempts} attempt{plural})"
        if failure.status == 429:
            return LLMRateLimited(message, retry_after_s=failure.retry_after_s)
        return LLMUnavailable(message)

    # ------------------------------------------------------------------ structured output

    def _fall_back_from(self, mode: StructuredMode, exc: openai.APIStatusError) -> bool:
        """True if the request should be re-sent with another structured-output mode."""
        if not self._auto or exc.status_code not in (400, 422) or mode == "none":
            return False
        if not _mentions_structured_output(exc):
            return False
        if mode != self.structured_mode:
            return True  # another request moved on (or settled) while this one was in flight
        if self._settled:
            return False  # this mode is known to work: the server objects to this particular schema
        self._mode_index = _FALLBACK_ORDER.index(mode) + 1
        self._rejected_modes.append(mode)
        self._counters.structured_fallbacks += 1
        log.debug(
            "%s rejected response_format mode %r (HTTP %d); trying %r",
            self._config.display_url,
            mode,
            exc.status_code,
            _FALLBACK_ORDER[self._mode_index],
        )
        return True

    def _settle(self, mode: StructuredMode) -> None:
        if self._settled:
            return
        self._settled = True
        self._mode_index = _FALLBACK_ORDER.index(mode)
        rejected = ", ".join(self._rejected_modes) or "none"
        log.info("%s: structured output settled on %r (rejected: %s)", self._config.display_url, mode, rejected)

    # ------------------------------------------------------------------ accounting and cache

    def _account(self, role: Role, response: ChatResponse) -> None:
        self._usage_by_role[role] = self._usage_by_role.get(role, Usage()) + response.usage

    async def _cache_lookup(
        self,
        request: ChatRequest,
        model: str,
        messages: list[dict[str, str]],
        schema: dict[str, Any] | None,
        schema_name: str,
    ) -> ChatResponse | None:
        cache = self._cache
        assert cache is not None
        if schema is None:
            modes: Sequence[StructuredMode | None] = [None]
        elif self._settled:
            modes = [self.structured_mode]
        else:
            # Still probing: an answer stored under any mode auto could still settle on is acceptable
            # (earliest first), so a replay in a fresh process hits before it has re-learnt this endpoint's
            # mode. Except "none": its key is the schema-less request's, and an unconstrained answer must not
            # stand in for a structured one unless this endpoint is known to accept nothing better.
            modes = [mode for mode in _FALLBACK_ORDER[self._mode_index :] if mode != "none"] or ["none"]

        def lookup() -> ChatResponse | None:
            for mode in modes:
                key = cache_key(
                    model=model,
                    messages=messages,
                    response_format=_response_format(mode, schema_name, schema),
                    max_tokens=request.max_tokens,
                    temperature=request.temperature,
                    seed=request.seed,
                )
                hit = cache.get(key)
                if hit is not None:
                    return hit
            return None

        try:
            # In a thread: a lookup is microseconds, but another process holding the write lock or a WAL
            # checkpoint's fsync must never stall the event loop (and every other in-flight request).
            hit = await asyncio.to_thread(lookup)
        except (sqlite3.Error, ValueError) as exc:  # the cache is an optimisation: never fail a request on it
            log.warning("LLM response cache lookup failed (treated as a miss): %s", exc)
            hit = None
        if hit is None:
            self._counters.cache_misses += 1
            return None
        self._counters.cache_hits += 1
        self._cached_usage = self._cached_usage + hit.usage
        return hit

    async def _cache_store(
        self,
        model: str,
        messages: list[dict[str, str]],
        response_format: dict[str, Any] | None,
        request: ChatRequest,
        response: ChatResponse,
    ) -> None:
        cache = self._cache
        assert cache is not None

        def store() -> None:
            key = cache_key(
                model=model,
                messages=messages,
                response_format=response_format,
                max_tokens=request.max_tokens,
                temperature=request.temperature,
                seed=request.seed,
            )
            cache.put(key, response)

        try:
            await asyncio.to_thread(store)
        except (sqlite3.Error, ValueError) as exc:
            log.warning("LLM response cache write failed (answer not cached): %s", exc)

    # ------------------------------------------------------------------ lifecycle

    async def aclose(self) -> None:
        """Close the HTTP client (if this instance built it) and the cache. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            await self._client.close()
        if self._cache is not None:
            self._cache.close()

    async def __aenter__(self) -> OpenAILLM:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


class RoleRouter:
    """:class:`~combee.llm.LLM` that sends each role to its own endpoint: ``routes[role]``, else ``default``.

    Each endpoint keeps its own client, concurrency limit, retries and context window. ``stats`` adds the
    endpoints' counters up (``structured_mode`` is the default endpoint's); :meth:`aclose` closes them all.
    """

    def __init__(self, default: OpenAILLM, routes: Mapping[Role, OpenAILLM]) -> None:
        self._default = default
        self._routes = dict(routes)

    def endpoint(self, role: Role) -> OpenAILLM:
        return self._routes.get(role, self._default)

    def _endpoints(self) -> list[OpenAILLM]:
        return list({id(e): e for e in (self._default, *self._routes.values())}.values())

    async def complete(self, request: ChatRequest) -> ChatResponse:
        return await self.endpoint(request.role).complete(request)

    async def context_tokens(self, role: Role) -> int:
        return await self.endpoint(role).context_tokens(role)

    @property
    def stats(self) -> LLMStats:
        parts = [e.stats for e in self._endpoints()]
        first = parts[0]
        retries: Counter[str] = Counter()
        by_role: dict[Role, Usage] = {}
        for part in parts:
            retries.update(part.retries)
            for role, usage in part.usage_by_role.items():
                by_role[role] = by_role.get(role, Usage()) + usage
        costs = [part.cost_usd for part in parts if part.cost_usd is not None]
        counters: tuple[str, ...] = ("requests", "successes", "failures", "attempts", "backoff_s", "cooldown_waits")
        counters += ("structured_fallbacks", "cache_hits", "cache_misses", "estimated_usage_responses")
        summed = {name: sum(getattr(part, name) for part in parts) for name in counters}
        return first.model_copy(
            update={
                **summed,
                "retries": dict(retries),
                "usage": sum((part.usage for part in parts), Usage()),
                "usage_by_role": by_role,
                "cached_usage": sum((part.cached_usage for part in parts), Usage()),
                "cost_usd": sum(costs) if costs else None,
            }
        )

    async def aclose(self) -> None:
        for endpoint in self._endpoints():
            await endpoint.aclose()


# ---------------------------------------------------------------------- helpers


def _plain_json(value: Mapping[str, Any]) -> dict[str, Any]:
    """A plain-dict deep copy of a JSON schema (ChatRequest may hold any Mapping), preserving key order."""
    copied = json.loads(json.dumps(value, default=_to_builtin))
    if not isinstance(copied, dict):
        raise TypeError("json_schema must be a JSON object")
    return copied


def _to_builtin(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return list(value)
    raise TypeError(f"json_schema holds a value that is not JSON: {type(value).__name__}")


def _schema_name(name: str | None) -> str:
    # OpenAI requires ^[A-Za-z0-9_-]{1,64}$; a bad name would be a 400 that "auto" mistakes for no support.
    cleaned = _SCHEMA_NAME_INVALID.sub("_", name or "")[:64]
    return cleaned or "response"


def _response_format(mode: StructuredMode | None, name: str, schema: dict[str, Any] | None) -> dict[str, Any] | None:
    if schema is None or mode is None or mode == "none":
        return None
    if mode == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    if mode == "json_object_schema":
        return {"type": "json_object", "schema": schema}
    return {"type": "json_object"}


def _mentions_structured_output(exc: openai.APIStatusError) -> bool:
    try:
        body = json.dumps(exc.body, default=str)
    except (TypeError, ValueError):
        body = str(exc.body)
    text = f"{exc.message} {body}".lower()
    return any(word in text for word in _STRUCTURED_OUTPUT_WORDS)


def _connection_refused(exc: BaseException) -> bool:
    """True when a connection error (refused, reset) is somewhere in ``exc``'s cause chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ConnectionError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _cause_text(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause):
        return f"{type(cause).__name__}: {cause}"
    return str(exc) or type(exc).__name__


def _read_response(
    headers: Mapping[str, str], body: bytes, model: str, messages: list[dict[str, str]]
) -> tuple[ChatResponse, bool]:
    """The answer in a 2xx ``body`` and whether its usage was estimated (the server sent none).

    Raises :class:`_BadResponse` if the body is not a chat completion (not JSON, no ``choices[0].message``).
    """
    try:
        completion = json.loads(body)
        choice = completion["choices"][0]
        message = choice["message"]
        content = message.get("content")
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        raise _BadResponse(f"{type(exc).__name__}: {exc}"[:200]) from exc
    text = content if isinstance(content, str) else ""

    served_model = completion.get("model")
    usage = _usage_of(completion.get("usage"))
    if usage is None:
        usage = Usage(
            prompt_tokens=sum(estimate_tokens(message["content"]) for message in messages),
            completion_tokens=estimate_tokens(text),
        )
        estimated = True
    else:
        estimated = False

    response = ChatResponse(
        text=text,
        usage=usage,
        model=served_model if isinstance(served_model, str) and served_model else model,
        service_time_s=_service_time(headers.get("x-combee-service-time")),
        simulated=(headers.get("x-combee-simulated") or "").strip().lower() == "true",
        finish_reason=finish if isinstance(finish := choice.get("finish_reason"), str) else None,
    )
    return response, estimated


def _usage_of(usage: object) -> Usage | None:
    if not isinstance(usage, Mapping):
        return None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    valid = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (prompt, completion))
    if not valid or not isinstance(prompt, int):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    if not isinstance(cached, int) or isinstance(cached, bool) or cached < 0:
        cached = 0
    return Usage(prompt_tokens=prompt, completion_tokens=completion, cached_prompt_tokens=min(cached, prompt))


def _service_time(value: str | None) -> float | None:
    return None if value is None else _finite_non_negative(value.strip())
