"""OpenAILLM gives the same answers over both HTTP transports the benchmark relies on (in-thread simulator)."""

from __future__ import annotations

import pytest

from combee.errors import ConfigError
from combee.llm import ChatRequest
from combee.llm_openai import EndpointConfig, OpenAILLM
from combee.llm_openai.transport import http_client
from combee.models import Playbook, Trace
from combee.prompts import generator_request, reflector_request
from combee.sim.config import SimConfig
from combee.sim.inproc import InProcessSim
from combee.sim.runner import SimThread
from combee.sim.world import Behaviour, WorldResponder, generate_traces


def _requests() -> list[ChatRequest]:
    """A reflector call and a generator call the world model recognises."""
    traces, tests, _ = generate_traces(2, seed=5, namespace="bench", test_n=1)
    trace = Trace.model_validate(traces[0])
    playbook = Playbook(namespace="bench")
    return [reflector_request(trace, playbook), generator_request(tests[0].task, playbook)]


@pytest.mark.parametrize("transport", ["httpx", "aiohttp"])
async def test_both_transports_match_the_in_process_simulator(transport: str) -> None:
    responder = WorldResponder(Behaviour(seed=3))
    reference = InProcessSim(responder, seed=3, time_scale=0.0)
    with SimThread(SimConfig(seed=3, time_scale=0.0), responder) as sim:
        config = EndpointConfig(base_url=sim.base_url, default_model="combee-sim", http_transport=transport)
        async with OpenAILLM(config) as llm:
            for request in _requests():
                got = await llm.complete(request)
                want = await reference.complete(request)
                assert got.text == want.text
                assert got.usage == want.usage
                assert got.simulated and got.service_time_s == 0.0


async def test_connection_refused_is_a_connection_failure_on_aiohttp() -> None:
    with SimThread(SimConfig()) as sim:
        url = sim.base_url
    config = EndpointConfig(base_url=url, default_model="m", max_attempts=2, backoff_base_s=0.01,
                            backoff_max_s=0.02, http_transport="aiohttp")  # fmt: skip
    async with OpenAILLM(config) as llm:
        with pytest.raises(Exception, match="connection failed"):
            await llm.complete(_requests()[0])
        assert llm.stats.retries == {"connection": 1}


def test_httpx_transport_uses_the_clients_default() -> None:
    assert http_client("httpx", 10.0) is None


def test_missing_aiohttp_support_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import openai

    monkeypatch.delattr(openai, "DefaultAioHttpClient", raising=False)
    assert http_client("auto", 10.0) is None
    with pytest.raises(ConfigError):
        http_client("aiohttp", 10.0)
