"""Worker state kept in Kafka: a changelog-backed table, written from anywhere.

:class:`ChangelogTable` is the classic stream-processor table — an in-memory dict whose every write is
appended to a compacted changelog topic keyed like the table, and which is rebuilt by reading the changelog
partition to its end when the partition is (re)assigned.

Library behaviour answered: ``faust.Table`` allows writes only from inside an event's context, and Combee
writes state from timers (a window closed by ``max_wait``) and from merge tasks. So the table is our own,
written through :class:`~workers.delivery.kafka_io.KafkaIO` (each write acknowledged before the value changes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

from streams.topics import partition_for
from workers.delivery.kafka_io import KafkaIO

__all__ = ["ChangelogTable"]

V = TypeVar("V")


class ChangelogTable(Generic[V]):
    """A changelog-backed table keyed by namespace (see the module docstring).

    ``recover(partition)`` must complete before a partition's keys are read; it is idempotent and guarded
    by a per-partition lock. ``forget(partition)`` drops a revoked partition so a later assignment re-reads it.
    """

    def __init__(
        self,
        io: KafkaIO,
        topic: str,
        partitions: int,
        decode: Callable[[bytes], V],
        encode: Callable[[V], bytes],
    ) -> None:
        self.io = io
        self.topic = topic
        self.partitions = partitions
        self._decode = decode
        self._encode = encode
        self._data: dict[str, V] = {}
        self._partition_of: dict[str, int] = {}
        self._recovered: set[int] = set()
        self._locks: dict[int, asyncio.Lock] = {}
        self.skipped: int = 0
        self.raw: dict[tuple[int, str], bytes] = {}  # non-table keys (e.g. checkpoints) by (partition, key)

    def partition_of(self, key: str) -> int:
        return partition_for(key.encode("utf-8"), self.partitions)

    async def recover(self, partition: int) -> None:
        if partition in self._recovered:
            return
        lock = self._locks.setdefault(partition, asyncio.Lock())
        async with lock:
            if partition in self._recovered:
                return
            async for rec in self.io.read(self.topic, partition):
                if rec.key is None:
                    continue
                key = rec.key.decode("utf-8", "replace")
                if key.startswith("__"):
                    if rec.value is not None:
                        self.raw[(partition, key)] = rec.value
                    continue
                if rec.value is None:  # tombstone
                    self._data.pop(key, None)
                    continue
                try:
                    self._data[key] = self._decode(rec.value)
                    self._partition_of[key] = partition
                except Exception:  # a record this version cannot read: skip it, count it
                    self.skipped += 1
            self._recovered.add(partition)

    def get(self, key: str) -> V | None:
        return self._data.get(key)

    async def put(self, key: str, value: V, *, cache: bool = True) -> int:
        """Write through: the changelog record is acknowledged before the in-memory value changes.

        ``cache=False`` only appends to the changelog, for a writer that decides after the write whether its
        value may replace the one here (:meth:`cache`): a combiner's tenure may end while it writes."""
        partition = self.partition_of(key)
        offset = await self.io.send(self.topic, key.encode("utf-8"), self._encode(value), partition)
        if cache:
            self.cache(key, value)
        return offset

    def cache(self, key: str, value: V) -> None:
        """Set the in-memory value of a key whose changelog record was written (see :meth:`put`)."""
        self._data[key] = value
        self._partition_of[key] = self.partition_of(key)

    async def put_raw(self, partition: int, key: str, value: bytes) -> None:
        """A partition-level record (key starting with ``__``), e.g. a checkpoint."""
        await self.io.send(self.topic, key.encode("utf-8"), value, partition)
        self.raw[(partition, key)] = value

    def forget(self, partition: int) -> None:
        self._recovered.discard(partition)
        for key in [k for k, p in self._partition_of.items() if p == partition]:
            self._data.pop(key, None)
            self._partition_of.pop(key, None)
        for raw_key in [k for k in self.raw if k[0] == partition]:
            del self.raw[raw_key]

    def keys(self, partition: int | None = None) -> list[str]:
        return [k for k, p in self._partition_of.items() if partition is None or p == partition]
