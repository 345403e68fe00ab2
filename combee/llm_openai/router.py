"""One :class:`~combee.llm.LLM` over several endpoints: each role sent to its own."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from combee.llm import ChatRequest, ChatResponse, Role, Usage
from combee.llm_openai.client import OpenAILLM
from combee.llm_openai.config import LLMStats

__all__ = ["RoleRouter"]


class RoleRouter:
    """:class:`~combee.llm.LLM` that sends each role to its own endpoint: ``routes[role]``, else ``default``.

    Each endpoint keeps its own client, concurrency limit, retries and context window. ``stats`` adds the
    endpoints' counters up (``structured_mode`` is the default endpoint's); :meth:`aclose` closes them all.
    """

    def __init__(self, default: OpenAILLM, routes: Mapping[Role, OpenAILLM]) -> None:
        self._default = default
        self._routes = dict(routes)

    def endpoint(self, role: Role) -> OpenAILLM:
        return self._routes.get(role, self._default)

    def _endpoints(self) -> list[OpenAILLM]:
        return list({id(e): e for e in (self._default, *self._routes.values())}.values())

    async def complete(self, request: ChatRequest) -> ChatResponse:
        return await self.endpoint(request.role).complete(request)

    async def context_tokens(self, role: Role) -> int:
        return await self.endpoint(role).context_tokens(role)

    @property
    def stats(self) -> LLMStats:
        parts = [e.stats for e in self._endpoints()]
        first = parts[0]
        retries: Counter[str] = Counter()
        by_role: dict[Role, Usage] = {}
        for part in parts:
            retries.update(part.retries)
            for role, usage in part.usage_by_role.items():
                by_role[role] = by_role.get(role, Usage()) + usage
        costs = [part.cost_usd for part in parts if part.cost_usd is not None]
        counters: tuple[str, ...] = ("requests", "successes", "failures", "attempts", "backoff_s", "cooldown_waits")
        counters += ("structured_fallbacks", "refused_answers", "cache_hits", "cache_misses")
        counters += ("estimated_usage_responses",)
        summed = {name: sum(getattr(part, name) for part in parts) for name in counters}
        return first.model_copy(
            update={
                **summed,
                "retries": dict(retries),
                "usage": sum((part.usage for part in parts), Usage()),
                "usage_by_role": by_role,
                "cached_usage": sum((part.cached_usage for part in parts), Usage()),
                "cost_usd": sum(costs) if costs else None,
            }
        )

    async def aclose(self) -> None:
        for endpoint in self._endpoints():
            await endpoint.aclose()
