"""The OpenAI wire format as the simulator speaks it: decoding a chat request, its digest, and the JSON, SSE and
headers of an answer."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from combee.sim.generic import (
    Answer,
    InvalidRequest,
    requested_schema,
)
from combee.sim.latency import ServiceTime
from combee.sim.protocol import SimRequest, request_digest
from combee.sim.serving import Admission, format_duration
from combee.tokens import estimate_tokens

__all__ = [
    "PER_MESSAGE_TOKENS",
    "assistant_message",
    "decode_chat",
    "error_response",
    "json_response",
    "rate_headers",
    "request_digest",
    "stream_pieces",
    "timing_headers",
]


PER_MESSAGE_TOKENS = 4
"""Prompt tokens charged per message on top of its text (role and delimiters, as chat templates add)."""


_JSON = "application/json"


@dataclass(frozen=True)
class _Chat:
    request: SimRequest
    stream: bool
    include_usage: bool
    prompt_tokens: int
    prompt_text: str


def _message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    parts: list[str] = []
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        parts.extend(str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                parts.append(str(function.get("name", "")))
                parts.append(str(function.get("arguments", "")))
    return "".join(parts) if len(parts) != 1 else parts[0]


def _positive_int(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest(f"{key} must be a positive integer", key)
    return value


def decode_chat(body: Any) -> _Chat:
    """Validate a ``/v1/chat/completions`` body like a strict OpenAI-compatible server would."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model is required", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise InvalidRequest("messages must be a non-empty list of message objects", "messages")
    n = body.get("n")
    if n is not None and n != 1:
        raise InvalidRequest("the simulator supports only n = 1 (one choice per request)", "n")
    stream = body.get("stream") is True
    options = body.get("stream_options")
    include_usage = stream and isinstance(options, dict) and options.get("include_usage") is True
    response_format = body.get("response_format")
    if response_format is not None and not isinstance(response_format, dict):
        raise InvalidRequest("response_format must be an object", "response_format")
    requested_schema(response_format)  # validates its shape
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise InvalidRequest("tools must be a list of tool objects", "tools")
    max_tokens = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    temperature = body.get("temperature")
    seed = body.get("seed")
    request = SimRequest(
        model=model,
        messages=messages,
        response_format=response_format,
        tools=tools or None,
        tool_choice=body.get("tool_choice"),
        max_tokens=max_tokens,
        temperature=float(temperature) if isinstance(temperature, int | float) else None,
        seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
    )
    texts = [_message_text(m) for m in messages]
    prompt_tokens = sum(estimate_tokens(t) + PER_MESSAGE_TOKENS for t in texts)
    # what prefix caching compares: the messages in order, each with its role (a chat template's layout)
    prompt_text = "".join(f"<|{m.get('role')}|>{t}" for m, t in zip(messages, texts, strict=True))
    return _Chat(request, stream, include_usage, prompt_tokens, prompt_text)


def json_response(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> web.Response:
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    return web.Response(status=status, body=body, content_type=_JSON, headers=headers)


def error_response(
    status: int,
    message: str,
    kind: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    payload = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return json_response(status, payload, headers)


def assistant_message(answer: Answer) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.content, "refusal": None}
    if answer.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in answer.tool_calls
        ]
    return message


def rate_headers(admission: Admission, time_scale: float) -> dict[str, str]:
    """OpenAI's ``x-ratelimit-*`` headers (reset times scaled by ``time_scale`` like every simulated delay)."""
    return {
        "x-ratelimit-limit-requests": str(admission.limit_requests),
        "x-ratelimit-remaining-requests": str(admission.remaining_requests),
        "x-ratelimit-reset-requests": format_duration(admission.reset_requests_s * time_scale),
        "x-ratelimit-limit-tokens": str(admission.limit_tokens),
        "x-ratelimit-remaining-tokens": str(admission.remaining_tokens),
        "x-ratelimit-reset-tokens": format_duration(admission.reset_tokens_s * time_scale),
    }


def timing_headers(service: ServiceTime, queue_s: float) -> dict[str, str]:
    # repr: exact round-trip, so tiny time_scales keep full precision
    return {"x-combee-service-time": repr(service.total_s), "x-combee-queue-time": repr(queue_s)}


def stream_pieces(text: str, count: int) -> list[str]:
    if count <= 1 or len(text) <= count:
        return [text] if text else []
    size = math.ceil(len(text) / count)
    return [text[i : i + size] for i in range(0, len(text), size)]
