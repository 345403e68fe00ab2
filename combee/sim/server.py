"""The simulator's HTTP server: an OpenAI-compatible endpoint with simulated latency, queueing and faults.

Routes (one port):

* ``GET /v1/models``, ``GET /v1/models/{id}`` — the configured model names (any name is accepted in requests).
* ``POST /v1/embeddings`` — SIMULATED vectors (:mod:`combee.sim.embeddings`): rewordings of one insight close
  together, different insights apart; no latency model, no faults.
* ``POST /v1/chat/completions`` — OpenAI wire format, incl. ``stream`` (SSE, usage in a final chunk when
  ``stream_options.include_usage``), tools and ``response_format``; ``n`` > 1 is rejected with 400.
* ``GET /admin/config``, ``GET|POST /admin/faults``, ``GET /admin/stats``, ``POST /admin/stats/reset`` — for
  tests and benchmarks.

Every response carries ``x-combee-simulated: true``; completions also carry ``system_fingerprint:
"combee-sim"``, ``x-combee-service-time`` (simulated service seconds, queue wait excluded) and
``x-combee-queue-time`` (seconds spent waiting for a concurrency slot).

One completion, in order:

1. outage on → 503 at once. Body parsed and validated → 400 on anything a real server would reject.
2. ``digest = sha256(f"{seed}|" + canonical JSON of the body without stream/stream_options/user)``; the
   request rng is ``random.Random(int.from_bytes(digest[:8], "big"))`` — the same seeding as
   :mod:`combee.sim.inproc`. The responder (or the generic answer) draws from it first, then the latency
   jitter is drawn from it, so the same body gets the same content and the same latency whatever the arrival
   order. (Canonical = sorted keys, compact separators, UTF-8; ``0`` and ``0.0`` hash differently.)
3. Faults (:mod:`combee.sim.faults`) are drawn from a separate rng that also mixes in a request counter.
   500, 429 and timeout faults are served without taking a concurrency slot (a front-end failure). The
   timeout hang and the Retry-After hint are multiplied by ``time_scale`` like every simulated delay.
4. Content: ``responder.respond(request, rng)``, kept only if it honours the request's contract
   (:func:`combee.sim.generic.within_contract`: a forced tool call gets a tool call, ``response_format`` gets
   JSON fitting its schema); if it returns None, breaks the contract (counted as ``contract_over_world`` in
   ``answered_by``) or there is no responder, a generic answer (:mod:`combee.sim.generic`). A responder
   that raises gets a 500 with the exception text (and a log line) — a world-model bug should be loud. Then
   the malformed-content fault, then ``max_tokens`` truncation
   (``finish_reason="length"``; truncated JSON stays broken).
5. Usage: ``prompt_tokens`` = Σ over messages of (``estimate_tokens`` of its text — content string or text
   parts, plus tool-call names and arguments — + :data:`PER_MESSAGE_TOKENS`), as :mod:`combee.sim.inproc`;
   ``completion_tokens`` = ``estimate_tokens`` of the content or of the tool calls' arguments.
6. Timing: wait FIFO for one of ``max_concurrency`` slots, hold it for the simulated service time
   (:mod:`combee.sim.latency`; a stream spends the first-token part before the first delta and spreads the
   decode part over the chunks), release, answer.

A client that disconnects does not free its slot early: the server "keeps generating", as real ones do.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import random
import socket
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from combee.sim.config import SimConfig
from combee.sim.embeddings import embeddings_answer
from combee.sim.faults import FaultKind, draw_fault, fault_rng, malform, retry_after_headers
from combee.sim.generic import (
    Answer,
    InvalidRequest,
    generic_answer,
    requested_schema,
    truncate_answer,
    within_contract,
)
from combee.sim.latency import ServiceTime, draw_jitter, service_breakdown
from combee.sim.protocol import Responder, SimRequest
from combee.sim.serving import Admission, PrefixCache, RateLimiter, SharedThroughput, format_duration
from combee.tokens import estimate_tokens

__all__ = [
    "FINGERPRINT",
    "PER_MESSAGE_TOKENS",
    "STATE_KEY",
    "FifoSlots",
    "SimState",
    "build_app",
    "request_digest",
    "serve",
    "start_site",
]

log = logging.getLogger("combee.sim")

FINGERPRINT = "combee-sim"
PER_MESSAGE_TOKENS = 4
"""Prompt tokens charged per message on top of its text (role and delimiters, as chat templates add)."""

_OWNER = "combee-sim (simulated, not a real model)"
_EXCLUDED_FROM_DIGEST = ("stream", "stream_options", "user")
_JSON = "application/json"


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


# ------------------------------------------------------------------------------------------------------------
# Request decoding


@dataclass(frozen=True)
class _Chat:
    request: SimRequest
    stream: bool
    include_usage: bool
    prompt_tokens: int
    prompt_text: str


def request_digest(seed: int, body: Mapping[str, Any]) -> bytes:
    """sha256 of ``f"{seed}|"`` + the canonical JSON of ``body`` minus stream/stream_options/user."""
    kept = {k: v for k, v in body.items() if k not in _EXCLUDED_FROM_DIGEST}
    canonical = json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{seed}|{canonical}".encode()).digest()


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    parts: list[str] = []
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        parts.extend(str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                parts.append(str(function.get("name", "")))
                parts.append(str(function.get("arguments", "")))
    return "".join(parts) if len(parts) != 1 else parts[0]


def _positive_int(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest(f"{key} must be a positive integer", key)
    return value


def _decode_chat(body: Any) -> _Chat:
    """Validate a ``/v1/chat/completions`` body like a strict OpenAI-compatible server would."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model is required", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise InvalidRequest("messages must be a non-empty list of message objects", "messages")
    n = body.get("n")
    if n is not None and n != 1:
        raise InvalidRequest("the simulator supports only n = 1 (one choice per request)", "n")
    stream = body.get("stream") is True
    options = body.get("stream_options")
    include_usage = stream and isinstance(options, dict) and options.get("include_usage") is True
    response_format = body.get("response_format")
    if response_format is not None and not isinstance(response_format, dict):
        raise InvalidRequest("response_format must be an object", "response_format")
    requested_schema(response_format)  # validates its shape
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise InvalidRequest("tools must be a list of tool objects", "tools")
    max_tokens = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    temperature = body.get("temperature")
    seed = body.get("seed")
    request = SimRequest(
        model=model,
        messages=messages,
        response_format=response_format,
        tools=tools or None,
        tool_choice=body.get("tool_choice"),
        max_tokens=max_tokens,
        temperature=float(temperature) if isinstance(temperature, int | float) else None,
        seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
    )
    texts = [_message_text(m) for m in messages]
    prompt_tokens = sum(estimate_tokens(t) + PER_MESSAGE_TOKENS for t in texts)
    # what prefix caching compares: the messages in order, each with its role (a chat template's layout)
    prompt_text = "".join(f"<|{m.get('role')}|>{t}" for m, t in zip(messages, texts, strict=True))
    return _Chat(request, stream, include_usage, prompt_tokens, prompt_text)


