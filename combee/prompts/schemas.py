"""The JSON schema of every role's answer, built per request: strict-mode compatible (every property required,
no free-form ids)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from combee.models import (
    LIMITS,
    Tag,
)
from combee.sections import NEW_SECTION_PATTERN

__all__ = [
    "DIAGNOSIS_SCHEMA_CHARS",
    "GENERATOR_ANSWER_CHARS",
    "GENERATOR_REASONING_CHARS",
    "LESSON_PATTERN",
    "LESSON_SCHEMA",
    "curator_schema",
    "generator_schema",
    "merger_schema",
    "reflector_schema",
]


_BLANK_UNICODE = "\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


LESSON_PATTERN = r"^[^\x00-\x20\x7f-\xa0" + _BLANK_UNICODE + "].{0," + str(LIMITS.bullet_chars - 1) + "}$"
"""A lesson's text as the parser accepts it: one line that starts with a visible character, at most
``bullet_chars`` long.

The parser's rule, not the schema's: the schema sends only the length (:data:`LESSON_SCHEMA`). With this
pattern in the schema, llama.cpp (xllamacpp 2026.10.11549, the deploy's server) did not hold the model to the
schema: curator answers came back in a Markdown fence with ``//`` comments, which the server's own output parser
then refused with HTTP 500 (docs/results/controller-formula-real/). Replayed by hand while fixing it, the
refused request came back as schema-valid JSON once the pattern was removed, and failed with every pattern tried
(down to ``^[^ ]{1,600}$``); that request was not kept, and a later probe with two other requests did not
reproduce the failure (docs/results/controller-formula-real-2/). A blank lesson is dropped by the parser and
listed as invalid."""


LESSON_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": LIMITS.bullet_chars}
"""The lesson as the schema sends it: only its length limits (the rest of LESSON_PATTERN is the parser's)."""


_TAG_VALUES = [t.value for t in Tag]


DIAGNOSIS_SCHEMA_CHARS = 600  # the parser keeps up to LIMITS.diagnosis_chars; a short one is asked for


GENERATOR_REASONING_CHARS = 1000


GENERATOR_ANSWER_CHARS = 300


def _lesson_schema() -> dict[str, Any]:
    return dict(LESSON_SCHEMA)


def _section_schema(sections: Sequence[str]) -> dict[str, Any]:
    # One of the offered sections, or "new: <name>" (combee.sections.label_of is the parser's side).
    return {"anyOf": [{"type": "string", "enum": list(sections)}, {"type": "string", "pattern": NEW_SECTION_PATTERN}]}


def _sources_schema(refs: Sequence[str]) -> dict[str, Any]:
    return {
        "type": "array",
        "minItems": 1,
        "maxItems": min(len(refs), LIMITS.sources_per_op),
        "items": {"type": "string", "enum": list(refs)},
    }


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _op_schema(bullet_ids: Sequence[str], sections: Sequence[str], refs: Sequence[str] = ()) -> dict[str, Any]:
    """One operation; with ``refs`` (the reflections shown), each cites the ones it comes from in ``from``."""
    cite = {"from": _sources_schema(refs)} if refs else {}
    add = _object(
        {
            "op": {"type": "string", "enum": ["ADD"]},
            "section": _section_schema(sections),
            "content": _lesson_schema(),
            **cite,
        }
    )
    if not bullet_ids:
        return add
    ids = {"type": "string", "enum": list(bullet_ids)}
    update = _object(
        {"op": {"type": "string", "enum": ["UPDATE"]}, "bullet_id": ids, "content": _lesson_schema(), **cite}
    )
    remove = _object({"op": {"type": "string", "enum": ["REMOVE"]}, "bullet_id": dict(ids), **cite})
    return {"anyOf": [add, update, remove]}


def reflector_schema(bullet_ids: Sequence[str], sections: Sequence[str]) -> dict[str, Any]:
    """The reflection schema for a request that shows the bullets ``bullet_ids`` (no tags when there are none)
    and offers ``sections``."""
    insight = _object({"section": _section_schema(sections), "content": _lesson_schema()})
    properties: dict[str, Any] = {
        "diagnosis": {"type": "string", "maxLength": DIAGNOSIS_SCHEMA_CHARS},
        "insights": {"type": "array", "maxItems": LIMITS.insights_per_reflection, "items": insight},
    }
    if bullet_ids:
        tag = _object(
            {
                "bullet_id": {"type": "string", "enum": list(bullet_ids)},
                "tag": {"type": "string", "enum": list(_TAG_VALUES)},
            }
        )
        properties["bullet_tags"] = {
            "type": "array",
            "maxItems": min(LIMITS.tags_per_reflection, len(bullet_ids)),
            "items": tag,
        }
    return _object(properties)


def curator_schema(
    bullet_ids: Sequence[str],
    refs: Sequence[str],
    sections: Sequence[str],
    max_ops: int = LIMITS.ops_per_llm_answer,
) -> dict[str, Any]:
    """The operations schema: ADD always; UPDATE/REMOVE of the shown ``bullet_ids`` when there are any; every
    operation cites the reflections (``refs``) it comes from.

    ``max_ops`` (at most the parser's limit) bounds the list, so a small model cannot ramble on to its token
    limit and cut its own answer off.
    """
    items = min(max(max_ops, 1), LIMITS.ops_per_llm_answer)
    ops = _op_schema(bullet_ids, sections, refs)
    return _object({"operations": {"type": "array", "maxItems": items, "items": ops}})


def merger_schema(proposal_ids: Sequence[str], bullet_ids: Sequence[str], sections: Sequence[str]) -> dict[str, Any]:
    """The merge schema: ``keep``/``from`` name listed proposals; combined operations target ``bullet_ids``.

    At most one combined operation per two proposals (a combination merges at least two).
    """
    pid = {"type": "string", "enum": list(proposal_ids)}
    entry = _object(
        {"from": {"type": "array", "minItems": 1, "items": dict(pid)}, "op": _op_schema(bullet_ids, sections)}
    )
    combined = min(max(len(proposal_ids) // 2, 1), LIMITS.ops_per_llm_answer)
    return _object(
        {
            "keep": {"type": "array", "maxItems": len(proposal_ids), "items": pid},
            "combine": {"type": "array", "maxItems": combined, "items": entry},
        }
    )


def generator_schema() -> dict[str, Any]:
    return _object(
        {
            "reasoning": {"type": "string", "maxLength": GENERATOR_REASONING_CHARS},
            "final_answer": {"type": "string", "maxLength": GENERATOR_ANSWER_CHARS},
        }
    )
