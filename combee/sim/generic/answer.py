"""What a generic answer is made of (:class:`Answer`, :class:`ToolCall`) and the request errors the server
answers with HTTP 400."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from combee.errors import CombeeError

__all__ = ["AUTO_TOOL_CALL_P", "CHARS_PER_TOKEN", "SOFT_DEPTH", "Answer", "InvalidRequest", "SchemaError", "ToolCall"]


AUTO_TOOL_CALL_P = 0.8
"""With ``tool_choice`` ``"auto"`` (or absent), the probability that the generic answer is a tool call."""


SOFT_DEPTH = 4
"""Nesting depth past which generated instances go minimal, so recursive schemas terminate."""


CHARS_PER_TOKEN = 4  # matches combee.tokens: truncating to max_tokens·4 characters gives ≤ max_tokens


class InvalidRequest(CombeeError, ValueError):
    """The request cannot be answered as sent; the server answers HTTP 400. ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class SchemaError(InvalidRequest):
    """A JSON schema is malformed, unsupported (external ``$ref``) or admits no (finite) value."""


@dataclass(frozen=True)
class ToolCall:
    """One function call of an assistant message; ``arguments`` is JSON text (possibly truncated/broken)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Answer:
    """The assistant message the server will send, before transport concerns.

    ``schema`` is what ``content`` (or, for tool calls, the first call's ``arguments``) is meant to satisfy,
    if known; ``is_json`` says the content is meant to be JSON at all. Both guide the malformed-content fault.
    """

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    schema: Mapping[str, Any] | None = None
    is_json: bool = False
    source: str = "generic"

    @property
    def completion_text(self) -> str:
        """The text whose tokens are the completion: the content, or the tool calls' arguments."""
        if self.tool_calls:
            return "".join(call.arguments for call in self.tool_calls)
        return self.content or ""
