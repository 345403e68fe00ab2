"""A schema and its parser agree (STYLE.md principle 15), for every role, both ways:

* every instance valid under the per-request schema parses, with nothing dropped;
* whatever the parser refuses, or salvages by dropping items, is invalid under that schema.

Instances come from the schema itself (:func:`instances`, a hypothesis strategy for the keywords the schemas
use); answers near the schema come from mutating valid ones (:func:`mutants`). :func:`is_valid` checks the
same keyword subset. Both refuse a keyword they do not know, so a schema that grows one fails here first.

One rule is the parser's alone: a lesson starts with a visible character (``LESSON_PATTERN``). The schema
sends only the lesson's length, because llama.cpp stops enforcing a schema that carries the pattern (see
``combee.prompts.schemas.LESSON_PATTERN``); both helpers apply the pattern to the lesson schema.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from combee.errors import LLMParseError
from combee.models import AddOp, Bullet, Playbook, Provenance, Reflection, RemoveOp, Trace, UpdateOp
from combee.prompts import Ask, Proposal, curator_ask, generator_ask, merger_ask, reflector_ask
from combee.prompts.schemas import LESSON_PATTERN, LESSON_SCHEMA

_KNOWN = {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems"}
_KNOWN |= {"enum", "minLength", "maxLength", "pattern", "anyOf"}


def _check_known(schema: dict[str, Any]) -> None:
    unknown = set(schema) - _KNOWN
    assert not unknown, f"schema keyword(s) {unknown} not covered by this test"


def instances(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid under ``schema`` (the keyword subset of combee's schemas)."""
    _check_known(schema)
    if "anyOf" in schema:
        return st.one_of([instances(s) for s in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema["type"]
    if kind == "object":
        props = schema["properties"]
        assert set(schema["required"]) == set(props) and schema["additionalProperties"] is False
        return st.fixed_dictionaries({k: instances(v) for k, v in props.items()})
    if kind == "array":
        return st.lists(
            instances(schema["items"]), min_size=schema.get("minItems", 0), max_size=min(schema.get("maxItems", 4), 4)
        )
    assert kind == "string"
    if schema == LESSON_SCHEMA:
        text = st.from_regex(LESSON_PATTERN, fullmatch=True)
    elif "pattern" in schema:
        text = st.from_regex(schema["pattern"], fullmatch=True)
    else:
        text = st.text(min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 40), 60))
    lo, hi = schema.get("minLength", 0), schema.get("maxLength", 10**9)
    return text.filter(lambda s: lo <= len(s) <= hi)


