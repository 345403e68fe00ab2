"""Injected faults: the pure parts, then each fault kind through the server at roughly its configured rate."""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from typing import Any

import aiohttp
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from combee.llm import Role
from combee.llm_openai import EndpointConfig, OpenAILLM
from combee.meter import Meter
from combee.models import Playbook, Trace
from combee.roles import reflect
from combee.sim.config import SimConfig
from combee.sim.faults import FaultKind, Malformation, broken_json, draw_fault, malform, retry_after_headers
from combee.sim.generic import Answer, ToolCall
from combee.sim.inproc import InProcessSim
from combee.sim.runner import SimThread
from combee.sim.world import Behaviour, WorldResponder, generate_traces


class Verdict(BaseModel):
    label: str
    score: int


_SCHEMA = Verdict.model_json_schema()
_FORMAT = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": _SCHEMA}}


def test_fault_draws_follow_the_configured_rates() -> None:
    config = SimConfig(fault_500_rate=0.1, fault_429_rate=0.2, fault_timeout_rate=0.05, fault_malformed_rate=0.15)
    counts = Counter(draw_fault(config, random.Random(i)) for i in range(20_000))
    for kind, rate in (
        (FaultKind.HTTP_500, 0.1),
        (FaultKind.HTTP_429, 0.2),
        (FaultKind.TIMEOUT, 0.05),
        (FaultKind.MALFORMED, 0.15),
        (None, 0.5),
    ):
        assert counts[kind] / 20_000 == pytest.approx(rate, abs=0.015)


def test_fault_rates_must_form_a_distribution() -> None:
    with pytest.raises(ValueError, match="at most 1"):
        SimConfig(fault_500_rate=0.6, fault_malformed_rate=0.6)
    with pytest.raises(ValueError, match="not fault settings"):
        SimConfig().with_faults(seed=3)
    assert SimConfig().with_faults(outage=True).outage


def test_retry_after_is_scaled_like_every_delay() -> None:
    headers = retry_after_headers(SimConfig(retry_after_s=2.0, time_scale=0.01))
    assert headers == {"Retry-After": "1", "retry-after-ms": "20.000"}


@given(text=st.text(max_size=200), seed=st.integers(0, 2**32))
def test_broken_json_never_parses(text: str, seed: int) -> None:
    with pytest.raises(ValueError):
        json.loads(broken_json(text, random.Random(seed)))


@given(value=st.recursive(st.none() | st.integers() | st.text(), lambda c: st.lists(c) | st.dictionaries(st.text(), c)))
def test_broken_json_breaks_any_json_document(value: Any) -> None:
    text = json.dumps(value)
    with pytest.raises(ValueError):
        json.loads(broken_json(text, random.Random(len(text))))


def test_malformed_content_is_broken_or_violates_the_schema_about_half_and_half() -> None:
    answer = Answer(content='{"label": "ok", "score": 3}', schema=_SCHEMA, is_json=True)
    kinds: Counter[Malformation] = Counter()
    for seed in range(400):
        bad, how = malform(answer, random.Random(seed))
        kinds[how] += 1
        with pytest.raises((ValueError, ValidationError)):
            Verdict.model_validate_json(bad.content or "")
        if how is Malformation.SCHEMA_VIOLATION:
            json.loads(bad.content or "")  # valid JSON, wrong shape
    assert 140 < kinds[Malformation.SCHEMA_VIOLATION] < 260


def test_malformed_without_a_schema_changes_the_json_shape_or_breaks_it() -> None:
    answer = Answer(content='{"label": "ok"}', source="responder")
    for seed in range(50):
        bad, how = malform(answer, random.Random(seed))
        if how is Malformation.SCHEMA_VIOLATION:
            assert isinstance(json.loads(bad.content or ""), list)
        else:
            with pytest.raises(ValueError):
                json.loads(bad.content or "")


def test_malformed_tool_calls_break_the_arguments() -> None:
    answer = Answer(content=None, tool_calls=(ToolCall("c1", "f", '{"label": "x", "score": 1}'),), schema=_SCHEMA)
    bad, _ = malform(answer, random.Random(1))
    assert bad.tool_calls[0].name == "f"
    with pytest.raises((ValueError, ValidationError)):
        Verdict.model_validate_json(bad.tool_calls[0].arguments)


async def test_each_fault_kind_appears_at_about_its_rate() -> None:
    rates = {"fault_500_rate": 0.1, "fault_429_rate": 0.1, "fault_timeout_rate": 0.05, "fault_malformed_rate": 0.1}
    config = SimConfig(seed=5, time_scale=0.001, timeout_hang_s=5.0, **rates)  # a timeout hangs 5 ms, then 504
    n = 400
    statuses: Counter[int] = Counter()
    malformed = 0
    limit = asyncio.Semaphore(50)
    with SimThread(config) as server:
        async with aiohttp.ClientSession() as session:

            async def one(i: int) -> None:
                nonlocal malformed
                body = {
                    "model": "m",
                    "messages": [{"role": "user", "content": f"case {i}"}],
                    "response_format": _FORMAT,
                }
                async with limit, session.post(server.base_url + "/chat/completions", json=body) as r:
                    statuses[r.status] += 1
                    payload = await r.json()
                    if r.status == 429:
                        assert r.headers["Retry-After"] == "1" and r.headers["retry-after-ms"] == "1.000"
                    if r.status != 200:
                        assert payload["error"]["message"].startswith("simulated")
                        return
                    try:
                        Verdict.model_validate_json(payload["choices"][0]["message"]["content"])
                    except ValidationError:
                        malformed += 1

            await asyncio.gather(*(one(i) for i in range(n)))
        stats = server.stats()
    # Binomial(400, p) stays within these bounds with overwhelming probability (> 5 sigma).
    assert 12 <= statuses[500] <= 75
    assert 12 <= statuses[429] <= 75
    assert 2 <= statuses[504] <= 45
    assert 12 <= malformed <= 75
    assert statuses[200] + statuses[500] + statuses[429] + statuses[504] == n
    faults = stats["faults"]
    assert faults["http_500"] == statuses[500] and faults["http_429"] == statuses[429]
    assert faults["timeout"] == statuses[504] and faults["malformed"] == malformed
    assert faults["malformed_broken_json"] + faults["malformed_schema_violation"] == malformed
    assert faults["malformed_broken_json"] > 0 and faults["malformed_schema_violation"] > 0


