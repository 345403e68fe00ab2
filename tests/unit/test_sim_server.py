"""The simulator's HTTP server: wire format, determinism, latency headers, queueing, streaming, admin API."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import openai
import pytest

from combee.sim.config import SimConfig
from combee.sim.protocol import SimRequest
from combee.sim.runner import SimThread
from combee.sim.server import STATE_KEY, build_app, start_site
from combee.sim.state import FifoSlots
from combee.sim.wire import PER_MESSAGE_TOKENS
from combee.tokens import estimate_tokens

FAST = SimConfig(time_scale=0.001, seed=3)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimThread]:
    with SimThread(FAST) as server:
        yield server


def _client(base_url: str, **kw: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="sim", max_retries=0, **kw)


async def _post(url: str, body: Any) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as session, session.post(url + "/chat/completions", json=body) as r:
        return r.status, dict(r.headers), await r.json(content_type=None)


_MESSAGES: Any = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is the total revenue in the ledger?"},
]


async def test_the_openai_client_gets_a_well_formed_labelled_completion(sim: SimThread) -> None:
    async with _client(sim.base_url) as client:
        raw = await client.chat.completions.with_raw_response.create(model="whatever-model", messages=_MESSAGES)
        completion = raw.parse()
    assert raw.headers["x-combee-simulated"] == "true"
    assert float(raw.headers["x-combee-service-time"]) > 0
    assert "x-combee-queue-time" in raw.headers  # its value: test_requests_beyond_max_concurrency_queue_in_fifo_order
    assert completion.object == "chat.completion" and completion.id.startswith("chatcmpl-")
    assert completion.model == "whatever-model"  # any model name is accepted and echoed
    assert completion.system_fingerprint == "combee-sim"
    choice = completion.choices[0]
    assert choice.index == 0 and choice.finish_reason == "stop"
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.message.tool_calls is None
    usage = completion.usage
    assert usage is not None
    expected_prompt = sum(estimate_tokens(m["content"]) + PER_MESSAGE_TOKENS for m in _MESSAGES)
    assert usage.prompt_tokens == expected_prompt
    assert usage.completion_tokens == estimate_tokens(choice.message.content)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


async def test_models_are_listed_and_labelled(sim: SimThread) -> None:
    async with _client(sim.base_url) as client:
        models = [m.id async for m in client.models.list()]
    assert models == list(FAST.models)
    async with aiohttp.ClientSession() as session, session.get(sim.base_url + "/models") as r:
        assert r.headers["x-combee-simulated"] == "true"
        assert "simulated" in (await r.json())["data"][0]["owned_by"]


async def test_same_request_same_content_whatever_the_order_and_transport_fields() -> None:
    bodies = [{"model": "m", "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(5)]

    async def contents(order: list[int], extra: dict[str, Any]) -> dict[int, tuple[str, str]]:
        with SimThread(FAST) as server:
            out: dict[int, tuple[str, str]] = {}
            for i in order:
                _, headers, payload = await _post(server.base_url, {**bodies[i], **extra})
                out[i] = (payload["choices"][0]["message"]["content"], headers["x-combee-service-time"])
            return out

    forward = await contents([0, 1, 2, 3, 4], {})
    backward = await contents([4, 3, 2, 1, 0], {"user": "someone-else"})
    assert forward == backward
    assert len({content for content, _ in forward.values()}) == 5  # different requests differ
    with SimThread(FAST.model_copy(update={"seed": 4})) as other_seed:
        _, _, payload = await _post(other_seed.base_url, bodies[0])
    assert payload["choices"][0]["message"]["content"] != forward[0][0]


async def test_streaming_with_the_openai_client_matches_the_plain_answer(sim: SimThread) -> None:
    async with _client(sim.base_url) as client:
        plain = await client.chat.completions.create(model="m", messages=_MESSAGES)
        stream = await client.chat.completions.create(
            model="m",
            messages=_MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces: list[str] = []
        finish: str | None = None
        usage = None
        async for chunk in stream:
            assert chunk.object == "chat.completion.chunk" and chunk.system_fingerprint == "combee-sim"
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
    assert "".join(pieces) == plain.choices[0].message.content
    assert len(pieces) > 2 and finish == "stop"
    assert usage is not None and usage == plain.usage


async def test_streamed_tool_calls_assemble(sim: SimThread) -> None:
    tools: Any = [
        {
            "type": "function",
            "function": {
                "name": "record",
                "parameters": {
                    "type": "object",
                    "properties": {"amount": {"type": "number"}, "note": {"type": "string", "minLength": 20}},
                    "required": ["amount", "note"],
                },
            },
        }
    ]
    async with _client(sim.base_url) as client:
        stream = await client.chat.completions.create(
            model="m",
            messages=_MESSAGES,
            tools=tools,
            tool_choice="required",
            stream=True,
        )
        name, arguments, finish = "", "", None
        async for chunk in stream:
            assert chunk.usage is None
            delta = chunk.choices[0].delta
            for call in delta.tool_calls or []:
                name += (call.function.name or "") if call.function else ""
                arguments += (call.function.arguments or "") if call.function else ""
            finish = chunk.choices[0].finish_reason or finish
    assert name == "record" and finish == "tool_calls"
    args = json.loads(arguments)
    assert isinstance(args["amount"], int | float) and len(args["note"]) >= 20


async def test_streaming_spends_the_first_token_time_before_the_first_delta() -> None:
    config = SimConfig(time_scale=0.25, jitter_sigma=0.0, prefill_s_per_token=0.0, decode_tokens_per_s=200.0)
    with SimThread(config) as server:
        async with aiohttp.ClientSession() as session:
            began = time.perf_counter()
            body = {"model": "m", "messages": _MESSAGES, "stream": True}
            async with session.post(server.base_url + "/chat/completions", json=body) as r:
                service = float(r.headers["x-combee-service-time"])
                first = await r.content.readline()
                first_at = time.perf_counter() - began
                rest = await r.read()
                done_at = time.perf_counter() - began
    assert first.startswith(b"data: ")
    assert rest.rstrip().endswith(b"data: [DONE]")
    assert first_at >= 0.1 * 0.95  # ttft 0.4 s × 0.25
    assert done_at >= service * 0.95


async def test_service_time_header_follows_the_latency_model() -> None:
    config = SimConfig(time_scale=0.01, jitter_sigma=0.0, ttft_s=0.5, prefill_s_per_token=0.001, decode_tokens_per_s=50)
    with SimThread(config) as server:
        async with _client(server.base_url) as client:
            for i in range(5):
                messages: Any = [{"role": "user", "content": "word " * (20 * i + 1)}]
                began = time.perf_counter()
                raw = await client.chat.completions.with_raw_response.create(model="m", messages=messages)
                elapsed = time.perf_counter() - began
                usage = raw.parse().usage
                assert usage is not None
                # prefix caching: the prompts share their start, and cached tokens are not prefilled again
                details = usage.prompt_tokens_details
                cached = details.cached_tokens or 0 if details is not None else 0
                assert cached == 0 or i > 0
                expected = (0.5 + (usage.prompt_tokens - cached) * 0.001 + usage.completion_tokens / 50) * 0.01
                service = float(raw.headers["x-combee-service-time"])
                assert service == pytest.approx(expected, rel=1e-9)
                assert elapsed >= service * 0.95


async def test_jittered_service_time_is_the_same_for_the_same_request() -> None:
    config = SimConfig(time_scale=0.001, jitter_sigma=0.5)
    body = {"model": "m", "messages": [{"role": "user", "content": "same"}]}
    with SimThread(config) as server:
        times = {(await _post(server.base_url, body))[1]["x-combee-service-time"] for _ in range(4)}
        other = (await _post(server.base_url, {**body, "temperature": 0.3}))[1]["x-combee-service-time"]
    assert len(times) == 1 and other not in times


async def _until(cond: Callable[[], bool], what: str) -> None:
    """Wait (event loop running) until ``cond()`` holds; fail naming ``what`` if it never does."""
    for _ in range(3000):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never saw {what}")


async def test_requests_beyond_max_concurrency_queue_in_fifo_order() -> None:
    # The test holds both slots, so every request queues, and sends the next only once the last is queued: the
    # arrival order is certain and no clock is read. Service time 0.2 s (ttft 0.4 s × time_scale 0.5).
    config = SimConfig(
        time_scale=0.5, jitter_sigma=0.0, prefill_s_per_token=0.0, decode_tokens_per_s=1e9, max_concurrency=2
    )
    app = build_app(config)
    state = app[STATE_KEY]
    runner, port = await start_site(app)
    try:
        await state.slots.acquire()
        await state.slots.acquire()
        finished: list[int] = []
        tasks = []
        for i in range(4):
            body = {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}
            tasks.append(asyncio.create_task(_post(f"http://127.0.0.1:{port}/v1", body)))
            tasks[-1].add_done_callback(lambda _, i=i: finished.append(i))
            await _until(lambda i=i: state.slots.waiting == i + 1, f"request {i} queued")
        held = state.stats()
        assert (held["queued"], held["busy_slots"], held["requests"], finished) == (4, 2, 4, [])
        state.slots.release()  # one slot for four requests: served one at a time, in the order they came
        results = await asyncio.gather(*tasks)
        state.slots.release()
        stats = state.stats()
    finally:
        await runner.cleanup()
    assert finished == [0, 1, 2, 3]
    assert [float(h["x-combee-service-time"]) for _, h, _ in results] == [pytest.approx(0.2, abs=1e-5)] * 4
    assert stats["queue_s_total"] == pytest.approx(sum(float(h["x-combee-queue-time"]) for _, h, _ in results))
    assert stats["by_status"] == {"200": 4}
    assert stats["busy_slots"] == 0 and stats["queued"] == 0 and stats["in_flight"] == 0


async def test_fifo_slots_grant_in_arrival_order_and_survive_cancellation() -> None:
    slots = FifoSlots(1)
    await slots.acquire()
    order: list[int] = []

    async def waiter(i: int) -> None:
        await slots.acquire()
        order.append(i)
        await asyncio.sleep(0)
        slots.release()

    tasks = [asyncio.create_task(waiter(i)) for i in range(5)]
    await asyncio.sleep(0)
    assert slots.waiting == 5
    tasks[2].cancel()
    slots.release()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert order == [0, 1, 3, 4]
    assert slots.busy == 0 and slots.waiting == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": _MESSAGES, "n": 2}, "n"),
        ({"model": "m", "messages": []}, "messages"),
        ({"messages": _MESSAGES}, "model"),
        ({"model": "m", "messages": _MESSAGES, "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "messages": _MESSAGES, "response_format": {"type": "yaml"}}, "response_format"),
        ({"model": "m", "messages": _MESSAGES, "tools": [{"type": "function"}]}, "tools"),
    ],
)
async def test_invalid_requests_get_a_clean_400(sim: SimThread, body: dict[str, Any], param: str) -> None:
    status, headers, payload = await _post(sim.base_url, body)
    assert status == 400 and headers["x-combee-simulated"] == "true"
    assert payload["error"]["type"] == "invalid_request_error" and payload["error"]["param"] == param


async def test_n_above_one_is_a_bad_request_for_the_openai_client(sim: SimThread) -> None:
    async with _client(sim.base_url) as client:
        with pytest.raises(openai.BadRequestError, match="n = 1"):
            await client.chat.completions.create(model="m", messages=_MESSAGES, n=2)


async def test_a_body_that_is_not_json_is_a_400(sim: SimThread) -> None:
    async with aiohttp.ClientSession() as session, session.post(sim.base_url + "/chat/completions", data=b"{") as r:
        assert r.status == 400


class _EchoResponder:
    """Recognises prompts starting with 'ECHO'; answers with the text and one rng draw."""

    def __init__(self) -> None:
        self.seen: list[SimRequest] = []

    def respond(self, request: SimRequest, rng: random.Random) -> str | None:
        self.seen.append(request)
        user = request.text_of("user")
        if user.startswith("BOOM"):
            raise RuntimeError("world model bug")
        if not user.startswith("ECHO"):
            return None
        return json.dumps({"echo": user, "draw": rng.random()})


async def test_the_responder_answers_what_it_recognises_and_generic_the_rest() -> None:
    responder = _EchoResponder()
    with SimThread(FAST, responder) as server:
        echo = {"model": "m", "messages": [{"role": "user", "content": "ECHO hi"}], "max_tokens": 500, "seed": 9}
        first = (await _post(server.base_url, echo))[2]["choices"][0]["message"]["content"]
        again = (await _post(server.base_url, {**echo, "stream": False}))[2]["choices"][0]["message"]["content"]
        other = (await _post(server.base_url, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}))[2]
        status, _, boom = await _post(
            server.base_url, {"model": "m", "messages": [{"role": "user", "content": "BOOM"}]}
        )
        stats = server.stats()
    assert json.loads(first)["echo"] == "ECHO hi" and first == again
    assert "echo" not in other["choices"][0]["message"]["content"]
    assert status == 500 and "world model bug" in boom["error"]["message"]
    assert stats["answered_by"] == {"responder": 2, "generic": 1}
    assert stats["faults"] == {"responder_error": 1}
    seen = responder.seen[0]
    assert seen.model == "m" and seen.max_tokens == 500 and seen.seed == 9


async def test_admin_config_faults_and_stats(sim: SimThread) -> None:
    config = sim.config()
    assert config["seed"] == FAST.seed and config["time_scale"] == FAST.time_scale
    before = sim.reset_stats()
    assert before["requests"] == 0 and before["simulated"] is True
    await _post(sim.base_url, {"model": "m", "messages": _MESSAGES})
    stats = sim.stats()
    assert stats["requests"] == 1 and stats["by_status"] == {"200": 1}
    assert stats["prompt_tokens"] > 0 and stats["completion_tokens"] > 0
    assert stats["service_s_total"] > 0 and stats["cpu_s"] > 0
    async with aiohttp.ClientSession() as session:
        admin = sim.root_url + "/admin/faults"
        async with session.post(admin, json={"ttft_s": 9}) as r:
            assert r.status == 400 and "not fault settings" in (await r.json())["error"]["message"]
        async with session.post(admin, json={"fault_500_rate": 0.7, "fault_429_rate": 0.7}) as r:
            assert r.status == 400
        async with session.post(admin, json={"fault_500_rate": 1.5}) as r:
            assert r.status == 400
        async with session.get(admin) as r:
            assert (await r.json())["fault_500_rate"] == 0.0
    assert sim.set_faults(retry_after_s=2.0)["retry_after_s"] == 2.0
    assert sim.set_faults(retry_after_s=1.0)["retry_after_s"] == 1.0


async def test_time_scale_zero_answers_without_waiting() -> None:
    with SimThread(SimConfig(time_scale=0.0)) as server:
        began = time.perf_counter()
        results = await asyncio.gather(
            *(
                _post(server.base_url, {"model": "m", "messages": [{"role": "user", "content": str(i)}]})
                for i in range(50)
            )
        )
        elapsed = time.perf_counter() - began
    assert all(status == 200 and float(headers["x-combee-service-time"]) == 0.0 for status, headers, _ in results)
    assert elapsed < 5
