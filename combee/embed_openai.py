"""The embeddings port over any OpenAI-compatible ``/v1/embeddings`` endpoint (hosted, local, or the simulator).

Retries timeouts, 429 and 5xx a few times with exponential backoff; then raises
:class:`~combee.errors.LLMUnavailable`, which :class:`combee.embeddings.NearDuplicates` turns into "exact match
for these texts" (logged) — an embeddings outage never stops learning.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import openai
from pydantic import SecretStr

from combee.dedup import Vector
from combee.errors import LLMUnavailable
from combee.redaction import redact, redact_url, url_secrets

__all__ = ["OpenAIEmbedder"]


class OpenAIEmbedder:
    """Vectors from ``POST {base_url}/embeddings`` with ``model``; ``max_batch`` texts per request."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: SecretStr | None = None,
        *,
        timeout_s: float = 60.0,
        max_attempts: int = 4,
        max_batch: int = 128,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.max_attempts = max_attempts
        self.max_batch = max_batch
        self._rng = random.Random()
        # What an error message must never show: the key and whatever the endpoint URL carries.
        self._secrets = (*url_secrets(base_url), api_key.get_secret_value() if api_key else None)
        self._owns_client = client is None
        self._client = client or openai.AsyncOpenAI(
            api_key=(api_key or SecretStr("not-needed")).get_secret_value(),
            base_url=base_url,
            max_retries=0,
            timeout=timeout_s,
        )

    @property
    def name(self) -> str:
        return f"{self.model} at {redact_url(self.base_url)}"

    async def embed(self, texts: Sequence[str]) -> list[Vector]:
        out: list[Vector] = []
        for i in range(0, len(texts), self.max_batch):
            out.extend(await self._batch(list(texts[i : i + self.max_batch])))
        return out

    async def _batch(self, texts: list[str]) -> list[Vector]:
        for attempt in range(self.max_attempts):
            try:
                response = await self._client.embeddings.create(model=self.model, input=texts)
            except (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError) as exc:
                error: Exception = exc
            except openai.APIStatusError as exc:
                if exc.status_code < 500:
                    raise LLMUnavailable(
                        f"embeddings refused by {self.name}: HTTP {exc.status_code} ({self._redact(exc)})"
                    ) from None
                error = exc
            except openai.OpenAIError as exc:  # anything else the client raises: its text may quote the endpoint
                raise LLMUnavailable(f"embeddings from {self.name} failed: {self._redact(exc)}") from None
            else:
                rows = sorted(response.data, key=lambda d: d.index)
                if len(rows) != len(texts):
                    raise LLMUnavailable(f"{self.name} returned {len(rows)} vectors for {len(texts)} texts")
                return [tuple(float(x) for x in row.embedding) for row in rows]
            if attempt + 1 < self.max_attempts:
                await asyncio.sleep(self._rng.uniform(0, min(8.0, 0.5 * 2**attempt)))
        raise LLMUnavailable(f"embeddings from {self.name} failed {self.max_attempts} times: {self._redact(error)}")

    def _redact(self, error: BaseException) -> str:
        """``error``'s message on one line with the key and the URL's credentials masked (an endpoint's answer
        or a connection error may quote either)."""
        return redact(" ".join(str(error).split()), self._secrets)[:400]

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.close()
