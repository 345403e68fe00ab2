"""Awaited sends and bounded reads of one partition: what Faust's app does not offer a stage.

Library behaviour answered: Faust's producer can send and wait, but Faust has no way to read one partition of
a topic from an offset up to its end (the combiner replays its deltas log, a changelog table is rebuilt, a
skipped offset is read back), nor to ask for its own group's committed offset of a partition. Each bounded read
here is its own aiokafka consumer with no group (it commits nothing and joins no rebalance), and the committed
offsets come from aiokafka's admin client. Writes are awaited (acks=all) before the caller moves on.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

__all__ = ["KafkaIO", "LogRecord"]


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
