"""Replay: relearn a namespace's traces, still in Kafka, into another namespace with the same engine.

The replay reads the source namespace's partition of the traces topic from a start (earliest, an offset or a
time) up to the end offsets it saw when it began — bounded, however many traces arrive meanwhile — and offers
the traces to the workers as windows of the *target* namespace on the windows topic. The running workers
then map, curate, merge and apply them exactly as live windows.

With ``windows="logged"`` the windows are cut where the source's were (read from the deltas log) and keep
the source's shuffle seeds, so with the same model answers (the response cache) the replay reproduces the
source's playbook; traces outside any logged window get fresh windows of ``batch_size``.

Traces a forget rule names (``combee traces forget``, :mod:`combee.forget`) are left out: a replay is how a
namespace is relearned without them. A logged window that held one is cut afresh. Given the workers' producer
identity policy (:mod:`combee.identity`), the traces the live window stage refuses (unsigned where signatures
are required, or signed but not verified) are left out too, and the verified producers of the others travel
with their windows, checked against the *source* namespace (the one they were signed for).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from combee.errors import CombeeError, ConfigError
from combee.forget import ForgetRule, forgotten
from combee.identity import IdentityPolicy, verify_trace
from combee.models import Trace, validate_namespace
from combee.plan import window_id
from streams.codec import CodecError, decode_trace, encode
from streams.deltalog import split_log
from streams.envelopes import DeltaRecord, WindowEnvelope
from streams.kafka_config import kafka_security_kwargs, require_kafka
from streams.topics import partition_for

if TYPE_CHECKING:
    from streams.settings import StreamSettings

__all__ = ["ReplayReport", "replay"]


@dataclass(frozen=True)
class ReplayReport:
    partition: int
    first_offset: int
    end_offset: int
    traces: int
    windows: int
    windows_from_log: int
    forgotten: int = 0  # traces of the namespace left out because a forget rule names them
    refused: int = 0  # traces left out because the identity policy refuses them (combee.identity)


@dataclass
class _Collected:
    traces: dict[int, Trace]
    producers: dict[int, str]  # offset -> verified producer
    forgotten: int = 0
    refused: int = 0


def _collect(
    records: Sequence[Any], namespace: str, rules: Sequence[ForgetRule], identity: IdentityPolicy | None
) -> _Collected:
    """The traces of ``namespace`` among ``records`` that learning may use, and their verified producers."""
    out = _Collected({}, {})
    for msg in records:
        try:
            trace = decode_trace(msg.value, msg.key)
        except CodecError:
            continue  # the live pipeline dead-lettered it too
        if trace.namespace != namespace:
            continue
        verdict = verify_trace(trace, identity) if identity is not None else None
        if verdict is not None and verdict.refused:
            out.refused += 1
        elif forgotten(trace, rules):
            out.forgotten += 1
        else:
            out.traces[msg.offset] = trace
            if verdict is not None and verdict.producer is not None:
                out.producers[msg.offset] = verdict.producer
    return out


def _start_offset(consumer: KafkaConsumer, tp: TopicPartition, start: str) -> int:
    begin = consumer.beginning_offsets([tp])[tp]
    if start == "earliest":
        return int(begin)
    if start.lstrip("-").isdigit():
        return max(int(begin), int(start))
    try:
        when = datetime.fromisoformat(start)
    except ValueError:
        raise ConfigError(f"--from must be 'earliest', an offset or an ISO time, got {start!r}") from None
    found = consumer.offsets_for_times({tp: int(when.timestamp() * 1000)})[tp]
    return int(found.offset) if found is not None else int(consumer.end_offsets([tp])[tp])


def _read(consumer: KafkaConsumer, tp: TopicPartition, start: int, end: int) -> list[Any]:
    consumer.assign([tp])
    consumer.seek(tp, start)
    out: list[Any] = []
    while consumer.position(tp) < end:
        for msg in consumer.poll(timeout_ms=1000).get(tp, []):
            if msg.offset >= end:
                return out
            out.append(msg)
    return out


def replay(
    settings: StreamSettings,
    *,
    namespace: str,
    into: str,
    start: str = "earliest",
    batch_size: int,
    windows: str = "logged",
    rules: Sequence[ForgetRule] = (),
    identity: IdentityPolicy | None = None,
) -> ReplayReport:
    """Offer ``namespace``'s traces from ``start`` to the end offset seen now as windows of ``into``, leaving out
    every trace one of ``rules`` names and, given ``identity``, every trace it refuses."""
    validate_namespace(namespace)
    validate_namespace(into)
    if into == namespace:
        raise ConfigError("replay into a different namespace (or a new lineage name), not into the source")
    topics = settings.topics()
    part = partition_for(namespace.encode(), topics.partitions)
    security = kafka_security_kwargs(settings)
    require_kafka(settings)
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False, **security)
    try:
        tp = TopicPartition(topics.traces, part)
        end = int(consumer.end_offsets([tp])[tp])
        first = _start_offset(consumer, tp, start)
        collected = _collect(_read(consumer, tp, first, end), namespace, rules, identity)
        traces, left_out = collected.traces, collected.forgotten
        logged: list[DeltaRecord] = []
        if windows == "logged":
            dtp = TopicPartition(topics.deltas, part)
            dend = int(consumer.end_offsets([dtp])[dtp])
            # judged from its beginning, which is offset 0: the log is kept forever (Topics.specs)
            dbegin = int(consumer.beginning_offsets([dtp])[dtp])
            judged = split_log((part, m.offset, m.value) for m in _read(consumer, dtp, dbegin, dend))
            logged = [r for r in judged.records(namespace) if r.offsets]  # valid ones only: no fenced window
    finally:
        consumer.close()
    if not traces:
        also = f" ({left_out} forgotten)" if left_out else ""
        raise CombeeError(
            f"no traces of {namespace!r}{also} in {topics.traces}[{part}] from offset {first} to {end - 1}"
        )
    plan = _cut(traces, logged, batch_size, namespace, part)
    source = f"replay:{namespace}:p{part}"
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", **security)
    try:
        for offsets, seed_key in plan:
            env = WindowEnvelope(
                window_id=window_id(into, source, offsets[0], offsets[-1]),
                namespace=into,
                source=source,
                first_offset=offsets[0],
                last_offset=offsets[-1],
                offsets=tuple(offsets),
                seed_key=seed_key,
                closed_by="replay",
                traces=tuple(traces[o].model_copy(update={"namespace": into}) for o in offsets),
                closed_at=time.time(),
                verified_producers={
                    traces[o].trace_id: collected.producers[o] for o in offsets if o in collected.producers
                },
            )
            producer.send(topics.windows, key=into.encode(), value=encode(env))
        producer.flush(60)
    finally:
        producer.close()
    return ReplayReport(
        partition=part,
        first_offset=first,
        end_offset=end,
        traces=len(traces),
        windows=len(plan),
        windows_from_log=sum(1 for _, key in plan if not key.startswith("fresh:")),
        forgotten=left_out,
        refused=collected.refused,
    )


def _cut(
    traces: dict[int, Trace], logged: list[DeltaRecord], size: int, namespace: str, part: int
) -> list[tuple[list[int], str]]:
    """Window boundaries in offset order: the logged ones (in log order) that lie within the replayed range,
    then fresh windows of ``size`` for the traces no logged window covered."""
    plan: list[tuple[list[int], str]] = []
    covered: set[int] = set()
    for record in sorted(logged, key=lambda r: r.version):
        offsets = [o for o in record.offsets if o in traces and o not in covered]
        if offsets and len(offsets) == len(record.offsets):
            plan.append((offsets, record.seed_key or record.window_id))
            covered.update(offsets)
    rest = sorted(o for o in traces if o not in covered)
    for i in range(0, len(rest), size):
        chunk = rest[i : i + size]
        plan.append((chunk, "fresh:" + window_id(namespace, f"p{part}", chunk[0], chunk[-1])))
    return plan
