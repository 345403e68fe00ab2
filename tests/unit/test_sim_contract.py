"""The simulator honours each request's contract before its world model (issue 12, item 7).

Requests here are shaped like another prompt learner's, not Combee's: a curator prompt that happens to hold a
``<reflections>`` block (which Combee's world model recognises) but forces a tool call, or asks for a JSON schema
of its own. A faithful OpenAI-compatible stand-in must answer within what the request demands.
"""

from __future__ import annotations

import json
import random
from typing import Any

import aiohttp

from combee.sim.config import SimConfig
from combee.sim.generic import conforms, within_contract
from combee.sim.protocol import SimRequest
from combee.sim.runner import SimThread
from combee.sim.world import Behaviour, WorldResponder

FAST = SimConfig(time_scale=0.0, seed=5)

_OTHER_CURATOR_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reasoning": {"type": "string"},
        "operations": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": ["ADD"]},
                    "section": {"type": "string"},
                    "content": {"type": "string"},
                },
                "required": ["type", "section", "content"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["reasoning", "operations"],
    "additionalProperties": False,
}

_REFLECTIONS = "\n".join(
    json.dumps({"insights": [{"section": "formulas", "content": f"Apply rule FX-00{i:02d} to margins."}]})
    for i in range(6)
)
_OTHER_CURATOR_PROMPT = (
    "You maintain a playbook. Read the reflections and decide what to add.\n\n"
    f"<reflections>\n{_REFLECTIONS}\n</reflections>\n\nCall the tool with your operations."
)


def _body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "some-model",
        "messages": [
            {"role": "system", "content": "You are a careful curator."},
            {"role": "user", "content": _OTHER_CURATOR_PROMPT},
        ],
        **extra,
    }


async def _post(url: str, body: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(url + "/chat/completions", json=body) as r:
        return r.status, await r.json(content_type=None)


def _world() -> WorldResponder:
    return WorldResponder(Behaviour(seed=FAST.seed))


async def test_a_forced_tool_call_gets_a_tool_call_even_when_the_world_model_recognises_the_prompt() -> None:
    tools = [{"type": "function", "function": {"name": "curate", "parameters": _OTHER_CURATOR_PARAMS}}]
    with SimThread(FAST, _world()) as server:
        outcomes = []
        for choice in ("required", {"type": "function", "function": {"name": "curate"}}):
            status, doc = await _post(server.base_url, _body(tools=tools, tool_choice=choice))
            outcomes.append((status, doc))
        stats = server.stats()
    for status, doc in outcomes:
        assert status == 200
        choice = doc["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        call = choice["message"]["tool_calls"][0]
        assert call["function"]["name"] == "curate"
        assert conforms(json.loads(call["function"]["arguments"]), _OTHER_CURATOR_PARAMS)
    assert stats["answered_by"].get("contract_over_world") == 2


async def test_another_clients_json_schema_is_honoured_over_the_world_model() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "curation", "schema": _OTHER_CURATOR_PARAMS, "strict": True}}
    with SimThread(FAST, _world()) as server:
        status, doc = await _post(server.base_url, _body(response_format=fmt))
        status_obj, doc_obj = await _post(server.base_url, _body(response_format={"type": "json_object"}))
    assert status == 200
    assert conforms(json.loads(doc["choices"][0]["message"]["content"]), _OTHER_CURATOR_PARAMS)
    # json_object without a schema: the world model's JSON object is a valid answer, so it stands
    assert status_obj == 200 and isinstance(json.loads(doc_obj["choices"][0]["message"]["content"]), dict)


def test_the_world_models_answer_stands_when_it_fits_the_contract() -> None:
    schema = {
        "type": "object",
        "properties": {"operations": {"type": "array", "items": {"type": "object"}}},
        "required": ["operations"],
    }
    request = SimRequest(
        model="m",
        messages=_body()["messages"],
        response_format={"type": "json_schema", "json_schema": {"name": "ops", "schema": schema}},
    )
    said = _world().respond(request, random.Random(1))
    assert said is not None and "operations" in json.loads(said)
    answer = within_contract(request, said, random.Random(1))
    assert answer is not None and answer.content == said and answer.source == "responder"
    # the same answer under a forced tool whose parameters it fits becomes that tool's call
    forced = SimRequest(
        model="m",
        messages=request.messages,
        tools=[{"type": "function", "function": {"name": "ops", "parameters": schema}}],
        tool_choice="required",
    )
    as_call = within_contract(forced, said, random.Random(1))
    assert as_call is not None and as_call.tool_calls[0].name == "ops" and as_call.tool_calls[0].arguments == said


def test_conforms_checks_the_shape_keywords() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
        "required": ["a"],
        "additionalProperties": False,
        "$defs": {"x": {"enum": [1, 2]}},
    }
    assert conforms({"a": 1, "b": None}, schema)
    assert not conforms({"a": 1.5}, schema)
    assert not conforms({"a": True}, schema)
    assert not conforms({"b": "x"}, schema)
    assert not conforms({"a": 1, "c": 2}, schema)
    assert conforms(2, {"$ref": "#/$defs/x", "$defs": {"x": {"enum": [1, 2]}}})
    assert not conforms(3, {"$ref": "#/$defs/x", "$defs": {"x": {"enum": [1, 2]}}})
    assert not conforms([1, 2, 3], {"type": "array", "maxItems": 2})
