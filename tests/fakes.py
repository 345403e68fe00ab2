"""Test doubles for the core's seams. One scripted LLM serves most tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from combee.llm import ChatRequest, ChatResponse, Role, Usage
from combee.tokens import estimate_tokens

Script = Callable[[ChatRequest], str]


@dataclass
class ScriptedLLM:
    """Answers with ``script(request)``; records every request; optional per-role latency (real sleep)."""

    script: Script
    latency: dict[Role, float] = field(default_factory=dict)
    service_time: float | None = None
    requests: list[ChatRequest] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.requests.append(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            delay = self.latency.get(request.role, 0.0)
            if delay:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)
            text = self.script(request)
        finally:
            self.in_flight -= 1
        return ChatResponse(
            text=text,
            usage=Usage(
                prompt_tokens=sum(estimate_tokens(m.content) for m in request.messages),
                completion_tokens=estimate_tokens(text),
            ),
            service_time_s=self.service_time,
        )

    def calls(self, role: Role) -> list[ChatRequest]:
        return [r for r in self.requests if r.role == role]


def user_text(request: ChatRequest) -> str:
    return "\n".join(m.content for m in request.messages if m.role == "user")


def block_lines(request: ChatRequest, name: str) -> list[dict]:
    text = user_text(request)
    start = text.index(f"<{name}>\n") + len(name) + 3
    end = text.index(f"\n</{name}>")
    return [json.loads(line) for line in text[start:end].splitlines() if line.strip()]


def echo_script(request: ChatRequest) -> str:
    """A well-behaved model: one insight per trace (its task text), curators ADD every insight, merges keep all."""
    if request.role == Role.REFLECTOR:
        trace = block_lines(request, "trace")[0]
        return json.dumps(
            {"diagnosis": "ok", "insights": [{"section": "lessons", "content": f"lesson: {trace['task']}"}],
             "bullet_tags": []}
        )  # fmt: skip
    if request.role == Role.CURATOR:
        ops = [
            {"op": "ADD", "section": i["section"], "content": i["content"], "bullet_id": None}
            for r in block_lines(request, "reflections")
            for i in r["insights"]
        ]
        return json.dumps({"operations": ops})
    if request.role == Role.MERGER:
        return json.dumps({"keep": [p["id"] for p in block_lines(request, "proposals")], "combine": []})
    return json.dumps({"answer": "42"})


@dataclass
class GroupEmbedder:
    """An embedder for tests: texts containing a phrase of group g share vector g; anything else gets its own.

    ``groups`` lists phrases per group; vectors are one-hot, so a text is near exactly its group's others.
    ``fail`` makes every call raise (an embeddings outage).
    """

    groups: list[list[str]]
    fail: bool = False
    calls: int = 0
    texts: int = 0
    name: str = "group-embedder (test)"

    async def embed(self, texts: list[str] | tuple[str, ...]) -> list[tuple[float, ...]]:
        self.calls += 1
        if self.fail:
            raise RuntimeError("embeddings endpoint down")
        self.texts += len(texts)
        dim = len(self.groups) + 4096
        out = []
        for t in texts:
            low = t.lower()
            g = next((i for i, phrases in enumerate(self.groups) if any(p in low for p in phrases)), None)
            k = g if g is not None else len(self.groups) + sum(map(ord, low)) * 31 % 4096
            out.append(tuple(1.0 if i == k else 0.0 for i in range(dim)))
        return out
