"""OpenAILLM's endpoint awareness: the context window asked of the server, reasoning models' parameters."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from combee.llm import ChatMessage, ChatRequest, Role, context_tokens_of
from combee.llm_openai import (
    EndpointConfig,
    OpenAILLM,
    context_from_models,
    context_from_props,
    is_reasoning_model,
)

LLAMA_MODELS = {"data": [{"id": "local", "meta": {"n_ctx": 8192, "n_ctx_train": 32768}}]}


class Server:
    """Serves /props, /v1/models and /v1/chat/completions from the given bodies (None: 404)."""

    def __init__(self, props: Any = None, models: Any = None) -> None:
        self.props, self.models = props, models
        self.chats: list[dict[str, Any]] = []
        self.hits: list[str] = []
        self.base_url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/props", self._props)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.base_url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"

    async def _props(self, request: web.Request) -> web.Response:
        return await self._json(request, self.props)

    async def _models(self, request: web.Request) -> web.Response:
        return await self._json(request, self.models)

    async def _json(self, request: web.Request, body: Any) -> web.Response:
        self.hits.append(request.path)
        if body is None:
            return web.json_response({"error": {"message": "File Not Found"}}, status=404)
        return web.json_response(body)

    async def _chat(self, request: web.Request) -> web.Response:
        self.chats.append(await request.json())
        choice = {"index": 0, "message": {"role": "assistant", "content": "{}"}, "finish_reason": "length"}
        return web.json_response(
            {"model": "m", "choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
        )

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def make_server() -> AsyncIterator[Any]:
    servers: list[Server] = []

    async def make(**bodies: Any) -> Server:
        srv = Server(**bodies)
        await srv.start()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        await srv.stop()


def llm_for(server: Server, **overrides: Any) -> OpenAILLM:
    config: dict[str, Any] = {"base_url": server.base_url, "default_model": "local", "timeout_s": 5.0}
    config.update(overrides)
    return OpenAILLM(EndpointConfig(**config))


def test_context_readers() -> None:
    assert context_from_props({"default_generation_settings": {"n_ctx": 4096}}) == 4096
    assert context_from_props({"default_generation_settings": {"n_ctx": 0}}) is None
    assert context_from_props([]) is None
    assert context_from_models({"data": [{"id": "m", "max_model_len": 16384}]}, "m") == 16384  # vLLM
    assert context_from_models(LLAMA_MODELS, "local") == 8192  # the running context, not n_ctx_train
    assert context_from_models({"data": [{"id": "a", "max_model_len": 1}, {"id": "b"}]}, "b") is None
    assert context_from_models({"data": [{"id": "x", "meta": {"n_ctx_train": 32768}}]}, "y") is None


async def test_llama_cpp_props_give_the_per_slot_context(make_server: Any) -> None:
    srv = await make_server(props={"default_generation_settings": {"n_ctx": 4096}}, models=LLAMA_MODELS)
    llm = llm_for(srv)
    try:
        assert await context_tokens_of(llm, Role.REFLECTOR) == 4096
        assert await llm.context_tokens(Role.CURATOR) == 4096
        assert srv.hits == ["/props"]  # asked once per model
    finally:
        await llm.aclose()


async def test_models_then_the_setting_when_the_server_says_nothing(make_server: Any) -> None:
    vllm = await make_server(models={"data": [{"id": "local", "max_model_len": 12000}]})
    silent = await make_server()
    a, b = llm_for(vllm), llm_for(silent, context_tokens=2048)
    try:
        assert await a.context_tokens(Role.MERGER) == 12000
        assert await b.context_tokens(Role.MERGER) == 2048
    finally:
        await a.aclose()
        await b.aclose()


@pytest.mark.parametrize(
    "name, reasoning",
    [
        *[("o1", True), ("o3-mini", True), ("o4-mini-2025-04-16", True), ("gpt-5", True), ("gpt-5.1", True)],
        *[("openai/gpt-5-mini", True), ("gpt-4o", False), ("local", False), ("foo1", False), ("gpt-50x", False)],
    ],
)
def test_reasoning_models_by_name(name: str, reasoning: bool) -> None:
    assert is_reasoning_model(name) is reasoning
    assert is_reasoning_model(name, "") is False


async def test_reasoning_models_get_max_completion_tokens_and_no_temperature(make_server: Any) -> None:
    srv = await make_server()
    llm = llm_for(srv, models={Role.CURATOR: "o3-mini"}, structured_output="none")
    request = ChatRequest(role=Role.CURATOR, messages=(ChatMessage(role="user", content="hi"),), max_tokens=99)
    try:
        answer = await llm.complete(request)
        await llm.complete(request.model_copy(update={"role": Role.REFLECTOR, "temperature": 0.3}))
    finally:
        await llm.aclose()
    reasoning, plain = srv.chats
    assert reasoning["max_completion_tokens"] == 99 and "max_tokens" not in reasoning and "temperature" not in reasoning
    assert plain["max_tokens"] == 99 and plain["temperature"] == 0.3 and "max_completion_tokens" not in plain
    assert answer.finish_reason == "length"


async def test_roles_can_have_their_own_endpoint(make_server: Any) -> None:
    from combee.llm_openai import RoleRouter
    from combee.settings import Settings
    from combee.wiring import build_llm

    small = await make_server(props={"default_generation_settings": {"n_ctx": 4096}})
    large = await make_server(props={"default_generation_settings": {"n_ctx": 65536}})
    assert isinstance(build_llm(Settings(openai_base_url=small.base_url, model="local")), OpenAILLM)
    llm = build_llm(Settings(openai_base_url=small.base_url, base_url_curator=large.base_url, model="local"))
    assert isinstance(llm, RoleRouter)
    request = ChatRequest(role=Role.CURATOR, messages=(ChatMessage(role="user", content="hi"),))
    try:
        assert await llm.context_tokens(Role.REFLECTOR) == 4096 and await llm.context_tokens(Role.CURATOR) == 65536
        await llm.complete(request)
        await llm.complete(request.model_copy(update={"role": Role.MERGER}))
        assert (len(small.chats), len(large.chats)) == (1, 1)
        assert llm.stats.requests == 2 and llm.stats.usage.prompt_tokens == 6
    finally:
        await llm.aclose()
