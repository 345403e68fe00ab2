"""The LLM port: the one seam between the method and any model endpoint.

The core only ever talks to an object satisfying :class:`LLM`. Real implementations live at the edge
(:mod:`combee.llm_openai` for any OpenAI-compatible endpoint); tests use scripted fakes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DEFAULT_REASONING_MODELS",
    "LLM",
    "REFUSED_BY_SERVER",
    "ChatMessage",
    "ChatRequest",
    "ChatResponse",
    "KnowsContext",
    "LLMPrices",
    "Role",
    "Usage",
    "context_tokens_of",
]

DEFAULT_REASONING_MODELS = r"(?:^|/)(?:o1|o3|o4|gpt-5)(?:$|[-.:_])"
"""Model names (a regular expression, searched) of OpenAI reasoning models: they refuse ``max_tokens`` and any
temperature but their default. The ``llm_reasoning_models`` setting overrides it."""


class Role(enum.StrEnum):
    """Which part of the method a call serves; each role may use its own model."""

    REFLECTOR = "reflector"
    CURATOR = "curator"
    MERGER = "merger"
    GENERATOR = "generator"


class ChatMessage(BaseModel):
    model_config = ConfigDict(frozen=True)

    role: str  # "system" | "user" | "assistant"
    content: str


class ChatRequest(BaseModel):
    """One chat completion request, fully determined by its fields (the response cache keys on them)."""

    model_config = ConfigDict(frozen=True)

    role: Role
    messages: tuple[ChatMessage, ...]
    schema_name: str | None = None
    json_schema: Mapping[str, Any] | None = None
    max_tokens: int = 1024
    temperature: float = 0.0
    seed: int | None = None


class Usage(BaseModel):
    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0  # of prompt_tokens, those the server read from its prefix cache

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens + other.cached_prompt_tokens,
        )


class ChatResponse(BaseModel):
    """What came back. ``service_time_s`` is the server-reported service time when the server reports one
    (the simulator does, in the ``x-combee-service-time`` header); ``simulated`` is true when the server said
    it is the Combee simulator."""

    model_config = ConfigDict(frozen=True)

    text: str
    usage: Usage = Field(default_factory=Usage)
    model: str = ""
    service_time_s: float | None = None
    simulated: bool = False
    cached: bool = False
    finish_reason: str | None = None  # "stop", "length" (cut off at max_tokens), ... when the server says


REFUSED_BY_SERVER = "refused_by_server"
"""The ``finish_reason`` of an answer the server generated and then would not return: its own output parser
could not read it (llama.cpp: HTTP 500 "The model produced output that does not match the expected ... format").
Such a response has no text; the caller counts it as a rejected answer and asks again differently, because the
identical request gets the identical answer from a deterministic model."""


@runtime_checkable
class LLM(Protocol):
    """Anything that can answer a :class:`ChatRequest`.

    Implementations retry transient transport failures themselves (429, 5xx, timeouts, with backoff) and raise
    :class:`combee.errors.LLMUnavailable` / :class:`combee.errors.LLMRateLimited` only after their bounded attempts.
    They never parse content: parsing (and retrying on malformed content) is the caller's job.
    """

    async def complete(self, request: ChatRequest) -> ChatResponse: ...


@runtime_checkable
class KnowsContext(Protocol):
    """An :class:`LLM` that can say how many tokens (prompt + completion) one request of ``role`` may use.

    Optional: the core sizes requests (how much of the playbook to show, ``max_tokens``) when the LLM offers
    it, and sends them unsized otherwise (scripted fakes, replays).
    """

    async def context_tokens(self, role: Role) -> int | None: ...


async def context_tokens_of(llm: LLM, role: Role) -> int | None:
    """``llm``'s context window for ``role`` in tokens, or None when it does not know one."""
    # What isinstance(llm, KnowsContext) checks, without a runtime protocol check on every request.
    ask = getattr(llm, "context_tokens", None)
    return await ask(role) if callable(ask) else None


@dataclass(frozen=True)
class LLMPrices:
    """Dollars per 1,000 prompt / completion tokens; an unset price counts as zero."""

    per_1k_prompt: float | None = None
    per_1k_completion: float | None = None

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        prompt = (self.per_1k_prompt or 0.0) * prompt_tokens / 1000.0
        completion = (self.per_1k_completion or 0.0) * completion_tokens / 1000.0
        return prompt + completion
