"""The generator's answer to a task: one request with a playbook, and the final answer found in its reply.

Used wherever an agent's answer is needed: the gate's evaluation (:mod:`combee.gate`) and the finance tasks
(:mod:`combee.tasks`).

**Answer extraction** (:func:`extract_answer`): the generator's answer is parsed by
:func:`combee.prompts.parse_answer` (the project's one parser of the generator's JSON). When that fails, the
upstream fallbacks are tried on the raw text, in order: ``Finish[...]``, a ``"final_answer": ...`` field (also
in truncated JSON), and "The final answer is ...". No fallback matching means no answer (graded wrong).
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass

from combee.errors import ContextTooSmall, LLMParseError
from combee.llm import LLM, ChatResponse
from combee.models import Playbook
from combee.prompts import generator_request, parse_answer

__all__ = ["Extracted", "answer_one", "extract_answer"]


async def answer_one(
    llm: LLM, task: str, playbook: Playbook, *, context_tokens: int | None, gate: asyncio.Semaphore | None = None
) -> tuple[ChatResponse, Extracted]:
    """The generator's reply to ``task`` with ``playbook`` and the answer found in it. A task that cannot fit the
    model's context (``context_tokens``) is not sent: no answer (``too_long``). ``gate`` bounds the requests in
    flight. LLM-layer errors propagate."""
    try:
        request = generator_request(task, playbook, context_tokens=context_tokens)
    except ContextTooSmall as exc:  # this task alone does not fit the model's context: no answer
        return ChatResponse(text=f"(not asked: {exc})"), Extracted(None, "too_long")
    if gate is None:
        response = await llm.complete(request)
    else:
        async with gate:
            response = await llm.complete(request)
    return response, extract_answer(response.text)


@dataclass(frozen=True)
class Extracted:
    """The final answer found in a generator's raw text (``None``: none found) and how it was found:
    ``parsed`` (the project's parser), ``finish``, ``final_answer_field`` or ``final_answer_is`` (fallbacks),
    ``none``, or ``too_long`` (the question did not fit the model's context and was not asked)."""

    answer: str | None
    how: str

    @property
    def parsed(self) -> bool:
        return self.how == "parsed"


_FINISH_RE = re.compile(r"Finish\[(.*?)\]", re.DOTALL)
_FIELD_QUOTED_RE = re.compile(r'"final_answer"\s*:\s*("(?:[^"\\]|\\.)*")')
_FIELD_OPEN_RE = re.compile(r'"final_answer"\s*:\s*"([^"\n]*)')  # truncated JSON: no closing quote
_FIELD_BARE_RE = re.compile(r'"final_answer"\s*:\s*([^",}\]\s][^,}\]\n]*)')
_FINAL_IS_RE = re.compile(r"the final answer is\s*:?\s*(.+)", re.IGNORECASE)


def _field_value(text: str) -> str | None:
    if (m := _FIELD_QUOTED_RE.search(text)) is not None:
        try:
            value = json.loads(m.group(1))
        except json.JSONDecodeError:
            value = m.group(1)[1:-1]
        return str(value)
    if (m := _FIELD_OPEN_RE.search(text)) is not None:
        return m.group(1)
    if (m := _FIELD_BARE_RE.search(text)) is not None:
        return m.group(1)
    return None


def extract_answer(text: str) -> Extracted:
    """The final answer in a generator's raw answer ``text`` (see the module docstring). Never raises."""
    try:
        return Extracted(parse_answer(text), "parsed")
    except LLMParseError:
        pass
    finishes = _FINISH_RE.findall(text)
    if finishes:
        return Extracted(finishes[-1].strip(), "finish")
    value = _field_value(text)
    if value is not None:
        return Extracted(value.strip(), "final_answer_field")
    said = _FINAL_IS_RE.findall(text)
    if said:
        line = said[-1].strip().splitlines()[0] if said[-1].strip() else ""
        return Extracted(line.strip().strip("*`'\"").rstrip(".").strip(), "final_answer_is")
    return Extracted(None, "none")
