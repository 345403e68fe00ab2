"""Generic simulator answers are valid for the schemas they were asked for.

``jsonschema`` is not installed, so a small, independent validator for the keywords the generator supports
lives here (and is itself tested). Schemas come from a hypothesis grammar of those keywords, from Combee's own four
request schemas, from pydantic models (the shape another client's schemas take), and from hand-written recursive
cases; then end to end through the HTTP server and the official ``openai`` client.
"""

from __future__ import annotations

import enum
import json
import random
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

from combee.prompts.schemas import curator_schema, generator_schema, merger_schema, reflector_schema
from combee.sim.config import SimConfig
from combee.sim.generic import (
    Answer,
    SchemaError,
    ToolCall,
    compile_schema,
    compiled_schema,
    conforms,
    generic_answer,
    prose,
    requested_schema,
    truncate_answer,
)
from combee.sim.protocol import SimRequest
from combee.sim.runner import SimThread
from combee.tokens import estimate_tokens

# ------------------------------------------------------------------------------------------------------------
# A minimal JSON Schema validator (independent of the generator)


def _is_type(value: Any, name: str) -> bool:
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if name == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if name == "string":
        return isinstance(value, str)
    if name == "array":
        return isinstance(value, list)
    if name == "object":
        return isinstance(value, dict)
    raise AssertionError(f"unknown type {name}")


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _resolve(root: Any, ref: str) -> Any:
    assert ref.startswith("#"), ref
    node = root
    for raw in [t for t in ref[1:].split("/") if t]:
        token = raw.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


def validate(instance: Any, schema: Any, root: Any = None, path: str = "$") -> list[str]:
    """Errors of ``instance`` against ``schema`` (empty = valid) for the supported keyword set."""
    root = schema if root is None else root
    if schema is True:
        return []
    if schema is False:
        return [f"{path}: schema false"]
    errors: list[str] = []
    if "$ref" in schema:
        errors += validate(instance, _resolve(root, schema["$ref"]), root, path)
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else list(types)
        if not any(_is_type(instance, t) for t in types):
            errors.append(f"{path}: {instance!r} is not of type {types}")
    if "enum" in schema and not any(_json_equal(instance, v) for v in schema["enum"]):
        errors.append(f"{path}: {instance!r} not in enum")
    if "const" in schema and not _json_equal(instance, schema["const"]):
        errors.append(f"{path}: {instance!r} is not the const")
    if isinstance(instance, dict):
        props = schema.get("properties", {})
        for name, sub in props.items():
            if name in instance:
                errors += validate(instance[name], sub, root, f"{path}.{name}")
        for name in schema.get("required", []):
            if name not in instance:
                errors.append(f"{path}: missing required {name!r}")
        extra = schema.get("additionalProperties", True)
        for name in instance:
            if name not in props:
                if extra is False:
                    errors.append(f"{path}: additional property {name!r}")
                elif isinstance(extra, dict):
                    errors += validate(instance[name], extra, root, f"{path}.{name}")
    if isinstance(instance, list):
        for i, value in enumerate(instance):
            errors += validate(value, schema.get("items", True), root, f"{path}[{i}]")
        if len(instance) < schema.get("minItems", 0):
            errors.append(f"{path}: fewer than minItems")
        if "maxItems" in schema and len(instance) > schema["maxItems"]:
            errors.append(f"{path}: more than maxItems")
    if isinstance(instance, str):
        if len(instance) < schema.get("minLength", 0):
            errors.append(f"{path}: shorter than minLength")
        if "maxLength" in schema and len(instance) > schema["maxLength"]:
            errors.append(f"{path}: longer than maxLength")
    if isinstance(instance, int | float) and not isinstance(instance, bool):
        low, high = schema.get("minimum"), schema.get("maximum")
        ex_low, ex_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
        if low is not None and instance < low:
            errors.append(f"{path}: below minimum")
        if high is not None and instance > high:
            errors.append(f"{path}: above maximum")
        if ex_low is not None and instance <= ex_low:
            errors.append(f"{path}: not above exclusiveMinimum")
        if ex_high is not None and instance >= ex_high:
            errors.append(f"{path}: not below exclusiveMaximum")
    if "anyOf" in schema and not any(not validate(instance, s, root, path) for s in schema["anyOf"]):
        errors.append(f"{path}: matches no anyOf branch")
    if "oneOf" in schema:
        matches = sum(1 for s in schema["oneOf"] if not validate(instance, s, root, path))
        if matches != 1:
            errors.append(f"{path}: matches {matches} oneOf branches")
    for sub in schema.get("allOf", []):
        errors += validate(instance, sub, root, path)
    return errors


