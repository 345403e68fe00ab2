"""The prompt-store port: where published playbook versions live for agents to read.

Owned by the core, implemented at the edge (:class:`streams.redis_store.RedisPromptStore`). The contract:
``publish`` is one atomic compare-and-set on the version — it writes prompt text, playbook JSON, version and a
history entry together and announces the version, *only if* the stored version is older; so readers never see
a torn prompt or a version going backwards, and re-publishing is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["PromptStore", "PublishedPrompt"]


@dataclass(frozen=True)
class PublishedPrompt:
    namespace: str
    version: int
    prompt: str
    playbook_json: str
    window_id: str | None = None
    published_at: float | None = None


class PromptStore(Protocol):
    async def publish(
        self,
        namespace: str,
        version: int,
        prompt: str,
        playbook_json: str,
        *,
        window_id: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> bool:
        """Store version ``version`` if newer than the stored one; True when written, False when not newer."""
        ...

    async def current(self, namespace: str) -> PublishedPrompt | None: ...

    async def get_version(self, namespace: str, version: int) -> PublishedPrompt | None: ...
