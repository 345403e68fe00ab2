"""Compatibility probe: aiokafka against the broker deploy/local/ runs.

Checks, each printed as PASS/FAIL: admin create_topics, a plain producer/consumer round trip, an idempotent
producer (enable_idempotence=True), and a transactional producer read by a read_committed consumer (a
committed transaction is seen, an aborted one is not), plus send_offsets_to_transaction (consume-transform-
produce). Exit code 0 only if all pass.

    python -m deploy.local exec -- .venv/bin/python deploy/probes/aiokafka_probe.py
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from deploy.probes import Checks


async def _drain(consumer: AIOKafkaConsumer, want: int, timeout_s: float = 20) -> list[bytes]:
    values: list[bytes] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while len(values) < want and loop.time() < deadline:
        batches = await consumer.getmany(timeout_ms=500)
        for records in batches.values():
            values.extend(r.value for r in records if r.value is not None)
    return values


async def run(checks: Checks, bootstrap: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    plain, txn_topic, out_topic = (f"probe.ak.{name}.{suffix}" for name in ("plain", "txn", "out"))

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    with checks.step("admin create_topics"):
        await admin.create_topics([NewTopic(t, 2, 1) for t in (plain, txn_topic, out_topic)])
        assert {plain, txn_topic, out_topic} <= set(await admin.list_topics())

    with checks.step("producer/consumer round trip (acks=all)"):
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        for i in range(50):
            await producer.send(plain, key=str(i % 5).encode(), value=f"m{i}".encode())
        await producer.flush()
        await producer.stop()
        consumer = AIOKafkaConsumer(
            plain,
            bootstrap_servers=bootstrap,
            group_id=f"probe-ak-{suffix}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        values = await _drain(consumer, 50)
        await consumer.commit()
        await consumer.stop()
        assert len(set(values)) == 50, len(values)

    with checks.step("idempotent producer (enable_idempotence=True)"):
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        await producer.start()
        metas = [await producer.send_and_wait(plain, value=f"idem{i}".encode()) for i in range(20)]
        await producer.stop()
        assert all(m.offset >= 0 for m in metas)

    with checks.step("transactional producer: committed visible, aborted hidden (read_committed)"):
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"probe-txn-{suffix}")
        await producer.start()
        async with producer.transaction():
            for i in range(10):
                await producer.send(txn_topic, value=f"committed{i}".encode())
        await producer.begin_transaction()
        for i in range(10):
            await producer.send(txn_topic, value=f"aborted{i}".encode())
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send(txn_topic, value=b"committed-last")
        await producer.stop()
        consumer = AIOKafkaConsumer(
            txn_topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", isolation_level="read_committed"
        )
        await consumer.start()
        values = await _drain(consumer, 11)
        await consumer.stop()
        assert sorted(values) == sorted([f"committed{i}".encode() for i in range(10)] + [b"committed-last"]), values

    with checks.step("consume-transform-produce: send_offsets_to_transaction"):
        group = f"probe-ak-ctp-{suffix}"
        consumer = AIOKafkaConsumer(
            plain,
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        await consumer.start()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"probe-ctp-{suffix}")
        await producer.start()
        batches = await consumer.getmany(timeout_ms=5000)
        while not batches:
            batches = await consumer.getmany(timeout_ms=5000)
        offsets = {}
        async with producer.transaction():
            for tp, records in batches.items():
                for r in records:
                    await producer.send(out_topic, value=(r.value or b"").upper())
                offsets[tp] = records[-1].offset + 1
            await producer.send_offsets_to_transaction(offsets, group)
        # The offsets become visible once the transaction markers are written, a moment after commit.
        committed: dict[object, int | None] = {}
        for _ in range(50):
            committed = {tp: await consumer.committed(tp) for tp in offsets}
            if committed == offsets:
                break
            await asyncio.sleep(0.2)
        await producer.stop()
        await consumer.stop()
        assert committed == offsets, (committed, offsets)

    await admin.delete_topics([plain, txn_topic, out_topic])
    await admin.close()


def main() -> int:
    checks = Checks("aiokafka")
    asyncio.run(run(checks, os.environ["COMBEE_KAFKA_BOOTSTRAP"]))
    return checks.report()


if __name__ == "__main__":
    sys.exit(main())