def test_the_validator_catches_what_it_should() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 1},
            "b": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2},
            "c": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/S"}]},
        },
        "required": ["a"],
        "additionalProperties": False,
        "$defs": {"S": {"type": "string", "minLength": 2}},
    }
    assert validate({"a": 1, "b": ["x"], "c": None}, schema) == []
    assert validate({"a": 1, "c": "ok"}, schema) == []
    assert validate({"b": []}, schema)  # missing a
    assert validate({"a": 0}, schema)  # below minimum
    assert validate({"a": True}, schema)  # a boolean is not an integer
    assert validate({"a": 1, "b": ["z"]}, schema)
    assert validate({"a": 1, "b": ["x", "x", "y"]}, schema)
    assert validate({"a": 1, "c": "k"}, schema)
    assert validate({"a": 1, "zz": 1}, schema)
    assert validate([1], schema)
    assert validate(1, {"oneOf": [{"type": "integer"}, {"type": "number"}]})  # two branches match
    assert validate(3.0, {"type": "integer"}) == []


# ------------------------------------------------------------------------------------------------------------
# Hypothesis: schemas from a grammar of the supported keywords

_names = st.sampled_from(["id", "name", "kind", "score", "items", "note", "tags", "meta", "x", "y"])
_scalar_json = st.one_of(
    st.none(), st.booleans(), st.integers(-50, 50), st.text(max_size=6), st.floats(-10, 10, allow_nan=False)
)


@st.composite
def _string_schema(draw: st.DrawFn) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    low = draw(st.none() | st.integers(0, 30))
    high = draw(st.none() | st.integers(0, 30))
    if low is not None:
        schema["minLength"] = low
    if high is not None:
        schema["maxLength"] = max(high, low or 0)
    return schema


@st.composite
def _numeric_schema(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(["integer", "number"]))
    schema: dict[str, Any] = {"type": kind}
    low = draw(st.none() | st.integers(-1000, 1000))
    high = draw(st.none() | st.integers(-1000, 1000))
    if low is not None and high is not None and low > high:
        low, high = high, low
    if low is not None and high is not None and high - low < 3:
        # a range some value satisfies: exclusive integer bounds 0 and 1 admit none (that refusal is tested apart)
        high = low + 3
    exclusive = draw(st.booleans())
    if low is not None:
        schema["exclusiveMinimum" if exclusive else "minimum"] = low
    if high is not None:
        schema["exclusiveMaximum" if exclusive else "maximum"] = high
    return schema


_scalar_schemas = st.one_of(
    st.just({"type": "null"}),
    st.just({"type": "boolean"}),
    st.just({}),
    _string_schema(),
    _numeric_schema(),
    st.lists(_scalar_json, min_size=1, max_size=4).map(lambda values: {"enum": values}),
    _scalar_json.map(lambda value: {"const": value}),
    st.sampled_from(["string", "integer", "boolean"]).map(lambda t: {"type": [t, "null"]}),
)


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    @st.composite
    def object_schema(draw: st.DrawFn) -> dict[str, Any]:
        props = draw(st.dictionaries(_names, children, max_size=4))
        schema: dict[str, Any] = {"type": "object", "properties": props}
        if props:
            schema["required"] = draw(st.lists(st.sampled_from(sorted(props)), unique=True))
        extra = draw(st.sampled_from(["absent", "false", "true", "schema"]))
        if extra == "false":
            schema["additionalProperties"] = False
        elif extra == "true":
            schema["additionalProperties"] = True
        elif extra == "schema":
            schema["additionalProperties"] = draw(children)
        return schema

    @st.composite
    def array_schema(draw: st.DrawFn) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "array", "items": draw(children)}
        low = draw(st.none() | st.integers(0, 4))
        high = draw(st.none() | st.integers(0, 6))
        if low is not None:
            schema["minItems"] = low
        if high is not None:
            schema["maxItems"] = max(high, low or 0)
        return schema

    @st.composite
    def one_of_schema(draw: st.DrawFn) -> dict[str, Any]:
        # oneOf requires exactly one match: give branches distinct, non-overlapping types.
        kinds = draw(
            st.lists(st.sampled_from(["null", "boolean", "string", "object", "array"]), min_size=1, unique=True)
        )
        branches: list[dict[str, Any]] = []
        for kind in kinds:
            if kind == "object":
                branches.append({"type": "object", "properties": draw(st.dictionaries(_names, children, max_size=2))})
            elif kind == "array":
                branches.append({"type": "array", "items": draw(children), "maxItems": 3})
            else:
                branches.append({"type": kind})
        return {"oneOf": branches}

    return st.one_of(
        object_schema(),
        array_schema(),
        st.lists(children, min_size=1, max_size=3).map(lambda branches: {"anyOf": branches}),
        one_of_schema(),
        children.map(lambda sub: {"allOf": [sub]}),
    )


