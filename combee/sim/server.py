"""The simulator's HTTP server: an OpenAI-compatible endpoint with simulated latency, queueing and faults.

Routes (one port):

* ``GET /v1/models``, ``GET /v1/models/{id}`` — the configured model names (any name is accepted in requests).
* ``POST /v1/embeddings`` — SIMULATED vectors (:mod:`combee.sim.embeddings`): rewordings of one insight close
  together, different insights apart; no latency model, no faults.
* ``POST /v1/chat/completions`` — OpenAI wire format, incl. ``stream`` (SSE, usage in a final chunk when
  ``stream_options.include_usage``), tools and ``response_format``; ``n`` > 1 is rejected with 400.
* ``GET /admin/config``, ``GET|POST /admin/faults``, ``GET /admin/stats``, ``POST /admin/stats/reset``,
  ``GET /admin/malformed`` — for tests and benchmarks.

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
   parts, plus tool-call names and arguments — + :data:`~combee.sim.wire.PER_MESSAGE_TOKENS`), as
   :mod:`combee.sim.inproc`; ``completion_tokens`` = ``estimate_tokens`` of the content or of the tool calls' arguments.
6. Timing: wait FIFO for one of ``max_concurrency`` slots, hold it for the simulated service time
   (:mod:`combee.sim.latency`; a stream spends the first-token part before the first delta and spreads the
   decode part over the chunks), release, answer.

A client that disconnects does not free its slot early: the server "keeps generating", as real ones do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from combee.sim.config import SimConfig
from combee.sim.embeddings import embeddings_answer
from combee.sim.faults import FaultKind, draw_fault, fault_rng, malform, retry_after_headers
from combee.sim.generic import (
    Answer,
    InvalidRequest,
    generic_answer,
    truncate_answer,
    within_contract,
)
from combee.sim.latency import ServiceTime, draw_jitter, service_breakdown
from combee.sim.protocol import Responder, SimRequest
from combee.sim.state import STATE_KEY, SimState
from combee.sim.wire import (
    assistant_message,
    decode_chat,
    error_response,
    json_response,
    rate_headers,
    request_digest,
    stream_pieces,
    timing_headers,
)
from combee.tokens import estimate_tokens

__all__ = ["FINGERPRINT", "build_app", "serve", "start_site"]

log = logging.getLogger("combee.sim")


FINGERPRINT = "combee-sim"


_OWNER = "combee-sim (simulated, not a real model)"


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
            return error_response(503, "simulated outage: the endpoint is unavailable", "service_unavailable")
        try:
            body = json.loads(await self.http.read())
            chat = decode_chat(body)
        except InvalidRequest as exc:
            return error_response(400, str(exc), "invalid_request_error", param=exc.param)
        except ValueError as exc:
            return error_response(400, f"the request body is not valid JSON: {exc}", "invalid_request_error")
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
            limit_headers = rate_headers(admission, config.time_scale)
            if not admission.admitted:
                state.rate_limited += 1
                wait = admission.retry_after_s * config.time_scale
                hint = {"Retry-After": str(math.ceil(wait)), "retry-after-ms": f"{wait * 1000.0:.3f}"}
                return error_response(
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
            return error_response(400, str(exc), "invalid_request_error", param=exc.param)
        except Exception as exc:  # a world-model bug: loud, and visible to the client
            log.exception("responder failed")
            state.faults["responder_error"] += 1
            return error_response(500, f"simulator responder failed: {exc!r}", "server_error")
        if fault is FaultKind.MALFORMED and frng is not None:
            answer, how = malform(answer, frng)
            state.malformed.append((digest.hex(), self.counter))
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
                    "message": assistant_message(answer),
                    "logprobs": None,
                    "finish_reason": answer.finish_reason,
                }
            ],
            "usage": usage,
        }
        return json_response(200, payload, {**timing_headers(service, queue_s), **limit_headers})

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
            return error_response(500, "simulated internal server error", "server_error")
        if fault is FaultKind.HTTP_429:
            return error_response(
                429,
                "simulated rate limit: please retry after the indicated delay",
                "requests",
                code="rate_limit_exceeded",
                headers=retry_after_headers(config),
            )
        hang = config.timeout_hang_s * config.time_scale
        if hang > 0.0:
            await asyncio.sleep(hang)
        return error_response(504, f"simulated timeout: no answer within {hang:.3f} s", "timeout")

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
        headers = {**timing_headers(service, queue_s), **extra_headers}
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
        pieces = stream_pieces(text, min(16, max(1, math.ceil(usage["completion_tokens"] / 8))))
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
        response = error_response(500, "internal simulator error (see the simulator's log)", "server_error")
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
        return error_response(400, "the body is not JSON", "invalid_request_error")
    status, payload = embeddings_answer(body, request.app[STATE_KEY].config.seed)
    return json_response(status, payload)


async def _models(request: web.Request) -> web.Response:
    models = request.app[STATE_KEY].config.models
    return json_response(200, {"object": "list", "data": [_model_card(m) for m in models]})


async def _model(request: web.Request) -> web.Response:
    return json_response(200, _model_card(request.match_info["model"]))


async def _root(request: web.Request) -> web.Response:
    return web.Response(text="Combee LLM simulator: simulated answers and latencies, not a real model.\n")


async def _admin_config(request: web.Request) -> web.Response:
    return json_response(200, request.app[STATE_KEY].config.model_dump(mode="json"))


async def _admin_faults_get(request: web.Request) -> web.Response:
    return json_response(200, request.app[STATE_KEY].config.faults())


async def _admin_faults_post(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    try:
        changes = json.loads(await request.read())
        if not isinstance(changes, dict):
            raise ValueError("the body must be a JSON object of fault settings")
        state.config = state.config.with_faults(**changes)
    except ValueError as exc:
        return error_response(400, str(exc), "invalid_request_error")
    log.info("faults now %s", state.config.faults())
    return json_response(200, state.config.faults())


async def _admin_stats(request: web.Request) -> web.Response:
    return json_response(200, request.app[STATE_KEY].stats())


async def _admin_malformed(request: web.Request) -> web.Response:
    """Every malformed-content fault since the last stats reset: request digest and counter, in order."""
    log_ = request.app[STATE_KEY].malformed
    return json_response(200, {"malformed": [{"digest": d, "counter": c} for d, c in log_]})


async def _admin_stats_reset(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    state.reset_stats()
    return json_response(200, state.stats())


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
    app.router.add_get("/admin/malformed", _admin_malformed)
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
