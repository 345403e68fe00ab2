"""Finding the one JSON object in an answer: in code fences, in prose, after a reasoning block."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from combee.errors import LLMParseError

__all__ = ["first_validation_error", "load_object", "require_keys", "shown_ids"]


_REASONING_BLOCK = re.compile(r"<(think|thinking|reasoning)>.*?</\1\s*>", re.DOTALL | re.IGNORECASE)


_REASONING_CLOSE = re.compile(r"</(?:think|thinking|reasoning)\s*>", re.IGNORECASE)


def _strip_reasoning(text: str) -> str:
    text = _REASONING_BLOCK.sub("", text)
    # A server may strip the opening tag of a reasoning block and leave its end: keep what follows.
    closes = list(_REASONING_CLOSE.finditer(text))
    return text[closes[-1].end() :] if closes else text


def _balanced_spans(text: str) -> tuple[list[tuple[int, int]], bool]:
    """Spans of the outermost balanced ``{...}`` in ``text``, and whether an object is still open at its end.

    Strings are tracked only inside braces (prose quotes do not count).
    """
    spans: list[tuple[int, int]] = []
    depth, start, in_string, escaped = 0, -1, False, False
    for i, c in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"' and depth > 0:
            in_string = True
        elif c == "{":
            if depth == 0:
                start = i
            depth += 1
        elif c == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append((start, i + 1))
    return spans, depth > 0


def load_object(text: str) -> dict[str, Any]:
    """The one JSON object in a model's answer, or raise :class:`LLMParseError`.

    Accepted around it: whitespace, a code fence of any spelling (```` ```json ````, ```` ```JSON ````, none),
    prose, and ``<think>``/``<thinking>``/``<reasoning>`` blocks before it. Refused: no object, an answer
    that is JSON but not an object, and two or more *different* top-level objects (a repeated one is fine).
    """
    body = _strip_reasoning(text).strip()
    if not body:
        raise LLMParseError("the answer is empty", kind="empty")
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        pass
    else:
        if isinstance(value, dict):
            return value
        raise LLMParseError(f"the answer must be a JSON object, got a {type(value).__name__}", kind="not_object")
    found: list[dict[str, Any]] = []
    spans, still_open = _balanced_spans(body)
    for start, end in spans:
        try:
            value = json.loads(body[start:end])
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and value not in found:
            found.append(value)
    if len(found) == 1:
        return found[0]
    if found:
        raise LLMParseError(f"the answer holds {len(found)} different JSON objects; send exactly one", kind="ambiguous")
    first = body.find("{")
    if first < 0:
        raise LLMParseError("the answer holds no JSON object", kind="not_json")
    if still_open:
        raise LLMParseError("the answer is not valid JSON: it ends before the JSON object is complete", kind="not_json")
    try:
        json.loads(body[first:])
    except json.JSONDecodeError as exc:
        raise LLMParseError(
            f"the answer is not valid JSON: {exc.msg} (character {first + exc.pos})", kind="not_json"
        ) from None
    raise LLMParseError("the answer is not valid JSON", kind="not_json")


def require_keys(obj: Mapping[str, Any], keys: Sequence[str]) -> None:
    missing = [k for k in keys if k not in obj]
    if missing:
        found = ", ".join(repr(k) for k in list(obj)[:8]) or "none"
        names = ", ".join(repr(k) for k in missing)
        raise LLMParseError(f"missing required key {names} (keys found: {found})", kind="missing_key")


def first_validation_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(x) for x in first["loc"])
    return f"{loc}: {first['msg']}" if loc else str(first["msg"])


def shown_ids(ids: Collection[str] | None) -> str:
    listed = ", ".join(list(ids)[:12]) if ids else ""
    more = " …" if ids is not None and len(ids) > 12 else ""
    return f"({listed}{more})" if listed else "(none are shown)"
