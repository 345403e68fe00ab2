"""TracePublisher: validation happens before Kafka is touched, with exactly the workers' rules."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kafka.codec
import pytest

from combee.errors import ConfigError, InvalidNamespace, TraceError
from combee.models import LIMITS, Trace
from combee.settings import Settings
from combee.tracefile import parse_trace
from streams.publisher import TracePublisher, encode_trace
from streams.topics import Topics


@dataclass
class FakeFuture:
    callbacks: list[Callable[[Any], None]] = field(default_factory=list)
    errbacks: list[Callable[[BaseException], None]] = field(default_factory=list)

    def add_callback(self, fn: Callable[[Any], None]) -> FakeFuture:
        self.callbacks.append(fn)
        return self

    def add_errback(self, fn: Callable[[BaseException], None]) -> FakeFuture:
        self.errbacks.append(fn)
        return self


@dataclass
class FakeProducer:
    config: dict[str, Any]
    sent: list[tuple[str, bytes, bytes]] = field(default_factory=list)
    futures: list[FakeFuture] = field(default_factory=list)
    flushed: int = 0
    closed: bool = False

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> FakeFuture:
        assert not self.closed
        assert key is not None and value is not None, "traces are always keyed and never empty"
        self.sent.append((topic, key, value))
        future = FakeFuture()
        self.futures.append(future)
        return future

    def flush(self, timeout: float | None = None) -> None:
        self.flushed += 1

    def close(self, timeout: float | None = None) -> None:
        self.closed = True


@pytest.fixture
def made() -> list[FakeProducer]:
    return []


@pytest.fixture
def publisher(made: list[FakeProducer]) -> TracePublisher:
    def factory(**config: Any) -> FakeProducer:
        made.append(FakeProducer(config))
        return made[-1]

    return TracePublisher("127.0.0.1:9092", Topics(prefix="t"), producer_factory=factory)


def good(**overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "trace_id": "t-1",
        "namespace": "support",
        "task": "refund order 17",
        "steps": [{"kind": "action", "content": "looked up the order"}],
        "output": "refunded",
        "feedback": {"success": True},
    }
    record.update(overrides)
    return record


def test_producer_is_configured_for_durability(publisher: TracePublisher, made: list[FakeProducer]) -> None:
    config = made[0].config
    assert config["acks"] == "all"
    assert config["enable_idempotence"] is True
    assert config["allow_auto_create_topics"] is False
    assert config["bootstrap_servers"] == "127.0.0.1:9092"
    assert config["linger_ms"] <= 10
    assert config["compression_type"] == ("lz4" if kafka.codec.has_lz4() else None)
    assert publisher.topic == "t.traces"


def test_a_mapping_is_sent_keyed_by_namespace_as_compact_json(
    publisher: TracePublisher, made: list[FakeProducer]
) -> None:
    publisher.publish(good())
    [(topic, key, value)] = made[0].sent
    assert topic == "t.traces" and key == b"support"
    assert value is not None and b": " not in value and b", " not in value  # compact
    assert parse_trace(value) == parse_trace(json.dumps(good()))


def test_a_trace_object_round_trips(publisher: TracePublisher, made: list[FakeProducer]) -> None:
    trace = Trace.model_validate(good(metadata={"model": "m1", "n": 3, "none": None}))
    publisher.publish(trace)
    [(_, key, value)] = made[0].sent
    assert key == b"support" and value is not None
    assert parse_trace(value) == trace


def test_a_missing_trace_id_is_derived_the_same_way_the_workers_derive_it(
    publisher: TracePublisher, made: list[FakeProducer]
) -> None:
    record = good()
    del record["trace_id"]
    publisher.publish(record)
    publisher.publish(record)
    values = [v for _, _, v in made[0].sent]
    assert values[0] == values[1]
    assert values[0] is not None
    derived = parse_trace(values[0]).trace_id
    assert derived.startswith("h-") and derived == parse_trace(values[1]).trace_id


def test_default_namespace_fills_a_missing_namespace(made: list[FakeProducer]) -> None:
    def factory(**config: Any) -> FakeProducer:
        made.append(FakeProducer(config))
        return made[-1]

    pub = TracePublisher("k:9092", Topics(), default_namespace="fleet-a", producer_factory=factory)
    record = good()
    del record["namespace"]
    pub.publish(record)
    assert made[0].sent[0][1] == b"fleet-a"


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (good(task=""), "task"),
        ({"namespace": "support"}, "task"),
        (good(steps="not a list"), "steps"),
        (good(feedback={"score": "high"}), "feedback"),
        (good(unknown_field=1), "unknown_field"),
        (good(bullet_ids=["not-an-id"]), "bullet_ids"),
        (good(task="x" * (LIMITS.trace_bytes + 10)), "limit"),
        (good(feedback={"score": float("nan")}), "JSON"),
        (good(metadata={"s": {1, 2}}), "JSON"),
        (good(task="\ud800 lone surrogate"), "JSON"),
    ],
)
def test_invalid_traces_raise_trace_error_and_send_nothing(
    publisher: TracePublisher, made: list[FakeProducer], record: dict[str, Any], reason: str
) -> None:
    with pytest.raises(TraceError) as info:
        publisher.publish(record)
    assert reason.lower() in info.value.reason.lower()
    assert made[0].sent == []


def test_too_deep_nesting_is_refused(publisher: TracePublisher, made: list[FakeProducer]) -> None:
    nested: Any = "leaf"
    for _ in range(40):
        nested = {"x": nested}
    with pytest.raises(TraceError, match="nested"):
        publisher.publish(good(metadata={"deep": nested}))
    assert made[0].sent == []


@pytest.mark.parametrize("namespace", ["", "a:b", "has space", "{tag}", "x" * 65, 17])
def test_bad_namespaces_raise_invalid_namespace_and_send_nothing(
    publisher: TracePublisher, made: list[FakeProducer], namespace: Any
) -> None:
    with pytest.raises(InvalidNamespace):
        publisher.publish(good(namespace=namespace))
    assert made[0].sent == []


def test_an_unvalidated_trace_object_is_still_checked(publisher: TracePublisher, made: list[FakeProducer]) -> None:
    sneaky = Trace.model_construct(**{**good(), "namespace": "a:b"})
    with pytest.raises(InvalidNamespace):
        publisher.publish(sneaky)
    oversized = Trace.model_construct(**good(task="y" * (LIMITS.trace_bytes + 1)))
    with pytest.raises(TraceError, match="limit"):
        publisher.publish(oversized)
    assert made[0].sent == []


@pytest.mark.parametrize("thing", [["a", "list"], "a string", b"{}", 42, None])
def test_non_mappings_are_trace_errors(publisher: TracePublisher, made: list[FakeProducer], thing: Any) -> None:
    with pytest.raises(TraceError):
        publisher.publish(thing)
    assert made[0].sent == []


def test_publish_many_is_all_or_nothing_and_names_the_bad_one(
    publisher: TracePublisher, made: list[FakeProducer]
) -> None:
    with pytest.raises(TraceError, match="trace #2"):
        publisher.publish_many([good(trace_id="a"), good(trace_id="b"), good(task="")])
    with pytest.raises(InvalidNamespace, match="trace #1"):
        publisher.publish_many([good(trace_id="a"), good(namespace="bad ns")])
    assert made[0].sent == []
    futures = publisher.publish_many([good(trace_id="a"), good(trace_id="b", namespace="other")])
    assert len(futures) == 2
    assert [(k, parse_trace(v).trace_id) for _, k, v in made[0].sent if v] == [(b"support", "a"), (b"other", "b")]


def test_delivery_outcomes_are_counted(publisher: TracePublisher, made: list[FakeProducer]) -> None:
    publisher.publish(good(trace_id="a"))
    publisher.publish(good(trace_id="b"))
    ok, bad = made[0].futures
    for fn in ok.callbacks:
        fn(object())
    for fn2 in bad.errbacks:
        fn2(TimeoutError("delivery timed out"))
    assert (publisher.sent, publisher.delivered, publisher.failed) == (2, 1, 1)


def test_flush_close_and_context_manager(made: list[FakeProducer]) -> None:
    def factory(**config: Any) -> FakeProducer:
        made.append(FakeProducer(config))
        return made[-1]

    with TracePublisher("k:9092", producer_factory=factory) as pub:
        pub.publish(good())
        pub.flush(timeout=1)
    assert made[0].flushed == 1 and made[0].closed
    pub.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        pub.publish(good())


def test_settings_choose_topics_and_security(made: list[FakeProducer]) -> None:
    def factory(**config: Any) -> FakeProducer:
        made.append(FakeProducer(config))
        return made[-1]

    settings = Settings(kafka_bootstrap="b1:9092,b2:9092", topic_prefix="prod", partitions=8)
    pub = TracePublisher(settings, producer_factory=factory)
    assert pub.topic == "prod.traces" and pub.topics.partitions == 8
    assert made[0].config["bootstrap_servers"] == "b1:9092,b2:9092"
    assert made[0].config["security_protocol"] == "PLAINTEXT"


def test_compression_choices(monkeypatch: pytest.MonkeyPatch, made: list[FakeProducer]) -> None:
    def factory(**config: Any) -> FakeProducer:
        made.append(FakeProducer(config))
        return made[-1]

    monkeypatch.setattr(kafka.codec, "has_lz4", lambda: False)
    assert TracePublisher("k:1", compression="auto", producer_factory=factory).compression_type is None
    assert TracePublisher("k:1", compression="gzip", producer_factory=factory).compression_type == "gzip"
    with pytest.raises(ConfigError, match="lz4"):
        TracePublisher("k:1", compression="lz4", producer_factory=factory)
    monkeypatch.setattr(kafka.codec, "has_lz4", lambda: True)
    assert TracePublisher("k:1", compression="auto", producer_factory=factory).compression_type == "lz4"
    assert TracePublisher("k:1", compression="none", producer_factory=factory).compression_type is None


def test_encode_trace_returns_the_bytes_the_workers_accept() -> None:
    record = good(trajectory="did a thing")
    del record["steps"]
    trace, raw = encode_trace(record)
    assert trace.steps[0].content == "did a thing"
    assert parse_trace(raw, default_namespace="ignored") == trace


def test_an_unserialisable_constructed_trace_is_a_trace_error(
    publisher: TracePublisher, made: list[FakeProducer]
) -> None:
    broken = Trace.model_construct(**{**good(), "steps": [object()]})
    with pytest.raises(TraceError):
        publisher.publish(broken)
    assert made[0].sent == []


def test_a_publisher_with_a_producer_key_signs_what_it_sends(made: list[FakeProducer]) -> None:
    from pydantic import SecretStr

    from combee.identity import SIGNATURE_KEY, VERIFIED, IdentityPolicy, ProducerKey, verify_trace

    key = "agent-one-secret-key-0123456789"
    policy = IdentityPolicy({"agent-1": ProducerKey("agent-1", SecretStr(key), frozenset({"ns"}))})

    def factory(**config: Any) -> FakeProducer:
        made.append(FakeProducer(config))
        return made[-1]

    settings = Settings(producer_id="agent-1", producer_key=key)  # type: ignore[call-arg]
    by_settings = TracePublisher(settings, Topics(prefix="t"), producer_factory=factory)
    explicit = TracePublisher("k:9092", producer_id="agent-1", producer_key=key, producer_factory=factory)
    for pub in (by_settings, explicit):
        pub.publish({"namespace": "ns", "task": "t", "feedback": {"success": False}})
        pub.publish_many([Trace(trace_id="x", namespace="ns", task="t")])
        assert key not in repr(pub.signer)
    sent = [Trace.model_validate_json(value) for p in made for _, _, value in p.sent]
    assert len(sent) == 4 and all(verify_trace(t, policy).outcome == VERIFIED for t in sent)
    assert {t.metadata["producer"] for t in sent} == {"agent-1"} and all(SIGNATURE_KEY in t.metadata for t in sent)
    plain = TracePublisher("k:9092", producer_factory=factory)
    plain.publish({"namespace": "ns", "task": "t"})
    assert SIGNATURE_KEY not in parse_trace(made[-1].sent[-1][2]).metadata
    with pytest.raises(ConfigError):
        TracePublisher("k:9092", producer_id="agent-1", producer_factory=factory)  # an id without its key
    full = {f"m{i}": i for i in range(LIMITS.metadata_items - 1)}
    with pytest.raises(TraceError, match="could not be signed"):
        explicit.publish({"namespace": "ns", "task": "t", "metadata": full})  # no room for the signature
