"""The LLM port for any OpenAI-compatible endpoint: config, retry, structured, context_window, transport,
cache, client (:class:`OpenAILLM`) and router (:class:`RoleRouter`, one endpoint per role)."""

from combee.llm import DEFAULT_REASONING_MODELS
from combee.llm_openai.client import OpenAILLM
from combee.llm_openai.config import (
    DEFAULT_API_KEY,
    DEFAULT_CONTEXT_TOKENS,
    EndpointConfig,
    LLMStats,
    StructuredMode,
    StructuredOutput,
    is_reasoning_model,
)
from combee.llm_openai.context_window import context_from_models, context_from_props
from combee.llm_openai.retry import RatePacer, backoff_delay, reset_seconds, retry_after_from_headers
from combee.llm_openai.router import RoleRouter

__all__ = [
    "DEFAULT_API_KEY",
    "DEFAULT_CONTEXT_TOKENS",
    "DEFAULT_REASONING_MODELS",
    "EndpointConfig",
    "LLMStats",
    "OpenAILLM",
    "RatePacer",
    "RoleRouter",
    "StructuredMode",
    "StructuredOutput",
    "backoff_delay",
    "context_from_models",
    "context_from_props",
    "is_reasoning_model",
    "reset_seconds",
    "retry_after_from_headers",
]
