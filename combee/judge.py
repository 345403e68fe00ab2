"""The LLM-judge grader: a model decides whether an answer matches a task's ground truth. Pure (request + parser).

The request is built here and sent by the evaluation (:mod:`combee.gate`) through the LLM port; the answer is
one JSON object, ``{"correct": true|false, "reason": "..."}``, and :func:`parse_judgement` accepts exactly what
:func:`judge_schema` admits. The judge is asked in the reflector's role (the model that reviews runs); the
prompt text is Combee's own and has to be tried on the real model before it is relied on (docs/promotion.md).
"""

from __future__ import annotations

from typing import Any, Final

from combee.errors import LLMParseError
from combee.graders import Score
from combee.llm import ChatRequest, Role
from combee.prompts.extract import load_object, require_keys
from combee.prompts.render import chat_messages, data_json

__all__ = ["JUDGE_REASON_CHARS", "JUDGE_SYSTEM", "JUDGE_USER", "judge_request", "judge_schema", "parse_judgement"]

JUDGE_REASON_CHARS: Final = 300

JUDGE_SYSTEM: Final = (
    "You grade answers. You are given a task, the reference answer known to be right, optional grading "
    "criteria, and a candidate answer. Decide whether the candidate answer says the same thing as the reference "
    "answer for this task: equivalent wording, units or formatting are fine; a different value, a missing part "
    "or an extra wrong claim is not. Do not solve the task again and do not reward effort. Reply with one JSON "
    'object: {"correct": true or false, "reason": "<one short sentence>"}.'
)

JUDGE_USER: Final = (
    "<task>\n{task}\n</task>\n<reference>\n{truth}\n</reference>\n<criteria>\n{criteria}\n</criteria>\n"
    "<candidate>\n{prediction}\n</candidate>"
)


def judge_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "correct": {"type": "boolean"},
            "reason": {"type": "string", "maxLength": JUDGE_REASON_CHARS},
        },
        "required": ["correct", "reason"],
        "additionalProperties": False,
    }


def judge_request(task: str, prediction: str, truth: str, criteria: str = "", *, max_tokens: int = 256) -> ChatRequest:
    """The judge's request for one answer. Data goes in as escaped JSON strings, so it cannot close a block."""
    user = JUDGE_USER.format(
        task=data_json(task), truth=data_json(truth), criteria=data_json(criteria or "none"),
        prediction=data_json(prediction),
    )  # fmt: skip
    return ChatRequest(
        role=Role.REFLECTOR,
        messages=chat_messages(JUDGE_SYSTEM, user),
        schema_name="combee_judge",
        json_schema=judge_schema(),
        max_tokens=max_tokens,
    )


def parse_judgement(text: str) -> Score:
    """The judge's verdict as a :class:`Score` (1 and success when ``correct``), or raise
    :class:`LLMParseError` for an answer the schema would not admit."""
    obj = load_object(text)
    require_keys(obj, ["correct", "reason"])
    if set(obj) - {"correct", "reason"}:
        raise LLMParseError("only 'correct' and 'reason' are allowed", kind="bad_shape")
    correct, reason = obj["correct"], obj["reason"]
    if not isinstance(correct, bool):
        raise LLMParseError("'correct' must be true or false", kind="bad_shape")
    if not isinstance(reason, str) or len(reason) > JUDGE_REASON_CHARS:
        raise LLMParseError(f"'reason' must be a string of at most {JUDGE_REASON_CHARS} characters", kind="bad_shape")
    return Score(float(correct), correct)
