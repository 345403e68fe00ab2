"""Requests → generic answers, for requests the world model does not recognise — schema-valid, seeded, cheap.

What a generic answer is (:func:`generic_answer`), in order of precedence:

* ``tools`` present and ``tool_choice`` not ``"none"``: one tool call (``finish_reason="tool_calls"``) whose
  ``arguments`` are a JSON instance valid for the chosen function's ``parameters`` schema. A named
  ``tool_choice`` picks that function; ``"required"`` picks one by rng; ``"auto"`` (or absent) calls a tool
  chosen by rng with probability :data:`AUTO_TOOL_CALL_P`, else answers as below.
* ``response_format`` ``{"type": "json_schema", "json_schema": {"schema": S}}`` or llama.cpp's
  ``{"type": "json_object", "schema": S}``: a JSON instance valid for ``S``.
* plain ``{"type": "json_object"}``: a small JSON object ``{"answer": <prose>, "confidence": <0..1>}``.
* otherwise: prose of an rng-drawn length (lognormal around 60 words, 8 to 400).

Everything is a pure function of the request and the rng, so the same request gets the same answer.

The schema keywords that generation supports: :mod:`combee.sim.generic.schemas`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from combee.sim.generic.answer import AUTO_TOOL_CALL_P, CHARS_PER_TOKEN, Answer, InvalidRequest, ToolCall
from combee.sim.generic.prose import prose
from combee.sim.generic.schemas import compiled_schema
from combee.sim.protocol import SimRequest
from combee.tokens import estimate_tokens

__all__ = ["chosen_tool", "generic_answer", "requested_schema", "tool_functions", "truncate_answer", "wants_json"]


def requested_schema(response_format: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The JSON schema a ``response_format`` asks for (OpenAI ``json_schema`` or llama.cpp ``json_object``
    + ``schema`` form), or None. Raises :class:`InvalidRequest` for a malformed ``response_format``."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping):
            raise InvalidRequest("response_format.json_schema must be an object", "response_format")
        schema = spec.get("schema")
    elif kind == "json_object":
        schema = response_format.get("schema")
    elif kind == "text":
        return None
    else:
        raise InvalidRequest(f"unsupported response_format type {kind!r}", "response_format")
    if schema is None:
        return None
    if not isinstance(schema, Mapping):
        raise InvalidRequest("the response_format schema must be an object", "response_format")
    return schema


def wants_json(response_format: Mapping[str, Any] | None) -> bool:
    """True when the request asks for JSON content (any ``json_object`` / ``json_schema`` format)."""
    return response_format is not None and response_format.get("type") in ("json_object", "json_schema")


def tool_functions(tools: Sequence[Mapping[str, Any]]) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidRequest("each tool must be {'type': 'function', 'function': {'name': ...}}", "tools")
        found.append((function["name"], function.get("parameters", {"type": "object", "properties": {}})))
    return found


def chosen_tool(functions: list[tuple[str, Any]], tool_choice: Any, rng: random.Random) -> tuple[str, Any] | None:
    if tool_choice is None or tool_choice == "auto":
        return rng.choice(functions) if rng.random() < AUTO_TOOL_CALL_P else None
    if tool_choice in ("required", "any"):
        return rng.choice(functions)
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else tool_choice.get("name")
        for candidate in functions:
            if candidate[0] == name:
                return candidate
        raise InvalidRequest(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
    raise InvalidRequest(f"unsupported tool_choice {tool_choice!r}", "tool_choice")


def generic_answer(request: SimRequest, rng: random.Random) -> Answer:
    """The answer for a request no world model recognised (see the module docstring for the rules).

    Raises :class:`InvalidRequest` (incl. :class:`SchemaError`) for requests a real server would reject.
    """
    schema = requested_schema(request.response_format)
    if request.tools and request.tool_choice != "none":
        chosen = chosen_tool(tool_functions(request.tools), request.tool_choice, rng)
        if chosen is not None:
            name, parameters = chosen
            arguments = json.dumps(compiled_schema(parameters).generate(rng), ensure_ascii=False)
            call = ToolCall(id=f"call_{rng.getrandbits(96):024x}", name=name, arguments=arguments)
            return Answer(
                content=None,
                tool_calls=(call,),
                finish_reason="tool_calls",
                schema=parameters if isinstance(parameters, Mapping) else None,
                is_json=True,
            )
    if schema is not None:
        instance = compiled_schema(schema).generate(rng)
        return Answer(content=json.dumps(instance, ensure_ascii=False), schema=schema, is_json=True)
    if wants_json(request.response_format):
        small = {"answer": prose(rng, rng.randint(5, 20)), "confidence": round(rng.random(), 2)}
        return Answer(content=json.dumps(small, ensure_ascii=False), is_json=True)
    return Answer(content=prose(rng))


def truncate_answer(answer: Answer, max_tokens: int | None) -> Answer:
    """Cut the completion to ``max_tokens`` (by the :func:`combee.tokens.estimate_tokens` measure) and mark
    ``finish_reason="length"`` if it was longer; otherwise return ``answer`` unchanged.

    Truncated structured output is broken JSON on purpose: that is what a real server sends when a
    generation hits the token limit, and clients must treat it as malformed.
    """
    if max_tokens is None:
        return answer
    limit = max_tokens * CHARS_PER_TOKEN
    if answer.tool_calls:
        if estimate_tokens(answer.completion_text) <= max_tokens:
            return answer
        calls: list[ToolCall] = []
        budget = limit
        for call in answer.tool_calls:
            calls.append(replace(call, arguments=call.arguments[: max(0, budget)]))
            budget -= len(call.arguments)
        return replace(answer, tool_calls=tuple(calls), finish_reason="length")
    content = answer.content or ""
    if estimate_tokens(content) <= max_tokens:
        return answer
    return replace(answer, content=content[:limit], finish_reason="length")