_schemas = st.recursive(_scalar_schemas, _extend, max_leaves=10)


@st.composite
def _rooted_schemas(draw: st.DrawFn) -> dict[str, Any]:
    """A root object whose properties refer to named definitions ($defs or definitions, $ref or allOf)."""
    defs = draw(st.dictionaries(st.sampled_from(["A", "B", "C/D", "E~F"]), _schemas, min_size=1, max_size=3))
    where = draw(st.sampled_from(["$defs", "definitions"]))
    props: dict[str, Any] = {}
    for i, name in enumerate(sorted(defs)):
        pointer = f"#/{where}/" + name.replace("~", "~0").replace("/", "~1")
        ref = {"$ref": pointer}
        props[f"p{i}"] = ref if draw(st.booleans()) else {"allOf": [ref], "description": "wrapped"}
    return {
        "type": "object",
        "properties": props,
        "required": sorted(props),
        "additionalProperties": False,
        where: defs,
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=_schemas | _rooted_schemas(), seed=st.integers(0, 2**32))
def test_generated_instances_validate(schema: dict[str, Any], seed: int) -> None:
    compiled = compile_schema(schema)
    for offset in range(3):
        instance = compiled.generate(random.Random(seed + offset))
        assert validate(instance, schema) == [], (schema, instance)
        assert json.loads(json.dumps(instance)) == instance  # plain JSON, round-trips


@settings(max_examples=200, deadline=None)
@given(schema=_schemas, seed=st.integers(0, 2**32))
def test_violations_do_violate(schema: dict[str, Any], seed: int) -> None:
    text = compile_schema(schema).violation(random.Random(seed))
    if text is not None:
        assert validate(json.loads(text), schema), (schema, text)


@settings(max_examples=100, deadline=None)
@given(schema=_schemas, seed=st.integers(0, 2**32))
def test_generation_is_deterministic_per_rng_seed(schema: dict[str, Any], seed: int) -> None:
    compiled = compile_schema(schema)
    assert compiled.generate(random.Random(seed)) == compiled.generate(random.Random(seed))


# ------------------------------------------------------------------------------------------------------------
# Hand-written: recursion, pydantic, unsatisfiable schemas


def test_recursive_schemas_terminate() -> None:
    tree = {
        "$ref": "#/$defs/Node",
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "label": {"type": "string"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "minItems": 1},
                    "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]},
                },
                "required": ["label", "next"],
            }
        },
    }
    linked = {"type": "object", "properties": {"tail": {"$ref": "#"}}, "required": []}
    wrapped = {  # pydantic's older allOf wrapper around a recursive reference
        "$defs": {
            "Item": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "parent": {"anyOf": [{"allOf": [{"$ref": "#/$defs/Item"}], "description": "up"}, {"type": "null"}]},
                },
                "required": ["name", "parent"],
            }
        },
        "allOf": [{"$ref": "#/$defs/Item"}],
    }
    for schema in (tree, linked, wrapped):
        compiled = compile_schema(schema)
        for seed in range(30):
            instance = compiled.generate(random.Random(seed))
            assert validate(instance, schema) == []


class Verdict(enum.StrEnum):
    HELPFUL = "helpful"
    HARMFUL = "harmful"
    NEUTRAL = "neutral"


class Insight(BaseModel):
    section: Annotated[str, Field(min_length=3, max_length=40)]
    content: str
    confidence: Annotated[float, Field(ge=0, le=1)] = 0.5


class Tag(BaseModel):
    bullet_id: str
    verdict: Verdict


class AddOp(BaseModel):
    op: Literal["ADD"]
    section: str
    content: str


class RemoveOp(BaseModel):
    op: Literal["REMOVE"]
    bullet_id: str
    reason: str | None = None


class Reflection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    diagnosis: str
    insights: list[Insight] = Field(max_length=5)
    tags: list[Tag]
    counts: dict[str, int]
    ops: list[Annotated[AddOp | RemoveOp, Field(discriminator="op")]]
    priority: Annotated[int, Field(ge=1, le=3)]
    note: str | None