async def test_a_retried_identical_request_can_succeed_and_gets_the_same_answer() -> None:
    with SimThread(SimConfig(time_scale=0.001, fault_500_rate=0.5)) as server:
        body = {"model": "m", "messages": [{"role": "user", "content": "retry me"}]}
        outcomes: list[tuple[int, str | None]] = []
        async with aiohttp.ClientSession() as session:
            for _ in range(30):
                async with session.post(server.base_url + "/chat/completions", json=body) as r:
                    payload = await r.json()
                    content = payload["choices"][0]["message"]["content"] if r.status == 200 else None
                    outcomes.append((r.status, content))
    assert {status for status, _ in outcomes} == {200, 500}
    assert len({content for status, content in outcomes if status == 200}) == 1


async def test_the_openai_client_honours_the_scaled_retry_after_and_gets_through() -> None:
    # (500s would work too, but the client backs off ≥ 0.5 s for them: too slow for a unit test.)
    config = SimConfig(time_scale=0.001, fault_429_rate=0.5)
    with SimThread(config) as server:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="sim", max_retries=10) as client:
            for i in range(10):
                completion = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": f"retry {i}"}]
                )
                assert completion.choices[0].message.content
        stats = server.stats()
    assert stats["by_status"]["200"] == 10 and stats["requests"] > 10


async def test_a_timeout_fault_looks_like_a_timeout_to_a_client_with_a_shorter_timeout() -> None:
    config = SimConfig(time_scale=0.01, fault_timeout_rate=1.0, timeout_hang_s=100.0)  # hangs 1 s, then 504
    with SimThread(config) as server:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="sim", max_retries=0, timeout=0.2) as client:
            with pytest.raises(openai.APITimeoutError):
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hang"}])
        server.set_faults(timeout_hang_s=2.0)  # now 20 ms: a patient client sees the 504
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="sim", max_retries=0, timeout=5) as client:
            with pytest.raises(openai.InternalServerError) as caught:
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hang"}])
        assert caught.value.status_code == 504


async def test_outage_toggled_through_the_admin_api_returns_503_then_recovers() -> None:
    with SimThread(SimConfig(time_scale=0.001)) as server:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="sim", max_retries=0) as client:
            messages: Any = [{"role": "user", "content": "are you up?"}]
            assert (await client.chat.completions.create(model="m", messages=messages)).choices
            assert server.set_faults(outage=True)["outage"] is True
            for _ in range(3):
                with pytest.raises(openai.InternalServerError) as caught:
                    await client.chat.completions.create(model="m", messages=messages)
                assert caught.value.status_code == 503
            assert server.set_faults(outage=False)["outage"] is False
            assert (await client.chat.completions.create(model="m", messages=messages)).choices
        stats = server.stats()
    assert stats["by_status"] == {"200": 2, "503": 3} and stats["faults"] == {"outage": 3}


async def test_a_replay_given_the_malformed_log_takes_the_same_repair_turns_and_ends_equal() -> None:
    """The fault suite's same-windows replay: the in-process simulator, given the server's log of malformed
    answers, gives the same malformed content, so the engine asks the same repair turns and parses the same."""
    traces = [Trace.model_validate(t) for t in generate_traces(12, seed=5, namespace="replay", test_n=1)[0]]
    playbook = Playbook(namespace="replay")
    responder = WorldResponder(Behaviour(seed=3))

    async def run(llm: Any) -> tuple[list[Any], list[int], Meter]:
        meter = Meter()
        outcomes = [await reflect(t, playbook, llm, meter=meter) for t in traces]
        return [o.value for o in outcomes], [o.attempts for o in outcomes], meter

    with SimThread(SimConfig(seed=3, time_scale=0.0, fault_malformed_rate=0.4), responder) as sim:
        endpoint = EndpointConfig(base_url=sim.base_url, default_model="combee-sim")
        async with OpenAILLM(endpoint) as client:
            live, live_attempts, live_meter = await run(client)
        log = sim.malformed_log()
        malformed = sim.stats()["faults"]["malformed"]
    stats = live_meter.role(Role.REFLECTOR)
    assert sum(len(c) for c in log.values()) == malformed == stats.parse_failures > 0
    assert stats.repairs > 0 and any(a > 1 for a in live_attempts)

    same = InProcessSim(responder, seed=3, time_scale=0.0, model="combee-sim", malformed=log)
    values, attempts, meter = await run(same)
    assert values == live and attempts == live_attempts
    again = meter.role(Role.REFLECTOR)
    assert (again.parse_failures, again.repairs, again.repaired, again.gave_up, again.failure_kinds) == (
        stats.parse_failures, stats.repairs, stats.repaired, stats.gave_up, stats.failure_kinds
    )  # fmt: skip

    # without the log every first answer parses: the log is what makes the two paths meet
    plain = InProcessSim(responder, seed=3, time_scale=0.0, model="combee-sim")
    assert (await run(plain))[1] == [1] * len(traces)
