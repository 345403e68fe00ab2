"""OpenAILLM against a scripted OpenAI-compatible server on 127.0.0.1, through the real ``openai`` client.

Nothing sleeps for real except a few short server-side delays (timeouts, concurrency): backoff goes through an
injected fake sleep that records the delays and advances a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import random
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from combee.errors import LLMRateLimited, LLMUnavailable
from combee.llm import LLM, REFUSED_BY_SERVER, ChatMessage, ChatRequest, Role, Usage
from combee.llm_openai import (
    EndpointConfig,
    OpenAILLM,
)
from combee.tokens import estimate_tokens

SECRET_KEY = "sk-test-SECRET-0123456789abcdef"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "score": {"type": "integer"}},
    "required": ["answer", "score"],
    "additionalProperties": False,
}


# ---------------------------------------------------------------------- the scripted server


@dataclass
class Reply:
    """One scripted answer. ``body=None`` means a normal chat completion built from the other fields."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    content: str | None = "hello"
    usage: dict[str, int] | None = field(
        default_factory=lambda: {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    )
    model: str = "served-model"


Script = Reply | Callable[[dict[str, Any]], Reply]


class ScriptedServer:
    """Serves ``/v1/chat/completions`` from a queue of replies (then ``default``), recording every request."""

    def __init__(self) -> None:
        self.script: deque[Script] = deque()
        self.default: Script = Reply()
        self.requests: list[dict[str, Any]] = []
        self.auth_headers: list[str | None] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.release = asyncio.Event()  # set at teardown so delayed handlers finish at once
        self.arrived = asyncio.Event()  # set whenever a request is being handled
        self.base_url = ""
        self.props: dict[str, Any] | None = None  # llama.cpp's GET /props answer, when set
        self._runner: web.AppRunner | None = None

    def then(self, *replies: Script) -> ScriptedServer:
        self.script.extend(replies)
        return self

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/props", self._props)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _props(self, request: web.Request) -> web.StreamResponse:
        if self.props is None:
            return web.json_response({"error": {"message": "not found"}}, status=404)
        return web.json_response(self.props)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.auth_headers.append(request.headers.get("Authorization"))
        script = self.script.popleft() if self.script else self.default
        reply = script(body) if callable(script) else script
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            self.arrived.set()
            if reply.delay_s:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.release.wait(), reply.delay_s)
        finally:
            self.in_flight -= 1
        if reply.body is not None:
            if isinstance(reply.body, str):
                return web.Response(status=reply.status, text=reply.body, headers=reply.headers)
            return web.json_response(reply.body, status=reply.status, headers=reply.headers)
        completion: dict[str, Any] = {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 0,
            "model": reply.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply.content},
                    "finish_reason": "stop",
                }
            ],
        }
        if reply.usage is not None:
            completion["usage"] = reply.usage
        return web.json_response(completion, status=reply.status, headers=reply.headers)


def error(status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status=status, body={"error": {"message": message, "type": "test"}}, headers=headers or {})


@pytest.fixture
async def server() -> AsyncIterator[ScriptedServer]:
    srv = ScriptedServer()
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


