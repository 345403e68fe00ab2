"""Worker state kept in Kafka: changelog-backed tables and bounded reads of a log partition.

:class:`ChangelogTable` is the classic stream-processor table — an in-memory dict whose every write is
appended to a compacted changelog topic keyed like the table, and which is rebuilt by reading the changelog
partition to its end when the partition is (re)assigned. We keep our own instead of ``faust.Table`` because
Faust only allows table writes from inside an event's context, and Combee writes state from timers (a window
closed by ``max_wait``) and from merge tasks. Writes are awaited (acks=all) before the caller moves on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.topics import partition_for

__all__ = ["ChangelogTable", "KafkaIO", "LogRecord"]

V = TypeVar("V")


@dataclass(frozen=True)
class LogRecord:
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int


SendFn = Callable[[str, bytes, bytes, int], Awaitable[tuple[int, int]]]


class KafkaIO:
    """Awaited sends (through the worker's producer) and bounded reads of one partition (own consumer)."""

    def __init__(
        self,
        send: SendFn,
        bootstrap: str,
        consumer_kwargs: dict[str, Any] | None = None,
        group_id: str | None = None,
    ) -> None:
        self._send = send
        self._bootstrap = bootstrap
        self._consumer_kwargs = consumer_kwargs or {}
        self.group_id = group_id  # the worker's consumer group, for committed()

    async def send(self, topic: str, key: bytes, value: bytes, partition: int) -> int:
        """Send and wait for the broker's acknowledgement; returns the record's offset."""
        _, offset = await self._send(topic, key, value, partition)
        return offset

    async def committed(self, topic: str, partition: int) -> int | None:
        """The worker group's committed offset of ``topic``/``partition`` (None when it has none)."""
        return (await self.committed_offsets([(topic, partition)]))[(topic, partition)]

    async def committed_offsets(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int | None]:
        """The worker group's committed offsets of ``(topic, partition)`` pairs, in one request (None: none)."""
        if self.group_id is None or not partitions:
            return dict.fromkeys(partitions)
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(bootstrap_servers=self._bootstrap, **self._consumer_kwargs)
        await admin.start()
        try:
            tps = [TopicPartition(t, p) for t, p in partitions]
            offsets = await admin.list_consumer_group_offsets(self.group_id, partitions=tps)
        finally:
            await admin.close()
        found: dict[tuple[str, int], int | None] = {}
        for key, tp in zip(partitions, tps, strict=True):
            meta = offsets.get(tp)
            found[key] = meta.offset if meta is not None and meta.offset >= 0 else None
        return found

    async def read(self, topic: str, partition: int, start: int = 0) -> AsyncGenerator[LogRecord, None]:
        """Records of ``topic``/``partition`` from ``start`` up to the end offset seen when called."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_partition_fetch_bytes=16 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
            **self._consumer_kwargs,
        )
        await consumer.start()
        try:
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            begin = (await consumer.beginning_offsets([tp]))[tp]
            position = max(start, begin)
            if position >= end:
                return
            consumer.seek(tp, position)
            while position < end:
                batch = await consumer.getmany(tp, timeout_ms=1000, max_records=500)
                for msg in batch.get(tp, []):
                    position = msg.offset + 1
                    if msg.offset >= end:
                        return
                    yield LogRecord(msg.offset, msg.key, msg.value, msg.timestamp)
                if not batch:
                    position = await consumer.position(tp)
        finally:
            await consumer.stop()


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
