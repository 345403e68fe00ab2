"""Parser tests over answers recorded from a real model (tests/unit/fixtures/real_model/*.json).

Each fixture holds the schema that was sent, the raw answer, the model and the date. The parser is rebuilt
from the ids the recorded schema enumerates, exactly as the request's own :class:`~combee.prompts.Ask` did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from combee.errors import LLMParseError
from combee.prompts import load_object, parse_answer, read_merge, read_operations, read_reflection
from tests.unit.test_schema_agreement import is_valid

FIXTURES = {p.stem: json.loads(p.read_text()) for p in sorted(Path(__file__).parent.glob("fixtures/real_model/*.json"))}
NEW = [name for name, f in FIXTURES.items() if f["request"]["schema_origin"].startswith("per-request")]


def _enum(schema: dict[str, Any] | None) -> tuple[str, ...]:
    return tuple(schema.get("enum", ())) if schema else ()


def _op_ids(op_schema: dict[str, Any]) -> tuple[str, ...]:
    shapes = op_schema.get("anyOf", [op_schema])
    return tuple(i for shape in shapes for i in _enum(shape["properties"].get("bullet_id")))


def parse(fixture: dict[str, Any]) -> Any:
    schema, text = fixture["request"]["json_schema"], fixture["answer"]
    role = fixture["request"]["role"]
    props = schema["properties"]
    if role == "reflector":
        tags = props.get("bullet_tags")
        ids = _enum(tags["items"]["properties"]["bullet_id"]) if tags else ()
        return read_reflection(text, "t", 0, bullet_ids=ids)
    if role == "curator":
        return read_operations(text, bullet_ids=_op_ids(props["operations"]["items"]))
    if role == "merger":
        entry = props["combine"]["items"]["properties"]
        return read_merge(text, proposal_ids=_enum(props["keep"]["items"]), bullet_ids=_op_ids(entry["op"]))
    return parse_answer(text)


def test_there_are_recorded_answers_of_every_role() -> None:
    assert {f["request"]["role"] for f in FIXTURES.values()} == {"reflector", "curator", "merger", "generator"}
    assert all(f["model"] and f["date"] and f["answer"] for f in FIXTURES.values())


@pytest.mark.parametrize("name", NEW)
def test_the_grammar_held_and_the_parser_takes_the_whole_answer(name: str) -> None:
    fixture = FIXTURES[name]
    assert fixture["finish_reason"] == "stop"
    assert is_valid(fixture["request"]["json_schema"], load_object(fixture["answer"]))
    parsed = parse(fixture)
    if fixture["request"]["role"] != "generator":
        assert parsed.invalid == ()


def test_the_issue_answer_is_salvaged_not_rejected() -> None:
    fixture = FIXTURES["reflector_old_schema_empty_playbook"]
    answer = load_object(fixture["answer"])
    assert [t["bullet_id"] for t in answer["bullet_tags"]] == ["helpful", "neutral", "neutral", "neutral"]
    assert is_valid(fixture["request"]["json_schema"], answer)  # the old schema let the model write it
    parsed = read_reflection(fixture["answer"], "t", 0, bullet_ids=())  # the playbook shown was empty
    assert len(parsed.value.insights) == 3 and parsed.value.tags == () and len(parsed.invalid) == 4


def test_what_the_real_answers_say() -> None:
    tagged = parse(FIXTURES["reflector_five_bullets"]).value
    assert [(t.bullet_id, t.tag.value) for t in tagged.tags] == [("b00004", "harmful")]
    assert parse(FIXTURES["reflector_empty_playbook"]).value.tags == ()
    ops = parse(FIXTURES["curator_six_reflections"]).value
    assert len(ops) == len(load_object(FIXTURES["curator_six_reflections"]["answer"])["operations"]) > 0
    merge = parse(FIXTURES["merger_nine_proposals"]).value
    assert merge.keep == tuple(f"p{i}" for i in range(1, 10)) and merge.combine == ()
    assert parse(FIXTURES["generator_formula_question"]) == "2.00"


def test_a_repair_turn_with_the_real_model() -> None:
    fixture = FIXTURES["reflector_repair_turn"]
    assert [m["role"] for m in fixture["request"]["messages"]] == ["system", "user", "assistant", "user"]
    with pytest.raises(LLMParseError) as info:
        parse({**fixture, "answer": fixture["rejected_answer"]})
    assert str(info.value) == fixture["problem"] and info.value.kind == "missing_key"
    repaired = parse(fixture).value
    assert repaired.insights and [t.bullet_id for t in repaired.tags] == ["b00002"]
