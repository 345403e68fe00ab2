"""One exception root for everything Combee raises on purpose.

Bad *data* (a malformed trace, an unparsable LLM answer) is a value: it is counted, dead-lettered or skipped.
These exceptions are for conditions a caller must handle or report: a systemic failure (the LLM endpoint is
gone), a contract violation (a namespace that is not a safe key), or a bad option.
"""

from __future__ import annotations

__all__ = [
    "PARSE_FAILURE_KINDS",
    "TRACE_ERROR_KINDS",
    "CombeeError",
    "ConfigError",
    "ContextTooSmall",
    "InvalidNamespace",
    "KafkaUnreachable",
    "LLMError",
    "LLMParseError",
    "LLMRateLimited",
    "LLMUnavailable",
    "TopicMissing",
    "TraceError",
]


TRACE_ERROR_KINDS = ("empty", "oversized", "encoding", "json", "shape", "invalid")
"""Every :attr:`TraceError.kind` (the metrics start a series at 0 for each)."""
PARSE_FAILURE_KINDS = (
    "empty",
    "not_json",
    "not_object",
    "ambiguous",
    "missing_key",
    "bad_shape",
    "too_many",
    "no_valid_items",
    "refused_by_server",
)
"""Every :attr:`LLMParseError.kind` the parsers raise (the metrics start a series at 0 for each)."""


class CombeeError(Exception):
    """Root of every exception Combee raises deliberately."""


class ConfigError(CombeeError):
    """A setting or option is invalid; the message says which and why."""


class InvalidNamespace(CombeeError, ValueError):
    """A namespace name is not safe to use as a Kafka key and a Redis key component."""


class TopicMissing(CombeeError):
    """A Kafka topic Combee needs does not exist. ``topic`` names it; the message also gives the command that
    creates it (topics are created by deployment, ``combee topics create``, not by the first writer)."""

    def __init__(self, topic: str, message: str) -> None:
        super().__init__(message)
        self.topic = topic


class KafkaUnreachable(CombeeError):
    """No Kafka bootstrap address accepts a connection. ``bootstrap`` names them; the message says how to start
    a local broker (``combee dev up``)."""

    def __init__(self, bootstrap: str, message: str) -> None:
        super().__init__(message)
        self.bootstrap = bootstrap


class TraceError(CombeeError, ValueError):
    """A trace record could not be decoded or validated; ``reason`` is a short, loggable explanation and
    ``kind`` names the failure for counting (``empty``, ``oversized``, ``encoding``, ``json``, ``shape``,
    ``invalid``)."""

    def __init__(self, reason: str, kind: str = "invalid") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


class LLMError(CombeeError):
    """Base of LLM-layer failures."""


class LLMUnavailable(LLMError):
    """The endpoint could not be reached or kept failing (5xx, timeouts) after the bounded retries."""


class LLMRateLimited(LLMError):
    """The endpoint rate-limited us after the bounded retries; ``retry_after_s`` is its last hint, if any."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class LLMParseError(LLMError, ValueError):
    """An LLM answer did not parse into the expected structure. Never applied half-parsed.

    ``kind`` names the failure for counting (``empty``, ``not_json``, ``not_object``, ``ambiguous``,
    ``missing_key``, ``bad_shape``, ``too_many``, ``no_valid_items``, ``refused_by_server``: the server would
    not return the answer it generated, see :data:`combee.llm.REFUSED_BY_SERVER`); the message says precisely
    what was wrong, in words a model can act on when it is sent back as a repair turn.
    """

    def __init__(self, message: str, kind: str = "invalid") -> None:
        super().__init__(message)
        self.kind = kind


class ContextTooSmall(LLMError):
    """Even the smallest useful request does not fit the model's context window; the message has the numbers."""

    def __init__(self, message: str, *, context_tokens: int, prompt_tokens: int, completion_tokens: int) -> None:
        super().__init__(message)
        self.context_tokens = context_tokens
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