def is_valid(schema: dict[str, Any], value: Any) -> bool:
    """``value`` is valid under ``schema`` (the same keyword subset; JSON Schema's search semantics of pattern)."""
    _check_known(schema)
    if "anyOf" in schema:
        return any(is_valid(s, value) for s in schema["anyOf"])
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            return False
        props = schema["properties"]
        if any(k not in value for k in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and set(value) - set(props):
            return False
        return all(is_valid(props[k], v) for k, v in value.items() if k in props)
    if kind == "array":
        if not isinstance(value, list):
            return False
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", 10**9):
            return False
        return all(is_valid(schema["items"], v) for v in value)
    if kind == "string":
        if not isinstance(value, str):
            return False
        if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", 10**9):
            return False
        if schema == LESSON_SCHEMA and re.search(LESSON_PATTERN, value) is None:
            return False
        return "pattern" not in schema or re.search(schema["pattern"], value) is not None
    return kind is None


def _bullet(i: int, score: int = 0) -> Bullet:
    prov = Provenance(window_id="w", version=0)
    return Bullet(
        id=f"b{i:05d}", section="units", content=f"Lesson {i}.", helpful=max(score, 0), created=prov, updated=prov
    )


EMPTY = Playbook(namespace="ns")
FULL = Playbook(namespace="ns", version=3, bullets=tuple(_bullet(i) for i in (1, 2, 7)), next_id=8)
TRACE = Trace(trace_id="t1", namespace="ns", task="Find the current ratio.", output="3.1")
REFLECTIONS = [Reflection(trace_id="t1", base_version=0)]
PROPOSALS = [
    Proposal("p1", AddOp(section="s", content="Use the ratio.")),
    Proposal("p2", UpdateOp(bullet_id="b00002", content="Sharper.")),
    Proposal("p3", RemoveOp(bullet_id="b00007")),
]


def asks() -> dict[str, Ask[Any]]:
    return {
        "reflector/empty": reflector_ask(TRACE, EMPTY),
        "reflector/bullets": reflector_ask(TRACE, FULL),
        "curator/empty": curator_ask(REFLECTIONS, EMPTY),
        "curator/bullets": curator_ask(REFLECTIONS, FULL),
        "merger/empty": merger_ask(PROPOSALS[:1], EMPTY),
        "merger/bullets": merger_ask(PROPOSALS, FULL),
        "generator": generator_ask("What is 2+2?", FULL),
    }


ASKS = asks()
_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", list(ASKS))
@_SETTINGS
@given(data=st.data())
def test_every_schema_valid_answer_parses_with_nothing_dropped(name: str, data: st.DataObject) -> None:
    ask = ASKS[name]
    schema = dict(ask.request.json_schema or {})
    value = data.draw(instances(schema))
    assert is_valid(schema, value)
    parsed = ask.parse(json.dumps(value))
    assert parsed.invalid == ()


def _mutations(value: Any) -> st.SearchStrategy[Any]:
    """One small change somewhere in ``value``: a key dropped, renamed or added, an item changed or added."""
    odd = st.one_of(
        st.none(),
        st.integers(-3, 3),
        st.sampled_from(["", "   ", "b00009", "p9", "helpful", "ADD", "b1", "x" * 700, "\x01"]),
        st.just({}),
        st.just([]),
    )
    if isinstance(value, dict) and value:
        key = st.sampled_from(sorted(value))
        return st.one_of(
            key.map(lambda k: {kk: vv for kk, vv in value.items() if kk != k}),
            key.map(lambda k: {**{kk: vv for kk, vv in value.items() if kk != k}, k + "s": value[k]}),
            st.tuples(key, odd).map(lambda kv: {**value, kv[0]: kv[1]}),
            key.flatmap(lambda k: _mutations(value[k]).map(lambda m: {**value, k: m})),
            odd.map(lambda v: {**value, "extra": v}),
        )
    if isinstance(value, list) and value:
        index = st.integers(0, len(value) - 1)
        return st.one_of(
            index.flatmap(lambda i: _mutations(value[i]).map(lambda m: [*value[:i], m, *value[i + 1 :]])),
            odd.map(lambda v: [*value, v]),
        )
    return odd


@pytest.mark.parametrize("name", list(ASKS))
@_SETTINGS
@given(data=st.data())
def test_what_the_parser_refuses_or_trims_is_outside_the_schema(name: str, data: st.DataObject) -> None:
    ask = ASKS[name]
    schema = dict(ask.request.json_schema or {})
    value = data.draw(instances(schema).flatmap(_mutations))
    try:
        parsed = ask.parse(json.dumps(value))
    except LLMParseError:
        assert not is_valid(schema, value), f"refused a schema-valid answer: {value!r}"
        return
    if parsed.invalid:
        assert not is_valid(schema, value), f"dropped items of a schema-valid answer: {value!r}"


def test_the_issue_answer_is_outside_the_empty_playbook_schema_and_salvaged() -> None:
    ask = ASKS["reflector/empty"]
    answer = {"diagnosis": "d", "insights": [], "bullet_tags": [{"bullet_id": "helpful", "tag": "neutral"}]}
    assert not is_valid(dict(ask.request.json_schema or {}), answer)
    parsed = ask.parse(json.dumps(answer))
    assert parsed.value.tags == () and len(parsed.invalid) == 1
