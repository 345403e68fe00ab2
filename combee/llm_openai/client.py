"""The OpenAI-compatible client: :class:`OpenAILLM`, one endpoint.

:class:`OpenAILLM` turns a :class:`~combee.llm.ChatRequest` into one ``POST {base_url}/chat/completions``
with the ``openai`` package and owns everything transport-shaped around it: structured-output negotiation,
bounded retries with backoff, a per-instance concurrency limit, usage and cost accounting, and the optional
on-disk :class:`~combee.llm_openai.cache.ResponseCache`. It never parses the content; that is the caller's job.

Retry timing and pacing are :mod:`combee.llm_openai.retry`; what a failed request means (retry or give up)
:mod:`combee.llm_openai.failures`; structured-output negotiation :mod:`combee.llm_openai.structured`; the HTTP
response :mod:`combee.llm_openai.transport`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import sqlite3
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import openai

from combee.errors import LLMError, LLMRateLimited, LLMUnavailable
from combee.llm import REFUSED_BY_SERVER, ChatRequest, ChatResponse, Role, Usage
from combee.llm_openai.cache import ResponseCache, cache_key
from combee.llm_openai.config import EndpointConfig, LLMStats, StructuredMode, is_reasoning_model
from combee.llm_openai.context_window import context_from_models, context_from_props, server_root, slots_from_props
from combee.llm_openai.failures import Failure, classify_status, redact, server_message
from combee.llm_openai.retry import RatePacer, backoff_delay
from combee.llm_openai.structured import (
    FALLBACK_ORDER,
    mentions_structured_output,
    refused_output,
    response_format_for,
    valid_schema_name,
)
from combee.llm_openai.transport import (
    HTTP_RESPONSE,
    BadResponse,
    cause_text,
    connection_refused,
    http_client,
    plain_json,
    read_response,
)
from combee.tokens import estimate_tokens

__all__ = ["OpenAILLM"]

log = logging.getLogger("combee.llm_openai")  # the name it logged under before the package was split


TIMEOUT_HEADROOM = 3.0
"""An attempt may take this many times the longest recent successful attempt of its role (when that is more
than the configured ``timeout_s``): a slow CPU server's normal answers are never cut off."""

TIMEOUT_GROWTH_CAP = 16.0
"""The time limit never grows past this many times the configured ``timeout_s``."""

