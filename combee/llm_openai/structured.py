"""Structured output: how a request's JSON schema is sent, and recognising an endpoint that refuses a mode."""

from __future__ import annotations

import json
import re
from typing import Any, get_args

import openai

from combee.llm_openai.config import StructuredMode

__all__ = [
    "FALLBACK_ORDER",
    "mentions_structured_output",
    "refused_output",
    "response_format_for",
    "valid_schema_name",
]

# "auto" tries these in order and keeps the first the endpoint accepts.
FALLBACK_ORDER: tuple[StructuredMode, ...] = get_args(StructuredMode)


_SCHEMA_NAME_INVALID = re.compile(r"[^A-Za-z0-9_-]")


_STRUCTURED_OUTPUT_WORDS = (
    "response_format",
    "response format",
    "json_schema",
    "json schema",
    "json_object",
    "schema",
    "structured output",
)


_REFUSED_OUTPUT_WORDS = ("produced output that does not match",)
"""How a server says it generated an answer and its own output parser could not read it (llama.cpp's
chat-format parser: "The model produced output that does not match the expected peg-native format")."""


def valid_schema_name(name: str | None) -> str:
    # OpenAI requires ^[A-Za-z0-9_-]{1,64}$; a bad name would be a 400 that "auto" mistakes for no support.
    cleaned = _SCHEMA_NAME_INVALID.sub("_", name or "")[:64]
    return cleaned or "response"


def response_format_for(mode: StructuredMode | None, name: str, schema: dict[str, Any] | None) -> dict[str, Any] | None:
    if schema is None or mode is None or mode == "none":
        return None
    if mode == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    if mode == "json_object_schema":
        return {"type": "json_object", "schema": schema}
    return {"type": "json_object"}


def _error_text(exc: openai.APIStatusError) -> str:
    """The error's message and body, lower-cased, for the word checks below."""
    try:
        body = json.dumps(exc.body, default=str)
    except (TypeError, ValueError):
        body = str(exc.body)
    return f"{exc.message} {body}".lower()


def mentions_structured_output(exc: openai.APIStatusError) -> bool:
    text = _error_text(exc)
    return any(word in text for word in _STRUCTURED_OUTPUT_WORDS)


def refused_output(exc: openai.APIStatusError) -> bool:
    """True if ``exc`` is the server refusing to return an answer it generated (see :data:`_REFUSED_OUTPUT_WORDS`).

    Not a transient error: a deterministic model writes the same answer to the same request again.
    """
    if exc.status_code < 500:
        return False
    text = _error_text(exc)
    return any(words in text for words in _REFUSED_OUTPUT_WORDS)