class Tree(BaseModel):
    name: str
    children: list[Tree] = []


@pytest.mark.parametrize("model", [Reflection, Tree, Insight])
def test_pydantic_schemas_get_instances_pydantic_accepts(model: type[BaseModel]) -> None:
    schema = model.model_json_schema()
    for seed in range(50):
        instance = compiled_schema(schema).generate(random.Random(seed))
        assert validate(instance, schema) == []
        model.model_validate(instance)  # raises if not


def _combee_schemas() -> list[dict[str, Any]]:
    """Every schema Combee sends (combee.prompts.schemas), with and without bullets and reflections shown."""
    sections = ["formulas", "pitfalls"]
    return [
        reflector_schema([], sections),
        reflector_schema(["b-1", "b-2"], sections),
        curator_schema([], ["r1", "r2"], sections),
        curator_schema(["b-1"], ["r1", "r2", "r3"], sections, max_ops=3),
        merger_schema(["p1", "p2", "p3"], [], sections),
        merger_schema(["p1", "p2"], ["b-1"], sections),
        generator_schema(),
    ]


@pytest.mark.parametrize("schema", _combee_schemas())
def test_combees_own_schemas_get_instances_of_their_shape(schema: dict[str, Any]) -> None:
    for seed in range(30):
        instance = compiled_schema(schema).generate(random.Random(seed))
        assert validate(instance, schema) == [] and conforms(instance, schema), instance


@pytest.mark.parametrize(
    "schema",
    [
        False,
        {"type": "string", "minLength": 5, "maxLength": 2},
        {"type": "integer", "minimum": 3, "maximum": 1},
        {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1},  # no integer strictly between
        {"type": "object", "required": ["a"], "properties": {}, "additionalProperties": False},
        {"type": "array", "minItems": 2, "items": False},
        {"enum": []},
        {"$ref": "https://example.com/schema.json"},
        {"$ref": "#/$defs/Missing"},
        {"type": "wat"},
        {"allOf": [{"type": "string"}, {"maxLength": 3}]},  # only pydantic's one-member wrapper is supported
        {"type": "object", "properties": {"me": {"$ref": "#"}}, "required": ["me"]},  # only infinite values
    ],
)
def test_unsatisfiable_or_unsupported_schemas_raise(schema: Any) -> None:
    with pytest.raises(SchemaError):
        compile_schema(schema).generate(random.Random(0))


def test_compiled_schemas_are_cached_by_content() -> None:
    a = {"type": "object", "properties": {"x": {"type": "integer"}}}
    b = {"properties": {"x": {"type": "integer"}}, "type": "object"}  # same schema, other key order
    assert compiled_schema(a) is compiled_schema(b)


# ------------------------------------------------------------------------------------------------------------
# Answers for requests


def _request(**kw: Any) -> SimRequest:
    return SimRequest(model="m", messages=[{"role": "user", "content": "hello"}], **kw)


def test_plain_requests_get_deterministic_prose() -> None:
    a = generic_answer(_request(), random.Random(7))
    b = generic_answer(_request(), random.Random(7))
    assert a == b and a.content and a.finish_reason == "stop" and not a.is_json
    lengths = {len(prose(random.Random(seed)).split()) for seed in range(40)}
    assert min(lengths) >= 8 and max(lengths) <= 400 and len(lengths) > 10


def test_json_object_requests_get_a_small_object() -> None:
    answer = generic_answer(_request(response_format={"type": "json_object"}), random.Random(1))
    assert answer.content is not None and isinstance(json.loads(answer.content), dict) and answer.is_json


def test_both_structured_output_spellings_are_understood() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    openai_form = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    llama_form = {"type": "json_object", "schema": schema}
    assert requested_schema(openai_form) == requested_schema(llama_form) == schema
    for fmt in (openai_form, llama_form):
        answer = generic_answer(_request(response_format=fmt), random.Random(3))
        assert answer.content is not None and validate(json.loads(answer.content), schema) == []


_TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"ticker": {"type": "string", "maxLength": 5}, "year": {"type": "integer"}},
                "required": ["ticker", "year"],
                "additionalProperties": False,
            },
        },
    },
    {"type": "function", "function": {"name": "noop"}},
]


