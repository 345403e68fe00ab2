"""The seam between the simulator's HTTP server and its behaviour (world) model.

The server owns transport, latency, queueing and faults; a :class:`Responder` owns *what* is answered. A
responder sees only what any OpenAI-compatible server would see — the request body — never who sent it or
which learning method is running.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Responder", "SimRequest", "request_digest"]

_EXCLUDED_FROM_DIGEST = ("stream", "stream_options", "user")  # transport only: they change no answer


def request_digest(seed: int, body: Mapping[str, Any]) -> bytes:
    """sha256 of ``f"{seed}|"`` + the canonical JSON of ``body`` minus stream/stream_options/user: what seeds a
    request's answer (its first 8 bytes) and its fault draws, over HTTP and in process alike."""
    kept = {k: v for k, v in body.items() if k not in _EXCLUDED_FROM_DIGEST}
    canonical = json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{seed}|{canonical}".encode()).digest()


@dataclass(frozen=True)
class SimRequest:
    """A decoded ``/v1/chat/completions`` request body."""

    model: str
    messages: Sequence[Mapping[str, Any]]
    response_format: Mapping[str, Any] | None = None
    tools: Sequence[Mapping[str, Any]] | None = None
    tool_choice: Any = None
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None

    def text_of(self, role: str) -> str:
        """All message contents of one role, joined by blank lines (string or text-part contents)."""
        parts: list[str] = []
        for message in self.messages:
            if message.get("role") != role:
                continue
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(
                    str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text"
                )
        return "\n\n".join(parts)


class Responder(Protocol):
    """Behaviour model: the assistant message content for a request it recognises, else ``None``.

    ``rng`` is seeded by the server from (server seed, the canonical request body), so the same request always
    gets the same answer whatever the arrival order. A responder must be pure given ``rng``.
    """

    def respond(self, request: SimRequest, rng: random.Random) -> str | None: ...
