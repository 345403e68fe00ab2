"""Quarantined bullets and the operators' audit log in Redis (the storage of :mod:`combee.quarantine`).

Per namespace (key names: :class:`streams.keys.RedisKeys`):

* ``quarantine`` — hash: quarantine id -> JSON :class:`~combee.quarantine.QuarantinedBullet`. Written by the
  combiner after the window that held the bullet back is committed (the delta record carries the entries too,
  so a combiner that replays the log after a crash writes them again); never read into a prompt.
* ``quarantine:resolved`` — set of the ids an operator released or removed: a replayed window does not bring
  them back.
* ``audit`` — stream: one entry per operator action (:class:`~combee.quarantine.AuditEntry`), appended, never
  trimmed or edited by Combee.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from combee.quarantine import AuditEntry, QuarantinedBullet
from streams.keys import RedisKeys

__all__ = ["QuarantineStore"]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class QuarantineStore:
    """Quarantined bullets and the audit log of one Redis (redis-py asyncio client)."""

    def __init__(self, redis: Any, keys: RedisKeys | None = None) -> None:
        self._redis = redis
        self.keys = keys or RedisKeys()

    async def hold(self, entries: Sequence[QuarantinedBullet]) -> int:
        """Store ``entries`` (an id already stored keeps its first entry; a resolved id is not stored again).
        Returns how many were new."""
        added = 0
        for e in entries:
            if await self._redis.sismember(self.keys.quarantine_resolved(e.namespace), e.id):
                continue
            added += int(await self._redis.hsetnx(self.keys.quarantine(e.namespace), e.id, e.model_dump_json()))
        return added

    async def entries(self, namespace: str) -> list[QuarantinedBullet]:
        """The quarantined bullets of ``namespace``, oldest first (unreadable entries are skipped)."""
        raw = await self._redis.hgetall(self.keys.quarantine(namespace))
        out: list[QuarantinedBullet] = []
        for value in raw.values():
            try:
                out.append(QuarantinedBullet.model_validate_json(_text(value)))
            except ValidationError:
                continue
        return sorted(out, key=lambda e: (e.quarantined_at, e.id))

    async def get(self, namespace: str, quarantine_id: str) -> QuarantinedBullet | None:
        raw = await self._redis.hget(self.keys.quarantine(namespace), quarantine_id)
        return QuarantinedBullet.model_validate_json(_text(raw)) if raw is not None else None

    async def resolve(self, namespace: str, quarantine_id: str) -> bool:
        """Take ``quarantine_id`` out of the quarantine for good (released or removed); False if it was not there."""
        await self._redis.sadd(self.keys.quarantine_resolved(namespace), quarantine_id)
        return bool(await self._redis.hdel(self.keys.quarantine(namespace), quarantine_id))

    async def audit(self, entry: AuditEntry) -> str:
        """Append ``entry`` to its namespace's audit log; returns the stream entry id."""
        fields = {k: ("" if v is None else str(v)) for k, v in entry.model_dump().items()}
        return _text(await self._redis.xadd(self.keys.audit(entry.namespace), fields))

    async def audit_log(self, namespace: str, count: int | None = None) -> list[tuple[str, AuditEntry]]:
        """The audit log of ``namespace``, oldest first (the last ``count`` entries when given)."""
        if count is None:
            rows = await self._redis.xrange(self.keys.audit(namespace))
        else:
            rows = list(reversed(await self._redis.xrevrange(self.keys.audit(namespace), count=count)))
        out: list[tuple[str, AuditEntry]] = []
        for entry_id, raw in rows:
            fields = {_text(k): _text(v) for k, v in raw.items()}
            data: dict[str, Any] = {k: (v if v != "" else None) for k, v in fields.items()}
            data["outcome"] = fields.get("outcome", "")
            out.append((_text(entry_id), AuditEntry.model_validate(data)))
        return out
