"""The HTTP layer under the ``openai`` client: its transport, and reading a raw response into a
:class:`~combee.llm.ChatResponse`."""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import openai

from combee.errors import ConfigError
from combee.llm import ChatResponse, Usage
from combee.llm_openai.config import HttpTransport
from combee.llm_openai.retry import finite_non_negative
from combee.tokens import estimate_tokens

__all__ = [
    "HTTP_RESPONSE",
    "BadResponse",
    "cause_text",
    "connection_refused",
    "http_client",
    "plain_json",
    "read_response",
]


def _http_response_class() -> type[Any]:
    """The response class of the HTTP library under the installed ``openai`` (httpx2 from openai 3, httpx before).

    Passed as ``cast_to`` so the client hands back the raw HTTP response instead of parsing it.
    """
    for base in openai.DefaultAsyncHttpxClient.__mro__:
        library = base.__module__.split(".")[0]
        if library in ("httpx", "httpx2"):
            response_class: type[Any] = importlib.import_module(library).Response
            return response_class
    raise ImportError("cannot tell which HTTP library the installed openai package is built on")


HTTP_RESPONSE = _http_response_class()


def http_client(transport: HttpTransport, timeout_s: float) -> Any:
    """The ``http_client`` for ``openai.AsyncOpenAI`` (None: the client's own httpx default).

    Raises :class:`~combee.errors.ConfigError` if ``aiohttp`` is asked for and the installed ``openai`` lacks it.
    """
    if transport == "httpx":
        return None
    factory = getattr(openai, "DefaultAioHttpClient", None)
    try:
        if factory is None:
            raise RuntimeError("this openai version has no DefaultAioHttpClient")
        return factory(timeout=timeout_s)
    except RuntimeError as exc:  # the openai package without its aiohttp extra
        if transport == "aiohttp":
            raise ConfigError(f"http_transport='aiohttp' is not available: {exc}") from None
        return None


class BadResponse(Exception):
    """A 2xx whose body is not a usable chat completion."""


def plain_json(value: Mapping[str, Any]) -> dict[str, Any]:
    """A plain-dict deep copy of a JSON schema (ChatRequest may hold any Mapping), preserving key order."""
    copied = json.loads(json.dumps(value, default=_to_builtin))
    if not isinstance(copied, dict):
        raise TypeError("json_schema must be a JSON object")
    return copied


def _to_builtin(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return list(value)
    raise TypeError(f"json_schema holds a value that is not JSON: {type(value).__name__}")


def connection_refused(exc: BaseException) -> bool:
    """True when a connection error (refused, reset) is somewhere in ``exc``'s cause chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ConnectionError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def cause_text(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause):
        return f"{type(cause).__name__}: {cause}"
    return str(exc) or type(exc).__name__


def read_response(
    headers: Mapping[str, str], body: bytes, model: str, messages: list[dict[str, str]]
) -> tuple[ChatResponse, bool]:
    """The answer in a 2xx ``body`` and whether its usage was estimated (the server sent none).

    Raises :class:`BadResponse` if the body is not a chat completion (not JSON, no ``choices[0].message``).
    """
    try:
        completion = json.loads(body)
        choice = completion["choices"][0]
        message = choice["message"]
        content = message.get("content")
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        raise BadResponse(f"{type(exc).__name__}: {exc}"[:200]) from exc
    text = content if isinstance(content, str) else ""

    served_model = completion.get("model")
    usage = _usage_of(completion.get("usage"))
    if usage is None:
        usage = Usage(
            prompt_tokens=sum(estimate_tokens(message["content"]) for message in messages),
            completion_tokens=estimate_tokens(text),
        )
        estimated = True
    else:
        estimated = False

    response = ChatResponse(
        text=text,
        usage=usage,
        model=served_model if isinstance(served_model, str) and served_model else model,
        service_time_s=_service_time(headers.get("x-combee-service-time")),
        simulated=(headers.get("x-combee-simulated") or "").strip().lower() == "true",
        finish_reason=finish if isinstance(finish := choice.get("finish_reason"), str) else None,
    )
    return response, estimated


def _usage_of(usage: object) -> Usage | None:
    if not isinstance(usage, Mapping):
        return None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    valid = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (prompt, completion))
    if not valid or not isinstance(prompt, int):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    if not isinstance(cached, int) or isinstance(cached, bool) or cached < 0:
        cached = 0
    return Usage(prompt_tokens=prompt, completion_tokens=completion, cached_prompt_tokens=min(cached, prompt))


def _service_time(value: str | None) -> float | None:
    return None if value is None else finite_non_negative(value.strip())
