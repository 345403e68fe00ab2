"""How to reach one OpenAI-compatible endpoint (:class:`EndpointConfig`), and what a client counted
(:class:`LLMStats`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from combee.llm import DEFAULT_REASONING_MODELS, LLMPrices, Role, Usage
from combee.redaction import endpoint_url

__all__ = [
    "DEFAULT_API_KEY",
    "DEFAULT_CONTEXT_TOKENS",
    "EndpointConfig",
    "HttpTransport",
    "LLMStats",
    "StructuredMode",
    "StructuredOutput",
    "is_reasoning_model",
]

DEFAULT_API_KEY = "not-needed"
"""What local servers (llama.cpp, the Combee simulator) get as a bearer token when no key is configured."""


DEFAULT_CONTEXT_TOKENS = 32_768
"""Context window assumed when the server does not say (a hosted model's is usually larger)."""


StructuredMode = Literal["json_schema", "json_object_schema", "json_object", "none"]
"""How a request's JSON schema is sent: see :class:`EndpointConfig`."""


StructuredOutput = Literal["auto", "json_schema", "json_object_schema", "json_object", "none"]


HttpTransport = Literal["auto", "aiohttp", "httpx"]
"""The HTTP library under the ``openai`` client: see :class:`EndpointConfig`."""


class EndpointConfig(BaseModel):
    """One OpenAI-compatible endpoint and how to talk to it. Frozen; invalid values raise
    :class:`pydantic.ValidationError` naming the field and the reason.

    ``base_url`` includes the API prefix, as ``OPENAI_BASE_URL`` does (``http://127.0.0.1:8080/v1``). An empty
    or missing ``api_key`` becomes :data:`DEFAULT_API_KEY`, so
    ``EndpointConfig(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ.get("OPENAI_API_KEY"),
    default_model=...)`` works for hosted and local servers alike. The key is a :class:`SecretStr`: it never
    appears in ``repr``, logs or error messages.

    ``structured_output`` decides how a request's JSON schema is sent: ``json_schema`` (OpenAI's strict
    ``{"type": "json_schema", ...}``), ``json_object_schema`` (llama.cpp's ``{"type": "json_object", "schema":
    ...}``), ``json_object`` (JSON mode, no schema), ``none`` (nothing; the caller's strict parser copes), or
    ``auto``: try them in that order, falling back when the server rejects one with 400/422, and remember
    the first that works.

    ``http_transport`` picks the HTTP library under the ``openai`` client: ``aiohttp`` (the client's
    ``DefaultAioHttpClient``; about half the client CPU per request of the default, which matters when a
    hundred calls start at once), ``httpx`` (the client's default), or ``auto``: aiohttp when the installed
    ``openai`` offers it, httpx otherwise. Requests, answers, errors and retries are the same either way.

    ``context_tokens`` is the context window assumed for a model whose server does not report one
    (:meth:`OpenAILLM.context_tokens` asks the server first). ``reasoning_models`` is a regular expression
    searched in the model name: a match is sent ``max_completion_tokens`` instead of ``max_tokens`` and no
    temperature (an empty pattern matches nothing).

    Costs are computed only when at least one price is set; a missing price counts as zero.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str
    api_key: SecretStr = SecretStr(DEFAULT_API_KEY)
    default_model: str
    models: Mapping[Role, str] = Field(default_factory=dict)
    structured_output: StructuredOutput = "auto"
    max_concurrency: int = Field(default=64, ge=1)
    # Send at most as many requests at once as the server has slots, when it says (llama.cpp's /props).
    match_server_slots: bool = True
    # The least time an attempt is given; it grows with what the endpoint is measured to need (OpenAILLM.timeout_for).
    timeout_s: float = Field(default=120.0, gt=0, allow_inf_nan=False)
    max_attempts: int = Field(default=6, ge=1)
    backoff_base_s: float = Field(default=0.5, gt=0, allow_inf_nan=False)
    backoff_max_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    http_transport: HttpTransport = "auto"
    price_per_1k_prompt: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    price_per_1k_completion: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    cache_dir: Path | None = None
    context_tokens: int = Field(default=DEFAULT_CONTEXT_TOKENS, ge=256)
    reasoning_models: str = DEFAULT_REASONING_MODELS

    @field_validator("reasoning_models")
    @classmethod
    def _check_reasoning_models(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        value = value.strip()
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "must be an absolute http(s) URL including the API prefix, e.g. http://127.0.0.1:8080/v1"
                f" (got {endpoint_url(value)!r})"
            )
        return value

    @field_validator("api_key", mode="before")
    @classmethod
    def _default_api_key(cls, value: object) -> object:
        raw = value.get_secret_value() if isinstance(value, SecretStr) else value
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return SecretStr(DEFAULT_API_KEY)
        if isinstance(raw, str):
            # A key read from a file often carries a trailing newline, which would be an invalid header.
            return SecretStr(raw.strip())
        return value

    @field_validator("default_model")
    @classmethod
    def _check_default_model(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must name a model (sent as `model` by every role without its own model)")
        return value.strip()

    @field_validator("models")
    @classmethod
    def _check_models(cls, value: Mapping[Role, str]) -> Mapping[Role, str]:
        empty = sorted(role.value for role, model in value.items() if not model.strip())
        if empty:
            raise ValueError(f"empty model name for role(s) {', '.join(empty)}; omit a role to use default_model")
        return {role: model.strip() for role, model in value.items()}

    @model_validator(mode="after")
    def _check_backoff(self) -> EndpointConfig:
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError(f"backoff_max_s ({self.backoff_max_s}) must be >= backoff_base_s ({self.backoff_base_s})")
        return self

    def model_for(self, role: Role) -> str:
        """The model name sent for ``role``: ``models[role]`` if set, else ``default_model``."""
        return self.models.get(role, self.default_model)

    @property
    def display_url(self) -> str:
        """``base_url`` without credentials, query or fragment, for logs and messages."""
        return endpoint_url(self.base_url)

    def cost_usd(self, usage: Usage) -> float | None:
        """Dollar cost of ``usage`` at the configured prices, or ``None`` when no price is configured."""
        if self.price_per_1k_prompt is None and self.price_per_1k_completion is None:
            return None
        prices = LLMPrices(self.price_per_1k_prompt, self.price_per_1k_completion)
        return prices.cost_usd(usage.prompt_tokens, usage.completion_tokens)


class LLMStats(BaseModel):
    """A snapshot of one :class:`OpenAILLM`'s counters since it was created.

    ``usage``/``usage_by_role``/``cost_usd`` count answers that came over HTTP (what the endpoint bills);
    answers replayed from the cache are counted in ``cached_usage`` only. ``retries`` maps a reason
    (``rate_limited``, ``server_error``, ``request_timeout``, ``conflict``, ``timeout``, ``connection``,
    ``bad_response``) to how many retries it caused. ``structured_mode`` is what a schema request would be
    sent with now; ``structured_mode_settled`` is false while ``auto`` is still probing.
    """

    model_config = ConfigDict(frozen=True)

    requests: int = 0
    successes: int = 0
    failures: int = 0
    attempts: int = 0
    retries: Mapping[str, int] = Field(default_factory=dict)
    backoff_s: float = 0.0
    cooldown_waits: int = 0
    paced_waits: int = 0
    paced_s: float = 0.0
    structured_mode: StructuredMode = "json_schema"
    structured_mode_settled: bool = False
    structured_fallbacks: int = 0
    refused_answers: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    usage: Usage = Field(default_factory=Usage)
    usage_by_role: Mapping[Role, Usage] = Field(default_factory=dict)
    estimated_usage_responses: int = 0
    cached_usage: Usage = Field(default_factory=Usage)
    cost_usd: float | None = None


def is_reasoning_model(model: str, pattern: str = DEFAULT_REASONING_MODELS) -> bool:
    """True if ``model`` names a reasoning model by ``pattern`` (searched, case-insensitive; "" matches none)."""
    return bool(pattern) and re.search(pattern, model, re.IGNORECASE) is not None
