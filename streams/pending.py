"""Lessons waiting for corroboration, in Redis (the storage of :mod:`combee.corroborate`'s pending pool).

Per namespace, one hash (``RedisKeys.pending``): pending id -> JSON :class:`~combee.corroborate.PendingLesson`.
The combiner that owns the namespace loads it once per tenure and then keeps the pool in memory, writing the
entries each window changed (and deleting the ones that went live or were dropped) after the window is
committed. ``combee bullet list NS --pending`` reads it. Never read into a prompt.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from combee.corroborate import PendingLesson
from streams.keys import RedisKeys

__all__ = ["PendingStore"]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class PendingStore:
    """The pending pools of one Redis (redis-py asyncio client)."""

    def __init__(self, redis: Any, keys: RedisKeys | None = None) -> None:
        self._redis = redis
        self.keys = keys or RedisKeys()

    async def entries(self, namespace: str) -> list[PendingLesson]:
        """The pool of ``namespace`` in pool order: least recently supported first (unreadable entries skipped)."""
        raw = await self._redis.hgetall(self.keys.pending(namespace))
        out: list[PendingLesson] = []
        for value in raw.values():
            try:
                out.append(PendingLesson.model_validate_json(_text(value)))
            except ValidationError:
                continue
        return sorted(out, key=lambda e: (e.supported_at, e.id))

    async def save(self, namespace: str, write: Iterable[PendingLesson], delete: Iterable[str]) -> None:
        """Write the entries ``write`` and delete the ids ``delete`` of ``namespace``'s pool, in one transaction."""
        key = self.keys.pending(namespace)
        mapping = {e.id: e.model_dump_json() for e in write}
        gone = sorted(set(delete) - set(mapping))
        if not mapping and not gone:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            if mapping:
                pipe.hset(key, mapping=mapping)
            if gone:
                pipe.hdel(key, *gone)
            await pipe.execute()