# ------------------------------------------------------------------------------------------------------------
# Responses


def _json_response(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> web.Response:
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    return web.Response(status=status, body=body, content_type=_JSON, headers=headers)


def _error(
    status: int,
    message: str,
    kind: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    payload = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return _json_response(status, payload, headers)


def _message(answer: Answer) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.content, "refusal": None}
    if answer.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in answer.tool_calls
        ]
    return message


def _rate_headers(admission: Admission, time_scale: float) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers (reset times scaled by ``time_scale`` like every simulated delay)."""
    return {
        "x-ratelimit-limit-requests": str(admission.limit_requests),
        "x-ratelimit-remaining-requests": str(admission.remaining_requests),
        "x-ratelimit-reset-requests": format_duration(admission.reset_requests_s * time_scale),
        "x-ratelimit-limit-tokens": str(admission.limit_tokens),
        "x-ratelimit-remaining-tokens": str(admission.remaining_tokens),
        "x-ratelimit-reset-tokens": format_duration(admission.reset_tokens_s * time_scale),
    }


def _timing_headers(service: ServiceTime, queue_s: float) -> dict[str, str]:
    # repr: exact round-trip, so tiny time_scales keep full precision
    return {"x-combee-service-time": repr(service.total_s), "x-combee-queue-time": repr(queue_s)}


def _pieces(text: str, count: int) -> list[str]:
    if count <= 1 or len(text) <= count:
        return [text] if text else []
    size = math.ceil(len(text) / count)
    return [text[i : i + size] for i in range(0, len(text), size)]


class _Completion:
    """Handles one ``/v1/chat/completions`` request against a :class:`SimState`."""

    def __init__(self, state: SimState, request: web.Request, counter: int) -> None:
        self.state = state
        self.http = request
        self.counter = counter
        self.config = state.config  # a snapshot: an admin change applies to later requests

    async def run(self) -> web.StreamResponse:
        state, config = self.state, self.config
        if config.outage:
            state.faults["outage"] += 1
            return _error(503, "simulated outage: the endpoint is unavailable", "service_unavailable")
        try:
            body = json.loads(await self.http.read())
            chat = _decode_chat(body)
        except InvalidRequest as exc:
            return _error(400, str(exc), "invalid_request_error", param=exc.param)
        except ValueError as exc:
            return _error(400, f"the request body is not valid JSON: {exc}", "invalid_request_error")
        request = chat.request
        digest = request_digest(config.seed, body)  # before the responder sees (and could mutate) the body

        fault: FaultKind | None = None
        frng: random.Random | None = None
        if config.any_fault_rate:
            frng = fault_rng(digest, self.counter)
            fault = draw_fault(config, frng)
            if fault is not None and fault is not FaultKind.MALFORMED:
                state.faults[fault.value] += 1
                return await self._fault_response(fault)

        limit_headers: dict[str, str] = {}
        if state.limiter is not None:
            loop_now = asyncio.get_running_loop().time()
            admission = state.limiter.admit(
                chat.prompt_tokens + (request.max_tokens or 0), loop_now / config.time_scale
            )
            limit_headers = _rate_headers(admission, config.time_scale)
            if not admission.admitted:
                state.rate_limited += 1
                wait = admission.retry_after_s * config.time_scale
                hint = {"Retry-After": str(math.ceil(wait)), "retry-after-ms": f"{wait * 1000.0:.3f}"}
                return _error(
                    429,
                    "simulated rate limit (requests or tokens per minute): retry after the indicated delay",
                    "requests" if admission.remaining_requests < 1 else "tokens",
                    code="rate_limit_exceeded",
                    headers={**limit_headers, **hint},
                )

        rng = random.Random(int.from_bytes(digest[:8], "big"))
        try:
            answer = self._answer(request, rng)
        except InvalidRequest as exc:
            return _error(400, str(exc), "invalid_request_error", param=exc.param)
        except Exception as exc:  # a world-model bug: loud, and visible to the client
            log.exception("responder failed")
            state.faults["responder_error"] += 1
            return _error(500, f"simulator responder failed: {exc!r}", "server_error")
        if fault is FaultKind.MALFORMED and frng is not None:
            answer, how = malform(answer, frng)
            state.faults[FaultKind.MALFORMED.value] += 1
            state.faults[how.value] += 1
        answer = truncate_answer(answer, request.max_tokens)
        completion_tokens = estimate_tokens(answer.completion_text)
        cached = state.prefix.admit(chat.prompt_text, chat.prompt_tokens) if state.prefix is not None else 0
        # The jitter is drawn from the request rng after the content, as combee.sim.inproc does.
        if state.engine is None:
            service = service_breakdown(config, chat.prompt_tokens - cached, completion_tokens, rng)
        else:
            jitter = draw_jitter(rng, config.jitter_sigma)

        loop = asyncio.get_running_loop()
        arrived = loop.time()
        await state.slots.acquire()
        try:
            queue_s = loop.time() - arrived
            if state.engine is not None:  # continuous batching: the service time depends on who else is in flight
                overhead = config.ttft_s * jitter * config.time_scale
                if overhead > 0.0:
                    await asyncio.sleep(overhead)
                first, total = await state.engine.serve(
                    (chat.prompt_tokens - cached) * jitter, completion_tokens * jitter
                )
                service = ServiceTime(overhead + first, total - first, overhead + total)
            state.queue_s += queue_s
            state.service_s += service.total_s
            state.prompt_tokens += chat.prompt_tokens
            state.cached_prompt_tokens += cached
            state.completion_tokens += completion_tokens
            state.answered_by[answer.source] += 1
            state.finish_reasons[answer.finish_reason] += 1
            usage: dict[str, Any] = {
                "prompt_tokens": chat.prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": chat.prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            ident = f"chatcmpl-sim-{digest[:6].hex()}{self.counter:06x}"
            served = state.engine is not None  # the engine has already spent the service time
            if chat.stream:
                return await self._stream(
                    ident, request.model, answer, usage, chat.include_usage, service, queue_s, limit_headers, served
                )
            if service.total_s > 0.0 and not served:
                await asyncio.sleep(service.total_s)
        finally:
            state.slots.release()
        payload = {
            "id": ident,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model,
            "system_fingerprint": FINGERPRINT,
            "choices": [
                {
                    "index": 0,
                    "message": _message(answer),
                    "logprobs": None,
                    "finish_reason": answer.finish_reason,
                }
            ],
            "usage": usage,
        }
        return _json_response(200, payload, {**_timing_headers(service, queue_s), **limit_headers})

    def _answer(self, request: SimRequest, rng: random.Random) -> Answer:
        responder = self.state.responder
        if responder is not None:
            began = time.perf_counter()
            text = responder.respond(request, rng)
            self.state.responder_s += time.perf_counter() - began
            if text is not None:
                answer = within_contract(request, text, rng)
                if answer is not None:
                    return answer
                # The world model recognised the prompt but its answer breaks what the request demands (a
                # forced tool call, another client's schema): the contract wins, as a constrained model's would.
                self.state.answered_by["contract_over_world"] += 1
        return generic_answer(request, rng)

    async def _fault_response(self, fault: FaultKind) -> web.Response:
        config = self.config
        if fault is FaultKind.HTTP_500:
            return _error(500, "simulated internal server error", "server_error")
        if fault is FaultKind.HTTP_429:
            return _error(
                429,
                "simulated rate limit: please retry after the indicated delay",
                "requests",
                code="rate_limit_exceeded",
                headers=retry_after_headers(config),
            )
        hang = config.timeout_hang_s * config.time_scale
        if hang > 0.0:
            await asyncio.sleep(hang)
        return _error(504, f"simulated timeout: no answer within {hang:.3f} s", "timeout")

    async def _stream(
        self,
        ident: str,
        model: str,
        answer: Answer,
        usage: dict[str, Any],
        include_usage: bool,
        service: ServiceTime,
        queue_s: float,
        extra_headers: Mapping[str, str],
        served: bool,
    ) -> web.StreamResponse:
        headers = {**_timing_headers(service, queue_s), **extra_headers}
        headers["Content-Type"] = "text/event-stream"
        headers["Cache-Control"] = "no-cache"
        response = web.StreamResponse(status=200, headers=headers)
        await response.prepare(self.http)
        created = int(time.time())

        def event(choices: list[dict[str, Any]], usage_value: Any = None) -> bytes:
            chunk: dict[str, Any] = {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": FINGERPRINT,
                "choices": choices,
            }
            if include_usage:
                chunk["usage"] = usage_value
            return b"data: " + json.dumps(chunk, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"

        def delta(value: dict[str, Any], finish: str | None = None) -> bytes:
            return event([{"index": 0, "delta": value, "logprobs": None, "finish_reason": finish}])

        text = answer.tool_calls[0].arguments if answer.tool_calls else (answer.content or "")
        pieces = _pieces(text, min(16, max(1, math.ceil(usage["completion_tokens"] / 8))))
        pause = service.decode_s / len(pieces) if pieces and not served else 0.0
        with contextlib.suppress(ConnectionError):
            if service.first_token_s > 0.0 and not served:
                await asyncio.sleep(service.first_token_s)
            if answer.tool_calls:
                call = answer.tool_calls[0]
                head = {
                    "index": 0,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }
                await response.write(delta({"role": "assistant", "content": None, "tool_calls": [head]}))
            else:
                await response.write(delta({"role": "assistant", "content": ""}))
            for piece in pieces:
                if pause > 0.0:
                    await asyncio.sleep(pause)
                if answer.tool_calls:
                    await response.write(delta({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
                else:
                    await response.write(delta({"content": piece}))
            if not pieces and pause == 0.0 and service.decode_s > 0.0 and not served:
                await asyncio.sleep(service.decode_s)
            await response.write(delta({}, answer.finish_reason))
            if include_usage:
                await response.write(event([], usage))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        return response


# ------------------------------------------------------------------------------------------------------------
# Handlers


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    state.requests += 1
    state.counter += 1
    state.in_flight += 1
    try:
        response = await _Completion(state, request, state.counter).run()
    except ConnectionResetError:  # the client went away mid-request (e.g. a killed worker): nobody to answer
        state.by_status["client_gone"] += 1
        raise
    except Exception:
        log.exception("simulator failed on a request")
        response = _error(500, "internal simulator error (see the simulator's log)", "server_error")
    finally:
        state.in_flight -= 1
    state.by_status[str(response.status)] += 1
    return response


def _model_card(name: str) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "combee-sim (simulated, not a real model)",
    }


async def _embeddings(request: web.Request) -> web.Response:
    """``POST /v1/embeddings``: SIMULATED vectors (:mod:`combee.sim.embeddings`)."""
    try:
        body = json.loads(await request.read())
    except ValueError:
        return _error(400, "the body is not JSON", "invalid_request_error")
    status, payload = embeddings_answer(body, request.app[STATE_KEY].config.seed)
    return _json_response(status, payload)


async def _models(request: web.Request) -> web.Response:
    models = request.app[STATE_KEY].config.models
    return _json_response(200, {"object": "list", "data": [_model_card(m) for m in models]})


async def _model(request: web.Request) -> web.Response:
    return _json_response(200, _model_card(request.match_info["model"]))


async def _root(request: web.Request) -> web.Response:
    return web.Response(text="Combee LLM simulator: simulated answers and latencies, not a real model.\n")


async def _admin_config(request: web.Request) -> web.Response:
    return _json_response(200, request.app[STATE_KEY].config.model_dump(mode="json"))


async def _admin_faults_get(request: web.Request) -> web.Response:
    return _json_response(200, request.app[STATE_KEY].config.faults())


async def _admin_faults_post(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    try:
        changes = json.loads(await request.read())
        if not isinstance(changes, dict):
            raise ValueError("the body must be a JSON object of fault settings")
        state.config = state.config.with_faults(**changes)
    except ValueError as exc:
        return _error(400, str(exc), "invalid_request_error")
    log.info("faults now %s", state.config.faults())
    return _json_response(200, state.config.faults())


async def _admin_stats(request: web.Request) -> web.Response:
    return _json_response(200, request.app[STATE_KEY].stats())


async def _admin_stats_reset(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    state.reset_stats()
    return _json_response(200, state.stats())


async def _label_simulated(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["x-combee-simulated"] = "true"


def build_app(config: SimConfig, responder: Responder | None = None) -> web.Application:
    """The simulator as an aiohttp application (state under :data:`STATE_KEY`). Not started."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATE_KEY] = SimState(config, responder)
    app.router.add_get("/", _root)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/v1/models/{model}", _model)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_post("/v1/embeddings", _embeddings)  # SIMULATED vectors: combee/sim/embeddings.py
    app.router.add_get("/admin/config", _admin_config)
    app.router.add_get("/admin/faults", _admin_faults_get)
    app.router.add_post("/admin/faults", _admin_faults_post)
    app.router.add_get("/admin/stats", _admin_stats)
    app.router.add_post("/admin/stats/reset", _admin_stats_reset)
    app.on_response_prepare.append(_label_simulated)
    return app


async def start_site(
    app: web.Application, host: str = "127.0.0.1", port: int = 0, *, shutdown_timeout: float = 2.0
) -> tuple[web.AppRunner, int]:
    """Start serving ``app`` on ``host:port`` (0 = any free port); returns the runner and the bound port.

    The listen backlog is large (4,096, capped by the kernel) so hundreds of clients connecting at once are
    not dropped into SYN retries. ``runner.cleanup()`` stops it, giving in-flight requests
    ``shutdown_timeout`` seconds.
    """
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        bound = int(sock.getsockname()[1])
        site = web.SockSite(runner, sock, backlog=4096)
        await site.start()
    except BaseException:
        sock.close()
        await runner.cleanup()
        raise
    return runner, bound


async def serve(
    config: SimConfig,
    responder: Responder | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until cancelled; ``ready`` (if given) gets the base URL ``http://host:port/v1`` once bound."""
    runner, bound = await start_site(build_app(config, responder), host, port)
    url = f"http://{_url_host(host)}:{bound}/v1"
    log.info("Combee simulator (SIMULATED model answers) listening on %s", url)
    try:
        if ready is not None:
            ready(url)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