class FakeTime:
    """A monotonic clock that only moves when someone sleeps; ``gate``, when set, holds sleepers."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.gate: asyncio.Event | None = None
        self._slept = asyncio.Event()

    async def until_sleeps(self, count: int) -> None:
        while len(self.sleeps) < count:
            self._slept.clear()
            await self._slept.wait()

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self._slept.set()
        if self.gate is not None:
            await self.gate.wait()
        self.now += seconds
        await asyncio.sleep(0)


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


def make_config(server: ScriptedServer, **overrides: Any) -> EndpointConfig:
    values: dict[str, Any] = {
        "base_url": server.base_url,
        "api_key": SECRET_KEY,
        "default_model": "default-model",
        "timeout_s": 5.0,
        "max_attempts": 4,
        "backoff_base_s": 0.5,
        "backoff_max_s": 8.0,
    }
    values.update(overrides)
    return EndpointConfig(**values)


def make_llm(server: ScriptedServer, fake_time: FakeTime, *, seed: int = 7, **overrides: Any) -> OpenAILLM:
    return OpenAILLM(
        make_config(server, **overrides),
        sleep=fake_time.sleep,
        clock=fake_time.clock,
        rng=random.Random(seed),
    )


def chat(
    text: str = "Say hello.",
    *,
    role: Role = Role.REFLECTOR,
    schema: dict[str, Any] | None = None,
    seed: int | None = None,
    **kwargs: Any,
) -> ChatRequest:
    return ChatRequest(
        role=role,
        messages=(
            ChatMessage(role="system", content="You are terse."),
            ChatMessage(role="user", content=text),
        ),
        schema_name="Answer" if schema is not None else None,
        json_schema=schema,
        seed=seed,
        **kwargs,
    )


# ---------------------------------------------------------------------- success path


async def test_success_returns_text_usage_and_combee_headers(server: ScriptedServer, fake_time: FakeTime) -> None:
    server.then(
        Reply(
            content="hi there",
            headers={"x-combee-service-time": "0.25", "x-combee-simulated": "true"},
        )
    )
    async with make_llm(server, fake_time, models={Role.CURATOR: "curator-model"}) as llm:
        assert isinstance(llm, LLM)
        response = await llm.complete(chat(seed=42, max_tokens=99, temperature=0.3))
        stats = llm.stats

    assert response.text == "hi there"
    assert response.usage == Usage(prompt_tokens=11, completion_tokens=7)
    assert response.model == "served-model"
    assert response.service_time_s == 0.25
    assert response.simulated is True
    assert response.cached is False

    sent = server.requests[0]
    assert sent["model"] == "default-model"  # no model configured for the reflector
    assert sent["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hello."},
    ]
    assert sent["seed"] == 42
    assert sent["max_tokens"] == 99
    assert sent["temperature"] == 0.3
    assert "response_format" not in sent  # no schema, no response_format
    assert server.auth_headers == [f"Bearer {SECRET_KEY}"]

    assert stats.requests == stats.successes == stats.attempts == 1
    assert stats.retries == {}
    assert fake_time.sleeps == []
    assert stats.usage_by_role == {Role.REFLECTOR: Usage(prompt_tokens=11, completion_tokens=7)}


async def test_model_per_role_seed_omitted_and_plain_headers(server: ScriptedServer, fake_time: FakeTime) -> None:
    async with make_llm(server, fake_time, models={"curator": "curator-model"}) as llm:
        response = await llm.complete(chat(role=Role.CURATOR))
    sent = server.requests[0]
    assert sent["model"] == "curator-model"
    assert "seed" not in sent
    assert response.service_time_s is None
    assert response.simulated is False


async def test_missing_usage_is_estimated_and_null_content_becomes_empty(
    server: ScriptedServer, fake_time: FakeTime
) -> None:
    server.then(Reply(content=None, usage=None))
    async with make_llm(server, fake_time) as llm:
        response = await llm.complete(chat("Count the words here."))
        stats = llm.stats
    assert response.text == ""
    expected_prompt = estimate_tokens("You are terse.") + estimate_tokens("Count the words here.")
    assert response.usage == Usage(prompt_tokens=expected_prompt, completion_tokens=0)
    assert stats.estimated_usage_responses == 1


async def test_cost_accounting_from_prices(server: ScriptedServer, fake_time: FakeTime) -> None:
    server.then(Reply(usage={"prompt_tokens": 2000, "completion_tokens": 500, "total_tokens": 2500}))
    server.then(Reply(usage={"prompt_tokens": 1000, "completion_tokens": 0, "total_tokens": 1000}))
    async with make_llm(server, fake_time, price_per_1k_prompt=0.5, price_per_1k_completion=2.0) as llm:
        await llm.complete(chat(role=Role.CURATOR))
        await llm.complete(chat(role=Role.MERGER))
        stats = llm.stats
    assert stats.cost_usd == pytest.approx(2000 / 1000 * 0.5 + 500 / 1000 * 2.0 + 1000 / 1000 * 0.5)
    assert stats.usage == Usage(prompt_tokens=3000, completion_tokens=500)
    assert set(stats.usage_by_role) == {Role.CURATOR, Role.MERGER}


async def test_no_prices_means_no_cost(server: ScriptedServer, fake_time: FakeTime) -> None:
    async with make_llm(server, fake_time) as llm:
        await llm.complete(chat())
        assert llm.stats.cost_usd is None


# ---------------------------------------------------------------------- retries


async def test_429_with_retry_after_seconds_is_honoured(server: ScriptedServer, fake_time: FakeTime) -> None:
    server.then(error(429, "slow down", {"Retry-After": "3"}))
    async with make_llm(server, fake_time) as llm:
        response = await llm.complete(chat())
        stats = llm.stats
    assert response.text == "hello"
    assert fake_time.sleeps == [3.0]  # the hint beats the first backoff (at most 0.5s)
    assert stats.retries == {"rate_limited": 1}
    assert stats.attempts == 2


async def test_retry_after_ms_wins_over_retry_after(server: ScriptedServer, fake_time: FakeTime) -> None:
    server.then(error(429, "slow down", {"Retry-After": "5", "retry-after-ms": "1500"}))
    async with make_llm(server, fake_time) as llm:
        await llm.complete(chat())
    assert fake_time.sleeps == [1.5]


async def test_retry_after_http_date_measured_against_server_date(server: ScriptedServer, fake_time: FakeTime) -> None:
    server_now = 1_700_000_000.0
    headers = {
        "Date": email.utils.formatdate(server_now, usegmt=True),
        "Retry-After": email.utils.formatdate(server_now + 4, usegmt=True),
    }
    server.then(error(503, "maintenance", headers))
    async with make_llm(server, fake_time) as llm:
        await llm.complete(chat())
        assert llm.stats.retries == {"server_error": 1}
    assert fake_time.sleeps == [4.0]


async def test_hint_longer_than_backoff_max_gives_up_at_once(server: ScriptedServer, fake_time: FakeTime) -> None:
    server.then(error(429, "quota window", {"Retry-After": "120"}))
    async with make_llm(server, fake_time, backoff_max_s=30) as llm:
        with pytest.raises(LLMRateLimited) as caught:
            await llm.complete(chat())
    assert caught.value.retry_after_s == 120.0
    assert "120" in str(caught.value) and "backoff_max_s" in str(caught.value)
    assert fake_time.sleeps == []
    assert len(server.requests) == 1


async def test_500_then_success(server: ScriptedServer, fake_time: FakeTime) -> None:
    server.then(error(500, "boom"), error(502, "bad gateway"))
    async with make_llm(server, fake_time) as llm:
        response = await llm.complete(chat())
        stats = llm.stats
    assert response.text == "hello"
    assert len(server.requests) == 3
    assert stats.retries == {"server_error": 2}
    # Full jitter under ceilings of 0.5 then 1.0 seconds.
    assert len(fake_time.sleeps) == 2
    assert 0 <= fake_time.sleeps[0] <= 0.5 and 0 <= fake_time.sleeps[1] <= 1.0
    assert stats.backoff_s == pytest.approx(sum(fake_time.sleeps))


@pytest.mark.parametrize(("status", "reason"), [(408, "request_timeout"), (409, "conflict")])
async def test_408_and_409_are_retried(server: ScriptedServer, fake_time: FakeTime, status: int, reason: str) -> None:
    server.then(error(status, "try again"))
    async with make_llm(server, fake_time) as llm:
        await llm.complete(chat())
        assert llm.stats.retries == {reason: 1}


async def test_timeout_then_success(server: ScriptedServer, fake_time: FakeTime) -> None:
    server.then(Reply(delay_s=5.0))  # far beyond timeout_s; released at teardown
    async with make_llm(server, fake_time, timeout_s=0.2) as llm:
        response = await llm.complete(chat())
        stats = llm.stats
    assert response.text == "hello"
    assert stats.retries == {"timeout": 1}
    assert len(server.requests) == 2


async def test_a_retry_after_a_timeout_gets_twice_the_time_instead_of_being_cut_at_the_same_point(
    server: ScriptedServer, fake_time: FakeTime
) -> None:
    # a slow server (a CPU model under load): 0.3 s per answer against a 0.2 s limit. With the same limit on
    # every attempt, every attempt would be cut off and the work thrown away; the second gets 0.4 s.
    server.default = Reply(delay_s=0.3)
    async with make_llm(server, fake_time, timeout_s=0.2) as llm:
        response = await llm.complete(chat())
        assert llm.stats.retries == {"timeout": 1}
        assert llm.timeout_for(Role.REFLECTOR, 0) == 0.2 and llm.timeout_for(Role.REFLECTOR, 3) == 1.6
    assert response.text == "hello" and len(server.requests) == 2


async def test_the_time_limit_follows_what_the_endpoint_is_measured_to_need(server: ScriptedServer) -> None:
    server.default = Reply(delay_s=0.25)
    config = make_config(server, timeout_s=0.5)
    async with OpenAILLM(config, sleep=asyncio.sleep, rng=random.Random(1)) as llm:  # the real clock
        assert llm.timeout_for(Role.REFLECTOR) == 0.5
        await llm.complete(chat())
        measured = llm.timeout_for(Role.REFLECTOR)
        assert 0.75 <= measured < 1.5  # three times the 0.25 s the answer took
        assert llm.timeout_for(Role.CURATOR) == 0.5  # per role
        assert llm.timeout_for(Role.REFLECTOR, 10) == 8.0  # never past 16 x the configured limit


async def test_no_more_requests_are_sent_at_once_than_the_server_has_slots(
    server: ScriptedServer, fake_time: FakeTime
) -> None:
    server.props = {"total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}
    server.default = Reply(delay_s=0.1)
    async with make_llm(server, fake_time, max_concurrency=8) as llm:
        await asyncio.gather(*(llm.complete(chat(f"q{i}")) for i in range(6)))
    assert server.max_in_flight == 2 and len(server.requests) == 6


async def test_a_server_that_does_not_say_its_slots_gets_max_concurrency(
    server: ScriptedServer, fake_time: FakeTime
) -> None:
    server.default = Reply(delay_s=0.1)
    async with make_llm(server, fake_time, max_concurrency=4) as llm:
        await asyncio.gather(*(llm.complete(chat(f"q{i}")) for i in range(6)))
    assert server.max_in_flight == 4


async def test_malformed_2xx_body_is_retried(server: ScriptedServer, fake_time: FakeTime) -> None:
    server.then(Reply(body={"unexpected": True}), Reply(body="<html>proxy hiccup</html>"))
    async with make_llm(server, fake_time) as llm:
        response = await llm.complete(chat())
        assert llm.stats.retries == {"bad_response": 2}
    assert response.text == "hello"


LLAMA_CPP_REFUSAL = "The model produced output that does not match the expected peg-native format"


async def test_an_answer_the_server_refuses_to_return_comes_back_once_as_a_rejected_answer(
    server: ScriptedServer, fake_time: FakeTime, tmp_path: Path
) -> None:
    # llama.cpp generated an answer and its own output parser refused it (HTTP 500). The same request gets
    # the same answer again, so the client hands back a text-less answer at once instead of re-sending it.
    server.then(error(500, LLAMA_CPP_REFUSAL))
    async with make_llm(server, fake_time, cache_dir=tmp_path, max_attempts=6) as llm:
        response = await llm.complete(chat(schema={"type": "object"}))
        stats = llm.stats
        assert llm.cache is not None and len(llm.cache) == 0  # never replayed as if it were an answer
    assert response.text == "" and response.finish_reason == REFUSED_BY_SERVER
    assert len(server.requests) == 1 and fake_time.sleeps == []
    assert stats.refused_answers == 1 and stats.retries == {}


async def test_exhausted_5xx_raises_unavailable(server: ScriptedServer, fake_time: FakeTime) -> None:
    server.default = error(503, "overloaded")
    async with make_llm(server, fake_time, max_attempts=3) as llm:
        with pytest.raises(LLMUnavailable) as caught:
            await llm.complete(chat())
        stats = llm.stats
    message = str(caught.value)
    assert "503" in message and "overloaded" in message and "3 attempts" in message
    assert not isinstance(caught.value, LLMRateLimited)
    assert len(server.requests) == 3
    assert len(fake_time.sleeps) == 2
    assert stats.failures == 1 and stats.successes == 0


async def test_exhausted_429_raises_rate_limited_with_last_hint(server: ScriptedServer, fake_time: FakeTime) -> None:
    server.then(error(429, "a", {"Retry-After": "1"}), error(429, "b", {"Retry-After": "2"}))
    async with make_llm(server, fake_time, max_attempts=2) as llm:
        with pytest.raises(LLMRateLimited) as caught:
            await llm.complete(chat())
    assert caught.value.retry_after_s == 2.0
    assert "429" in str(caught.value)
    assert fake_time.sleeps == [1.0]


async def test_last_failure_decides_the_error_type(server: ScriptedServer, fake_time: FakeTime) -> None:
    server.then(error(429, "limited"), error(500, "then broken"))
    async with make_llm(server, fake_time, max_attempts=2) as llm:
        with pytest.raises(LLMUnavailable) as caught:
            await llm.complete(chat())
    assert not isinstance(caught.value, LLMRateLimited)


async def test_connection_refused_is_retried_then_unavailable(fake_time: FakeTime) -> None:
    srv = ScriptedServer()
    await srv.start()
    base_url = srv.base_url
    await srv.stop()  # nothing listens on that port any more
    config = EndpointConfig(base_url=base_url, default_model="m", max_attempts=3, timeout_s=2)
    async with OpenAILLM(config, sleep=fake_time.sleep, clock=fake_time.clock, rng=random.Random(1)) as llm:
        with pytest.raises(LLMUnavailable) as caught:
            await llm.complete(chat())
        assert llm.stats.retries == {"connection": 2}
    assert "connection failed" in str(caught.value)


async def test_429_closes_the_gate_for_requests_about_to_start(server: ScriptedServer, fake_time: FakeTime) -> None:
    server.then(error(429, "limited", {"Retry-After": "2"}))
    fake_time.gate = asyncio.Event()
    async with make_llm(server, fake_time) as llm:
        first = asyncio.create_task(llm.complete(chat("first")))
        await fake_time.until_sleeps(1)  # first is backing off
        second = asyncio.create_task(llm.complete(chat("second")))
        await fake_time.until_sleeps(2)  # second waits for the gate instead of sending
        assert len(server.requests) == 1
        assert fake_time.sleeps == [2.0, 2.0]
        fake_time.gate.set()
        await asyncio.gather(first, second)
        assert llm.stats.cooldown_waits == 1
    assert len(server.requests) == 3


# ---------------------------------------------------------------------- fail fast, and never leak the key


async def test_401_fails_fast_and_never_leaks_the_key(
    server: ScriptedServer, fake_time: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server.default = error(401, f"Incorrect API key provided: {SECRET_KEY}.")
    async with make_llm(server, fake_time) as llm:
        with pytest.raises(LLMUnavailable) as caught:
            await llm.complete(chat())
        config_repr = repr(llm.config)
    message = str(caught.value)
    assert "401" in message and "rejected the API key" in message
    assert "[redacted]" in message
    assert "Incorrect API key provided" in message  # the server's message, redacted
    assert SECRET_KEY not in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert SECRET_KEY not in caplog.text
    assert SECRET_KEY not in config_repr
    assert len(server.requests) == 1 and fake_time.sleeps == []


@pytest.mark.parametrize(
    ("status", "expected"),
    [(400, "refused the request"), (403, "may not use model"), (404, "base_url"), (413, "refused")],
)
async def test_other_4xx_fail_fast(server: ScriptedServer, fake_time: FakeTime, status: int, expected: str) -> None:
    server.default = error(status, "server says no")
    async with make_llm(server, fake_time) as llm:
        with pytest.raises(LLMUnavailable) as caught:
            await llm.complete(chat())
    assert str(status) in str(caught.value) and "server says no" in str(caught.value)
    assert expected in str(caught.value)
    assert len(server.requests) == 1


# ---------------------------------------------------------------------- structured output


def rejects_json_schema(body: dict[str, Any]) -> Reply:
    if body.get("response_format", {}).get("type") == "json_schema":
        return error(400, "response_format type 'json_schema' is not supported by this server")
    return Reply(content='{"answer": "x", "score": 1}')


def fastapi_422_unless_plain_json_object(body: dict[str, Any]) -> Reply:
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "json_object"}:
        detail = [{"loc": ["body", "response_format"], "msg": "Input should be 'text' or 'json_object'"}]
        return Reply(status=422, body={"detail": detail})
    return Reply()


def rejects_any_response_format(body: dict[str, Any]) -> Reply:
    if "response_format" in body:
        return error(400, "unknown parameter: response_format")
    return Reply()


async def test_auto_falls_back_from_json_schema_to_json_object_schema(
    server: ScriptedServer, fake_time: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="combee.llm_openai")
    server.default = rejects_json_schema
    async with make_llm(server, fake_time) as llm:
        assert llm.stats.structured_mode == "json_schema"
        assert not llm.stats.structured_mode_settled
        first = await llm.complete(chat(schema=SCHEMA))
        second = await llm.complete(chat("again", schema=SCHEMA))
        stats = llm.stats

    assert first.text == second.text == '{"answer": "x", "score": 1}'
    formats = [body.get("response_format") for body in server.requests]
    assert formats == [
        {"type": "json_schema", "json_schema": {"name": "Answer", "schema": SCHEMA, "strict": True}},
        {"type": "json_object", "schema": SCHEMA},
        {"type": "json_object", "schema": SCHEMA},  # remembered: no second probe
    ]
    assert stats.structured_mode == "json_object_schema" and stats.structured_mode_settled
    assert stats.structured_fallbacks == 1
    assert stats.retries == {} and fake_time.sleeps == []
    settled = [record for record in caplog.records if "settled" in record.getMessage()]
    assert len(settled) == 1 and settled[0].levelno == logging.INFO
    assert "json_object_schema" in settled[0].getMessage()


async def test_concurrent_probes_fall_back_once(server: ScriptedServer, fake_time: FakeTime) -> None:
    server.default = rejects_json_schema
    async with make_llm(server, fake_time) as llm:
        answers = await asyncio.gather(*(llm.complete(chat(f"q{i}", schema=SCHEMA)) for i in range(6)))
        stats = llm.stats
    assert all(answer.text for answer in answers)
    probes = [body for body in server.requests if body["response_format"]["type"] == "json_schema"]
    assert len(probes) > 1  # several requests were in flight with the rejected mode
    assert stats.structured_fallbacks == 1  # the others just re-sent with the mode already moved to
    assert stats.structured_mode == "json_object_schema" and stats.structured_mode_settled
    assert stats.retries == {}


async def test_auto_falls_through_to_json_object_on_fastapi_422(server: ScriptedServer, fake_time: FakeTime) -> None:
    server.default = fastapi_422_unless_plain_json_object
    async with make_llm(server, fake_time) as llm:
        await llm.complete(chat(schema=SCHEMA))
        assert llm.stats.structured_mode == "json_object"
    assert [body["response_format"]["type"] for body in server.requests] == [
        "json_schema",
        "json_object",
        "json_object",
    ]
    assert server.requests[-1]["response_format"] == {"type": "json_object"}


async def test_auto_ends_at_none(server: ScriptedServer, fake_time: FakeTime) -> None:
    server.default = rejects_any_response_format
    async with make_llm(server, fake_time) as llm:
        await llm.complete(chat(schema=SCHEMA))
        assert llm.stats.structured_mode == "none"
        assert llm.stats.structured_fallbacks == 3
    assert len(server.requests) == 4
    assert "response_format" not in server.requests[-1]


async def test_settled_mode_does_not_fall_back_on_a_bad_schema(server: ScriptedServer, fake_time: FakeTime) -> None:
    async with make_llm(server, fake_time) as llm:
        await llm.complete(chat(schema=SCHEMA))  # json_schema works: settled
        server.then(error(400, "Invalid schema for response_format 'Answer': 'score' is not allowed"))
        with pytest.raises(LLMUnavailable, match="400") as caught:
            await llm.complete(chat(schema={"type": "object"}))
        assert "check this request's JSON schema" in str(caught.value)
        assert llm.stats.structured_mode == "json_schema"


async def test_400_unrelated_to_structured_output_does_not_fall_back(
    server: ScriptedServer, fake_time: FakeTime
) -> None:
    server.default = error(400, "context length exceeded")
    async with make_llm(server, fake_time) as llm:
        with pytest.raises(LLMUnavailable, match="context length exceeded"):
            await llm.complete(chat(schema=SCHEMA))
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (
            "json_schema",
            {"type": "json_schema", "json_schema": {"name": "Answer", "schema": SCHEMA, "strict": True}},
        ),
        ("json_object_schema", {"type": "json_object", "schema": SCHEMA}),
        ("json_object", {"type": "json_object"}),
        ("none", None),
    ],
)
async def test_explicit_modes_send_their_form_and_never_fall_back(
    server: ScriptedServer, fake_time: FakeTime, mode: str, expected: dict[str, Any] | None
) -> None:
    async with make_llm(server, fake_time, structured_output=mode) as llm:
        await llm.complete(chat(schema=SCHEMA))
        await llm.complete(chat())  # no schema: never a response_format
        assert llm.stats.structured_mode == mode and llm.stats.structured_mode_settled
    assert server.requests[0].get("response_format") == expected
    assert "response_format" not in server.requests[1]

    server.default = rejects_any_response_format
    if expected is not None:
        async with make_llm(server, fake_time, structured_output=mode) as llm:
            with pytest.raises(LLMUnavailable, match="response_format"):
                await llm.complete(chat(schema=SCHEMA))


async def test_schema_name_is_made_acceptable(server: ScriptedServer, fake_time: FakeTime) -> None:
    request = ChatRequest(
        role=Role.CURATOR,
        messages=(ChatMessage(role="user", content="x"),),
        schema_name="curator delta/v1",
        json_schema=SCHEMA,
    )
    async with make_llm(server, fake_time) as llm:
        await llm.complete(request)
    assert server.requests[0]["response_format"]["json_schema"]["name"] == "curator_delta_v1"


# ---------------------------------------------------------------------- concurrency


async def test_concurrency_limit_is_respected(server: ScriptedServer, fake_time: FakeTime) -> None:
    server.default = Reply(delay_s=0.05)
    async with make_llm(server, fake_time, max_concurrency=3) as llm:
        responses = await asyncio.gather(*(llm.complete(chat(f"q{i}")) for i in range(10)))
    assert len(responses) == 10
    assert server.max_in_flight == 3


# ---------------------------------------------------------------------- the response cache


async def test_cache_hit_avoids_http_and_survives_a_new_instance(
    server: ScriptedServer, fake_time: FakeTime, tmp_path: Path
) -> None:
    server.default = Reply(
        content="cached answer", headers={"x-combee-simulated": "true", "x-combee-service-time": "1.5"}
    )
    async with make_llm(server, fake_time, cache_dir=tmp_path) as llm:
        fresh = await llm.complete(chat(seed=1))
        again = await llm.complete(chat(seed=1))
        stats = llm.stats
    assert len(server.requests) == 1
    assert fresh.cached is False and fresh.service_time_s == 1.5
    assert again.cached is True and again.service_time_s is None
    assert again.text == "cached answer" and again.usage == fresh.usage and again.model == fresh.model
    assert again.simulated is True  # a replayed simulated answer stays labelled as simulated
    assert (stats.cache_hits, stats.cache_misses) == (1, 1)
    assert stats.cached_usage == fresh.usage
    assert stats.usage == fresh.usage  # only the HTTP answer is billed

    async with make_llm(server, fake_time, cache_dir=tmp_path) as other:
        replay = await other.complete(chat(seed=1))
    assert replay.cached is True and replay.text == "cached answer"
    assert len(server.requests) == 1


async def test_cache_is_keyed_by_the_exact_request(server: ScriptedServer, fake_time: FakeTime, tmp_path: Path) -> None:
    async with make_llm(server, fake_time, cache_dir=tmp_path, models={"curator": "curator-model"}) as llm:
        await llm.complete(chat(seed=1))
        variants = [
            chat(seed=2),
            chat(seed=None),
            chat(seed=1, temperature=0.5),
            chat(seed=1, max_tokens=7),
            chat("Say goodbye.", seed=1),
            chat(seed=1, schema=SCHEMA),
            chat(seed=1, role=Role.CURATOR),  # same messages, but sent to another model
        ]
        for request in variants:
            assert (await llm.complete(request)).cached is False
        # The role itself is not sent: a role without its own model shares the default model's answers.
        assert (await llm.complete(chat(seed=1, role=Role.MERGER))).cached is True
    assert len(server.requests) == 1 + len(variants)


async def test_cache_key_ignores_base_url_and_api_key(
    server: ScriptedServer, fake_time: FakeTime, tmp_path: Path
) -> None:
    async with make_llm(server, fake_time, cache_dir=tmp_path) as llm:
        await llm.complete(chat())
    other = ScriptedServer()
    await other.start()
    try:
        async with make_llm(other, fake_time, cache_dir=tmp_path, api_key="another-key") as llm:
            assert (await llm.complete(chat())).cached is True
        assert other.requests == []
    finally:
        await other.stop()


async def test_failed_responses_are_not_cached(server: ScriptedServer, fake_time: FakeTime, tmp_path: Path) -> None:
    server.then(error(500, "boom"), error(500, "boom"))
    async with make_llm(server, fake_time, cache_dir=tmp_path, max_attempts=2) as llm:
        with pytest.raises(LLMUnavailable):
            await llm.complete(chat())
        assert llm.cache is not None and len(llm.cache) == 0
        response = await llm.complete(chat())  # the server works again: a miss, over HTTP
        assert response.cached is False and len(llm.cache) == 1
    assert len(server.requests) == 3


async def test_a_broken_cache_never_fails_a_request(
    server: ScriptedServer, fake_time: FakeTime, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with make_llm(server, fake_time, cache_dir=tmp_path) as llm:
        assert llm.cache is not None
        llm.cache.close()  # every sqlite call now fails
        response = await llm.complete(chat())
        assert response.text == "hello" and response.cached is False
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any("lookup failed" in message for message in warnings)
    assert any("write failed" in message for message in warnings)


async def test_cache_hit_needs_no_concurrency_slot(server: ScriptedServer, fake_time: FakeTime, tmp_path: Path) -> None:
    async with make_llm(server, fake_time, cache_dir=tmp_path, max_concurrency=1) as llm:
        await llm.complete(chat("cached"))
        server.then(Reply(delay_s=10.0))  # holds the only slot until teardown releases it
        server.arrived.clear()
        blocker = asyncio.create_task(llm.complete(chat("slow")))
        await server.arrived.wait()
        hit = await asyncio.wait_for(llm.complete(chat("cached")), timeout=2)
        assert hit.cached is True
        server.release.set()
        await blocker


async def test_auto_mode_replay_hits_under_the_mode_learnt_earlier(
    server: ScriptedServer, fake_time: FakeTime, tmp_path: Path
) -> None:
    server.default = rejects_json_schema
    async with make_llm(server, fake_time, cache_dir=tmp_path) as llm:
        await llm.complete(chat(schema=SCHEMA))
    assert len(server.requests) == 2
    async with make_llm(server, fake_time, cache_dir=tmp_path) as fresh:  # has not learnt the mode yet
        replay = await fresh.complete(chat(schema=SCHEMA))
        assert replay.cached is True
    async with make_llm(server, fake_time, cache_dir=tmp_path, structured_output="json_schema") as strict:
        with pytest.raises(LLMUnavailable):  # json_schema was never answered: a miss, and a 400
            await strict.complete(chat(schema=SCHEMA))