def test_tool_choice_rules() -> None:
    named = {"type": "function", "function": {"name": "lookup"}}
    for seed in range(20):
        answer = generic_answer(_request(tools=_TOOLS, tool_choice=named), random.Random(seed))
        assert answer.finish_reason == "tool_calls" and answer.tool_calls[0].name == "lookup"
        args = json.loads(answer.tool_calls[0].arguments)
        assert validate(args, _TOOLS[0]["function"]["parameters"]) == []
        required = generic_answer(_request(tools=_TOOLS, tool_choice="required"), random.Random(seed))
        assert required.tool_calls
        none = generic_answer(_request(tools=_TOOLS, tool_choice="none"), random.Random(seed))
        assert not none.tool_calls and none.content
    auto = [bool(generic_answer(_request(tools=_TOOLS), random.Random(s)).tool_calls) for s in range(200)]
    assert 100 < sum(auto) < 200  # mostly calls, sometimes text
    with pytest.raises(SchemaError.__mro__[1]):  # InvalidRequest
        generic_answer(
            _request(tools=_TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), random.Random(0)
        )


def test_truncation_marks_length_and_respects_the_budget() -> None:
    long = Answer(content="x" * 1000, schema=None)
    cut = truncate_answer(long, 10)
    assert cut.finish_reason == "length" and estimate_tokens(cut.content or "") == 10
    assert truncate_answer(long, 10_000) is long
    call = Answer(
        content=None, tool_calls=(ToolCall("c", "f", '{"a": "' + "y" * 200 + '"}'),), finish_reason="tool_calls"
    )
    cut_call = truncate_answer(call, 5)
    assert cut_call.finish_reason == "length" and len(cut_call.tool_calls[0].arguments) == 20


# ------------------------------------------------------------------------------------------------------------
# End to end through the server and the official openai client


@pytest.fixture(scope="module")
def sim() -> Iterator[SimThread]:
    with SimThread(SimConfig(time_scale=0.0005, seed=11)) as server:
        yield server


def _client(sim: SimThread) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=sim.base_url, api_key="sim", max_retries=0)


async def test_json_schema_answers_validate_over_http(sim: SimThread) -> None:
    schema = Reflection.model_json_schema()
    async with _client(sim) as client:
        for i in range(20):
            completion = await client.chat.completions.create(
                model="any-model",
                messages=[{"role": "user", "content": f"reflect on run {i}"}],
                response_format={"type": "json_schema", "json_schema": {"name": "reflection", "schema": schema}},
            )
            content = completion.choices[0].message.content
            assert content is not None
            assert validate(json.loads(content), schema) == []
            Reflection.model_validate_json(content)


async def test_the_openai_parse_helper_gets_a_parsed_model(sim: SimThread) -> None:
    async with _client(sim) as client:
        completion = await client.chat.completions.parse(
            model="m", messages=[{"role": "user", "content": "reflect"}], response_format=Reflection
        )
    assert isinstance(completion.choices[0].message.parsed, Reflection)


async def test_llama_cpp_schema_form_over_http(sim: SimThread) -> None:
    llama_format: Any = {"type": "json_object", "schema": Insight.model_json_schema()}
    async with _client(sim) as client:
        completion = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "one insight"}], response_format=llama_format
        )
    Insight.model_validate_json(completion.choices[0].message.content or "")


async def test_tool_calls_over_http_validate_against_their_parameters(sim: SimThread) -> None:
    async with _client(sim) as client:
        for i in range(10):
            completion = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": f"look up {i}"}],
                tools=_TOOLS,
                tool_choice={"type": "function", "function": {"name": "lookup"}},
            )
            choice = completion.choices[0]
            assert choice.finish_reason == "tool_calls"
            calls = choice.message.tool_calls or []
            assert len(calls) == 1 and calls[0].type == "function"
            assert calls[0].function.name == "lookup"
            assert validate(json.loads(calls[0].function.arguments), _TOOLS[0]["function"]["parameters"]) == []
            assert completion.usage is not None
            assert completion.usage.completion_tokens == estimate_tokens(calls[0].function.arguments)


async def test_max_tokens_truncates_structured_output_into_broken_json(sim: SimThread) -> None:
    schema = Reflection.model_json_schema()
    async with _client(sim) as client:
        completion = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "reflect briefly"}],
            response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
            max_completion_tokens=8,
        )
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens <= 8
    with pytest.raises(ValueError):
        json.loads(choice.message.content or "")


async def test_unsatisfiable_schema_is_a_clean_400(sim: SimThread) -> None:
    async with _client(sim) as client:
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "x"}],
                response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": {"enum": []}}},
            )
