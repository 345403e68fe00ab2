"""The request's contract, before any world model: whether an answer keeps to what the request asked for."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

from combee.sim.generic.answer import Answer, SchemaError, ToolCall
from combee.sim.generic.respond import chosen_tool, requested_schema, tool_functions, wants_json
from combee.sim.generic.schemas import SchemaCompiler, declared_types, int_or_none
from combee.sim.protocol import SimRequest

__all__ = ["conforms", "forced_tool", "within_contract"]


_PY_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "null": (type(None),),
    "integer": (int,),
    "number": (int, float),
}


def conforms(value: Any, schema: Any, root: Any = None, depth: int = 0) -> bool:
    """Whether ``value`` satisfies ``schema`` on the keywords that decide an answer's *shape*.

    Checked: ``type``, ``enum``, ``const``, ``properties``, ``required``, ``additionalProperties``, ``items``,
    ``minItems`` / ``maxItems``, ``anyOf`` / ``oneOf`` (any branch), ``allOf`` (every member), local ``$ref``.
    Not checked (an answer is not refused for them): string and number bounds, ``pattern``, ``format``. Enough
    to tell a world model's answer written for one client's schema from what another client's schema asks.
    """
    root = schema if root is None else root
    if depth > 64:
        return False
    if schema is True or schema is None:
        return True
    if schema is False or not isinstance(schema, Mapping):
        return False
    if "$ref" in schema:
        try:
            target = SchemaCompiler(root).resolve(schema["$ref"])
        except SchemaError:
            return False
        if not conforms(value, target, root, depth + 1):
            return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if "const" in schema and value != schema["const"]:
        return False
    try:
        types = declared_types(schema)
    except SchemaError:
        return False
    if types is not None and not any(_is_json_type(value, t) for t in types):
        return False
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and not any(conforms(value, b, root, depth + 1) for b in branches):
            return False
    members = schema.get("allOf")
    if isinstance(members, list) and not all(conforms(value, m, root, depth + 1) for m in members):
        return False
    if isinstance(value, dict):
        declared = schema.get("properties")
        properties: Mapping[str, Any] = declared if isinstance(declared, Mapping) else {}
        wanted = schema.get("required")
        required: list[Any] = wanted if isinstance(wanted, list) else []
        if any(name not in value for name in required):
            return False
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in properties:
                if not conforms(item, properties[name], root, depth + 1):
                    return False
            elif not conforms(item, extra, root, depth + 1):
                return False
    if isinstance(value, list):
        low, high = int_or_none(schema, "minItems"), int_or_none(schema, "maxItems")
        if (low is not None and len(value) < low) or (high is not None and len(value) > high):
            return False
        items = schema.get("items")
        if isinstance(items, Mapping | bool) and not all(conforms(v, items, root, depth + 1) for v in value):
            return False
    return True


def _is_json_type(value: Any, name: str) -> bool:
    kinds = _PY_TYPES.get(name)
    if kinds is None:
        return True
    if isinstance(value, bool) and name in ("integer", "number"):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, kinds)


def forced_tool(request: SimRequest) -> tuple[str, Any] | None:
    """The function a request *requires* a call to, or None when it requires none.

    ``tool_choice`` ``"required"`` / ``"any"`` with exactly one tool, or a named function: that one. With several
    tools and ``"required"`` the first tool stands for the set (an answer that fits it is a valid call); the
    generic answer picks among them by rng. Raises :class:`InvalidRequest` as :func:`generic_answer` does.
    """
    if not request.tools or request.tool_choice in (None, "auto", "none"):
        return None
    functions = tool_functions(request.tools)
    choice = request.tool_choice
    if choice in ("required", "any"):
        return functions[0]
    return chosen_tool(functions, choice, random.Random(0))


def within_contract(request: SimRequest, text: str, rng: random.Random) -> Answer | None:
    """A world model's ``text`` as the answer ``request`` demands, or None when it cannot be that answer.

    The contract comes first: a forced tool call (``tool_choice`` ``"required"`` / named) gets a tool call whose
    arguments are ``text``, if ``text`` is JSON that fits the function's parameters; ``response_format``
    ``json_schema`` (or ``json_object`` + ``schema``) gets ``text`` if it is JSON that fits the schema; plain
    ``json_object`` if it is a JSON object. None means the caller answers generically (schema-valid), as a
    real model constrained by the request would rather than break the contract.
    """
    forced = forced_tool(request)
    schema = requested_schema(request.response_format)
    if forced is None and not wants_json(request.response_format):
        return Answer(content=text, source="responder")
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if forced is not None:
        name, parameters = forced
        if not isinstance(value, dict) or not conforms(value, parameters):
            return None
        call = ToolCall(id=f"call_{rng.getrandbits(96):024x}", name=name, arguments=text)
        return Answer(
            content=None,
            tool_calls=(call,),
            finish_reason="tool_calls",
            schema=parameters if isinstance(parameters, Mapping) else None,
            is_json=True,
            source="responder",
        )
    if schema is not None and not conforms(value, schema):
        return None
    if schema is None and not isinstance(value, dict):
        return None
    return Answer(content=text, schema=schema, is_json=True, source="responder")