DURATIONS_KEPT = 32
"""Successful attempts per role whose durations the time limit follows."""


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
    refused_answers: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    estimated_usage_responses: int = 0


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
            # per connect/read/write phase; each attempt is bounded by timeout_for (at most this cap) itself
            timeout=config.timeout_s * TIMEOUT_GROWTH_CAP,
            http_client=http_client(config.http_transport, config.timeout_s * TIMEOUT_GROWTH_CAP),
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
        # The server's own parallel slots (llama.cpp's /props), when fewer than max_concurrency: more requests
        # in flight would only wait in the server's queue, where their time counts against the timeout.
        self._slots: asyncio.Semaphore | None = None
        self._slots_probed = False
        self._slots_lock = asyncio.Lock()
        # How long successful attempts took, per role (the most recent ones): the timeout follows them.
        self._durations: dict[Role, deque[float]] = {}

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
        return FALLBACK_ORDER[self._mode_index] if mode == "auto" else mode

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
            refused_answers=c.refused_answers,
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
            (f"{server_root(self._config.base_url)}/props", context_from_props),
            ("/models", lambda body: context_from_models(body, model)),
        )
        for url, read in probes:
            try:
                async with asyncio.timeout(min(10.0, self._config.timeout_s)):
                    raw = await self._client.get(url, cast_to=HTTP_RESPONSE)
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

    def timeout_for(self, role: Role, timeouts: int = 0) -> float:
        """The time limit of an attempt of ``role`` after ``timeouts`` earlier attempts of the same request
        timed out: the configured ``timeout_s``, raised to :data:`TIMEOUT_HEADROOM` times the longest recent
        successful attempt of the role (what the endpoint is measured to need), doubled per earlier timeout —
        a retry is given the time its predecessor lacked instead of being cut at the same point — and at most
        :data:`TIMEOUT_GROWTH_CAP` times the configured limit."""
        base = self._config.timeout_s
        seen = self._durations.get(role)
        if seen:
            base = max(base, TIMEOUT_HEADROOM * max(seen))
        return min(base * 2**timeouts, TIMEOUT_GROWTH_CAP * self._config.timeout_s)

    async def _match_server_slots(self) -> None:
        """Once: read the server's parallel slots (llama.cpp ``/props`` ``total_slots``) and, when fewer than
        ``max_concurrency``, hold the requests beyond them here, where waiting does not count against a timeout.
        A server that says nothing keeps ``max_concurrency``."""
        if self._slots_probed:
            return
        async with self._slots_lock:
            if self._slots_probed:
                return
            slots = None
            try:
                async with asyncio.timeout(min(10.0, self._config.timeout_s)):
                    raw = await self._client.get(f"{server_root(self._config.base_url)}/props", cast_to=HTTP_RESPONSE)
                slots = slots_from_props(json.loads(raw.content))
            except (openai.APIError, TimeoutError, ValueError) as exc:
                log.debug("%s: no slot count from /props (%s)", self._config.display_url, type(exc).__name__)
            self._slots_probed = True  # only now: the requests waiting on the lock must see the answer
            if slots is not None and slots < self._config.max_concurrency:
                self._slots = asyncio.Semaphore(slots)
                log.info(
                    "%s: the server serves %d requests at a time; at most %d are sent at once (max_concurrency %d)",
                    self._config.display_url, slots, slots, self._config.max_concurrency,
                )  # fmt: skip

    async def _complete(self, request: ChatRequest) -> ChatResponse:
        model = self._config.model_for(request.role)
        messages = [{"role": message.role, "content": message.content} for message in request.messages]
        schema = plain_json(request.json_schema) if request.json_schema is not None else None
        schema_name = valid_schema_name(request.schema_name)

        if self._cache is not None:
            hit = await self._cache_lookup(request, model, messages, schema, schema_name)
            if hit is not None:
                return hit

        if self._config.match_server_slots:
            await self._match_server_slots()
        failed_attempts = 0
        timeouts = 0
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
            response_format = response_format_for(mode, schema_name, schema)
            if response_format is not None:
                kwargs["response_format"] = response_format

            await self._wait_for_cooldown()
            await self._pace(messages, request.max_tokens)
            limit = self.timeout_for(request.role, timeouts)
            try:
                response = await self._attempt(kwargs, model, request.role, limit)
            except openai.APIStatusError as exc:
                if mode is not None and self._fall_back_from(mode, exc):
                    continue  # a negotiation step, not a failure: does not count against max_attempts
                if refused_output(exc):
                    return self._refused(exc, request.role, model)
                failure = self._classify_status(exc, model, mode)
            except (openai.APITimeoutError, TimeoutError) as exc:
                if connection_refused(exc):  # the aiohttp transport reports a refused connect as a timeout
                    failure = Failure("connection", f"connection failed ({self._redact(cause_text(exc))})")
                else:
                    timeouts += 1
                    failure = Failure("timeout", f"timed out (no answer within {limit:g}s)")
            except openai.APIConnectionError as exc:
                failure = Failure("connection", f"connection failed ({self._redact(cause_text(exc))})")
            except BadResponse as exc:
                failure = Failure("bad_response", f"unusable response body ({exc})")
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

    async def _attempt(self, kwargs: dict[str, Any], model: str, role: Role, limit: float) -> ChatResponse:
        async with self._semaphore, self._slots or contextlib.nullcontext():
            self._counters.attempts += 1
            started = self._clock()
            # Bounds the whole attempt; the client's own timeout is per connect/read/write phase.
            async with asyncio.timeout(limit):
                # The client's generic POST with a raw-response cast: the same request body, status handling
                # and errors as ``chat.completions.create``, without its per-request walk of the parameters
                # against the SDK's typed signature and without building a pydantic ``ChatCompletion`` —
                # together most of the client's CPU per request (see docs/benchmarks-history.md). The body is our
                # own plain JSON, so that walk had nothing to change.
                raw = await self._client.post("/chat/completions", body=kwargs, cast_to=HTTP_RESPONSE)
            self._durations.setdefault(role, deque(maxlen=DURATIONS_KEPT)).append(self._clock() - started)
        self._pacer.observe(raw.headers)
        response, estimated = read_response(raw.headers, raw.content, model, kwargs["messages"])
        if estimated:
            self._counters.estimated_usage_responses += 1
        return response

    def _refused(self, exc: openai.APIStatusError, role: Role, model: str) -> ChatResponse:
        """The server generated an answer and refused to return it: an answer without text, not a retry."""
        self._counters.refused_answers += 1
        log.warning(
            "%s: the server refused to return its %s answer (HTTP %d: %s); handed back as a rejected answer, "
            "not sent again (the same request gets the same answer)",
            self._config.display_url, role.value, exc.status_code, self._server_message(exc),
        )  # fmt: skip
        return ChatResponse(text="", model=model, finish_reason=REFUSED_BY_SERVER)

    def _classify_status(self, exc: openai.APIStatusError, model: str, mode: StructuredMode | None) -> Failure:
        """A retryable failure, or raise :class:`LLMUnavailable` for a request the server won't accept."""
        if exc.status_code == 429:
            self._pacer.observe(exc.response.headers, refused=True)
        return classify_status(
            exc, model, mode, where=self._config.display_url, auto=self._auto, message=self._server_message(exc)
        )

    def _server_message(self, exc: openai.APIStatusError) -> str:
        return server_message(exc, self._config.api_key.get_secret_value())

    def _redact(self, text: str) -> str:
        return redact(text, self._config.api_key.get_secret_value())

    # ------------------------------------------------------------------ retries

    async def _back_off(self, failure: Failure, failed_attempts: int) -> None:
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

    def _give_up(self, failure: Failure, attempts: int, *, reason: str) -> LLMError:
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
        if not mentions_structured_output(exc):
            return False
        if mode != self.structured_mode:
            return True  # another request moved on (or settled) while this one was in flight
        if self._settled:
            return False  # this mode is known to work: the server objects to this particular schema
        self._mode_index = FALLBACK_ORDER.index(mode) + 1
        self._rejected_modes.append(mode)
        self._counters.structured_fallbacks += 1
        log.debug(
            "%s rejected response_format mode %r (HTTP %d); trying %r",
            self._config.display_url,
            mode,
            exc.status_code,
            FALLBACK_ORDER[self._mode_index],
        )
        return True

    def _settle(self, mode: StructuredMode) -> None:
        if self._settled:
            return
        self._settled = True
        self._mode_index = FALLBACK_ORDER.index(mode)
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
            modes = [mode for mode in FALLBACK_ORDER[self._mode_index :] if mode != "none"] or ["none"]

        def lookup() -> ChatResponse | None:
            for mode in modes:
                key = cache_key(
                    model=model,
                    messages=messages,
                    response_format=response_format_for(mode, schema_name, schema),
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
