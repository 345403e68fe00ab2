"""What a failed request to an OpenAI-compatible endpoint means: retry it (a :class:`Failure`), or give up at
once (:class:`~combee.errors.LLMUnavailable` with an explanation a user can act on). Pure, apart from the
exception it raises; the client (:mod:`combee.llm_openai.client`) counts, paces and backs off.

Every text here that may quote the server is redacted of the API key before it is cut short, so a cut can
never leave a prefix of the key behind.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import openai

from combee.errors import LLMUnavailable
from combee.llm_openai.config import StructuredMode
from combee.llm_openai.retry import retry_after_from_headers
from combee.llm_openai.structured import mentions_structured_output

__all__ = ["RETRYABLE_STATUS_REASONS", "SERVER_MESSAGE_LIMIT", "Failure", "classify_status", "redact", "server_message"]

RETRYABLE_STATUS_REASONS = {408: "request_timeout", 409: "conflict", 429: "rate_limited"}
"""HTTP statuses below 500 worth another attempt, by the reason they are counted under."""

SERVER_MESSAGE_LIMIT = 300
"""Characters of the server's message kept in an error (after redaction)."""


@dataclass(frozen=True)
class Failure:
    """One failed attempt that may be retried."""

    reason: str  # key of LLMStats.retries
    detail: str  # human-readable, already free of the API key
    status: int | None = None
    retry_after_s: float | None = None


def redact(text: str, key: str) -> str:
    """``text`` with ``key`` replaced by ``[redacted]`` (a "key" under 4 characters is a placeholder, and
    replacing it would garble the message)."""
    return text.replace(key, "[redacted]") if len(key) >= 4 else text


def server_message(exc: openai.APIStatusError, key: str) -> str:
    """The server's message in ``exc``, on one line, redacted of ``key``, at most :data:`SERVER_MESSAGE_LIMIT`
    characters."""
    body = exc.body
    if isinstance(body, Mapping):
        text = body.get("message") if isinstance(body.get("message"), str) else None
        if not text:
            text = json.dumps(body, default=str, ensure_ascii=False)
    elif isinstance(body, str):
        text = body
    elif body is None:
        text = ""
    else:
        text = json.dumps(body, default=str, ensure_ascii=False)
    text = redact(" ".join(text.split()), key)  # before truncating
    if len(text) > SERVER_MESSAGE_LIMIT:
        text = text[: SERVER_MESSAGE_LIMIT - 1] + "…"
    return text


def classify_status(
    exc: openai.APIStatusError, model: str, mode: StructuredMode | None, *, where: str, auto: bool, message: str
) -> Failure:
    """A retryable failure for ``exc`` (408, 409, 429, 5xx: with the server's Retry-After hint), or raise
    :class:`LLMUnavailable` saying what to check. ``where``: the endpoint as shown to users; ``auto``: whether
    the structured-output mode was negotiated; ``message``: :func:`server_message` of ``exc``."""
    status = exc.status_code
    detail = f"HTTP {status}" + (f": {message}" if message else "")
    if status in RETRYABLE_STATUS_REASONS or status >= 500:
        reason = RETRYABLE_STATUS_REASONS.get(status, "server_error")
        return Failure(reason, detail, status=status, retry_after_s=retry_after_from_headers(exc.response.headers))
    if status == 401:
        explanation = "the endpoint rejected the API key (check OPENAI_API_KEY / api_key)"
    elif status == 403:
        explanation = f"the API key may not use model {model!r} or this endpoint"
    elif status == 404:
        explanation = (
            f"not found: check that base_url includes the API prefix (e.g. /v1) and that model {model!r} exists"
        )
    elif mode is not None and mode != "none" and mentions_structured_output(exc):
        if auto:
            explanation = (
                f"the endpoint refused this request's response_format in mode {mode!r}, which it has"
                " accepted before: check this request's JSON schema"
            )
        else:
            explanation = (
                f"the endpoint refused the request's response_format (structured_output={mode!r};"
                " structured_output='auto' finds a form the endpoint accepts)"
            )
    else:
        explanation = "the endpoint refused the request; retrying would not help"
    # `from None`: the openai exception's text may quote whatever the server echoed back.
    raise LLMUnavailable(f"{where}: {explanation} ({detail})") from None
