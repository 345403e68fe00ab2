"""The agent-side trace producer: validate a trace exactly as the workers will, then send it to Kafka.

:class:`TracePublisher` runs every trace through :func:`combee.tracefile.parse_trace` — the one place a raw
trace is validated — *before* anything reaches Kafka, so a trace the workers would dead-letter is refused at
the source with the same reason. Records are keyed by namespace (UTF-8), so one namespace's traces share a
partition and stay in order; the value is the validated compact JSON.

Producer settings (kafka-python 3.0 against Kafka 4.x): ``acks="all"``, the idempotent producer on
(``enable_idempotence=True``: broker-assigned producer id + sequence numbers, so the client's own retries
cannot duplicate or reorder a record), retries unbounded but limited in time by ``delivery_timeout_ms``,
a small ``linger_ms``, lz4 compression when the ``lz4`` package is installed (else none), and no topic
auto-creation (topics come from :func:`streams.kafka_config.ensure_topics`, i.e. ``combee topics create``).
Before its first record the publisher asks the cluster once whether its topic exists, so a missing topic is
one clear :class:`~combee.errors.TopicMissing` (naming the topic and the command that creates it) rather than
kafka-python's ``KafkaTimeoutError`` after ``max_block_ms``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import SecretStr, ValidationError

from combee.errors import ConfigError, InvalidNamespace, TopicMissing, TraceError
from combee.feedback import FeedbackRecord, sign_feedback
from combee.identity import TraceSigner
from combee.models import Feedback, Trace, validate_namespace
from combee.tracefile import parse_trace
from streams.kafka_config import (
    bootstrap_servers,
    create_topics_command,
    kafka_security_kwargs,
    missing_topics,
    require_kafka,
)
from streams.topics import Topics

if TYPE_CHECKING:
    from kafka.producer.future import FutureRecordMetadata

    from streams.settings import StreamSettings

__all__ = ["Compression", "FeedbackPublisher", "ProducerLike", "TracePublisher", "encode_trace"]

log = logging.getLogger(__name__)

Compression = Literal["auto", "lz4", "gzip", "none"]


class ProducerLike(Protocol):
    """The part of kafka-python's KafkaProducer the publisher uses (tests inject a fake)."""

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> Any: ...

    def flush(self, timeout: float | None = None) -> None: ...

    def close(self, timeout: float | None = None) -> None: ...


def encode_trace(trace: Trace | Mapping[str, Any], *, default_namespace: str | None = None) -> tuple[Trace, bytes]:
    """Validate ``trace`` and return ``(the parsed Trace, the compact JSON bytes to send)``.

    The bytes returned are exactly the bytes :func:`~combee.tracefile.parse_trace` accepted, so the workers
    decode the same Trace (a missing ``trace_id`` is derived from these bytes, stably). A Mapping goes through
    ``json.dumps`` (no NaN/Infinity) and ``parse_trace``; a Trace is dumped and re-checked the same way, which
    also enforces the encoded-size limit. ``default_namespace`` fills a Mapping's missing namespace.

    Raises :class:`~combee.errors.InvalidNamespace` for a namespace that is not a safe key, and
    :class:`~combee.errors.TraceError` (with the reason) for anything else the workers would refuse.
    """
    if isinstance(trace, Trace):
        validate_namespace(trace.namespace)
        try:
            raw = trace.model_dump_json().encode("utf-8")
        except (TypeError, ValueError) as exc:  # only a Trace built with model_construct() can get here
            raise TraceError(f"trace could not be serialised: {exc}"[:300]) from None
    elif isinstance(trace, Mapping):
        record = dict(trace)
        if "namespace" not in record and default_namespace is not None:
            record["namespace"] = default_namespace
        if "namespace" in record:
            validate_namespace(record["namespace"])
        try:
            text = json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            raw = text.encode("utf-8")
        except (TypeError, ValueError) as exc:  # UnicodeEncodeError (lone surrogates) is a ValueError
            raise TraceError(f"trace is not JSON-serialisable: {exc}"[:300]) from None
        except RecursionError:
            raise TraceError("trace is nested too deeply") from None
    else:
        raise TraceError(f"a trace must be a combee.models.Trace or a mapping, got {type(trace).__name__}")
    return parse_trace(raw), raw


def _compression_type(compression: Compression) -> str | None:
    import kafka.codec

    if compression == "none":
        return None
    if compression == "gzip":
        return "gzip"
    if kafka.codec.has_lz4():
        return "lz4"
    if compression == "lz4":
        raise ConfigError("lz4 compression needs the 'lz4' package, which is not installed (use 'auto' or 'none')")
    return None


class TracePublisher:
    """Send agent traces to the ``traces`` topic; usable as a context manager (closes, flushing, on exit).

    ``kafka`` is a bootstrap string (``"host:9092,host2:9092"``) or Kafka settings (then their security
    settings apply, see :func:`streams.kafka_config.kafka_security_kwargs`, and ``topics`` defaults to its
    ``topic_prefix``). Construction connects to the cluster (kafka-python bootstraps eagerly) and raises
    kafka-python's ``NoBrokersAvailable`` if it cannot, or ConfigError for bad settings.

    ``topic_exists`` answers whether a topic exists; it is asked once, before the first record is sent, and
    again on later sends for as long as the answer was no. The default asks the cluster (one metadata request
    through an admin client, bounded by ``max_block_ms``); with an injected ``producer_factory`` there is no
    cluster to ask, so the topic counts as existing unless ``topic_exists`` is given too.

    ``producer_id`` and ``producer_key`` (or, with settings, ``COMBEE_PRODUCER_ID`` and ``COMBEE_PRODUCER_KEY``)
    make it sign every trace as that producer (:mod:`combee.identity`: ``metadata["producer"]`` and
    ``metadata["producer_signature"]``, an HMAC-SHA256 over the whole trace and its namespace), which workers
    holding the producer's key record as verified. Neither set: traces go unsigned, as before.

    ``publish``/``publish_many`` are thread-safe (kafka-python's producer is). Delivery is asynchronous: the
    returned futures resolve to the record metadata or fail after ``delivery_timeout_ms``; failures are also
    logged and counted in ``failed`` so a fire-and-forget caller still learns about them.
    """

    def __init__(
        self,
        kafka: StreamSettings | str,
        topics: Topics | None = None,
        *,
        client_id: str = "combee-trace-publisher",
        linger_ms: int = 5,
        compression: Compression = "auto",
        max_block_ms: int = 10_000,
        delivery_timeout_ms: int = 120_000,
        idempotent: bool = True,
        default_namespace: str | None = None,
        producer_factory: Callable[..., ProducerLike] | None = None,
        topic_exists: Callable[[str], bool] | None = None,
        producer_id: str | None = None,
        producer_key: SecretStr | str | None = None,
    ) -> None:
        if not isinstance(kafka, str) and producer_id is None and producer_key is None:
            producer_id, producer_key = kafka.producer_id, kafka.producer_key
        self.signer = TraceSigner.of(producer_id, producer_key)
        if topics is None:
            topics = Topics() if isinstance(kafka, str) else kafka.topics()
        if default_namespace is not None:
            validate_namespace(default_namespace)
        self.topics = topics
        self.topic = topics.traces
        self.default_namespace = default_namespace
        self._bootstrap = bootstrap_servers(kafka)
        security = {} if isinstance(kafka, str) else kafka_security_kwargs(kafka)
        self._security_protocol = security.get("security_protocol", "PLAINTEXT")
        self.compression_type = _compression_type(compression)
        if topic_exists is None:
            if producer_factory is None:

                def topic_exists(name: str) -> bool:
                    return not missing_topics(kafka, [name], timeout_s=max_block_ms / 1000)

            else:

                def topic_exists(name: str) -> bool:
                    return True

        self._topic_exists = topic_exists
        self._topic_seen = False
        if producer_factory is None:
            from kafka import KafkaProducer

            require_kafka(self._bootstrap)
            producer_factory = KafkaProducer
        self._producer: ProducerLike = producer_factory(
            bootstrap_servers=self._bootstrap,
            client_id=client_id,
            acks="all",
            enable_idempotence=idempotent,
            linger_ms=linger_ms,
            compression_type=self.compression_type,
            max_block_ms=max_block_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            allow_auto_create_topics=False,
            **security,
        )
        self._closed = False
        self.sent = 0
        self.delivered = 0
        self.failed = 0

    def __repr__(self) -> str:
        return (
            f"TracePublisher(bootstrap={self._bootstrap!r}, topic={self.topic!r}, "
            f"security_protocol={self._security_protocol!r}, compression={self.compression_type!r})"
        )

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this TracePublisher is closed")

    def _check_topic(self) -> None:
        if self._topic_seen:
            return
        if not self._topic_exists(self.topic):
            command = create_topics_command(self._bootstrap, self.topics)
            raise TopicMissing(self.topic, f"Kafka topic {self.topic} does not exist; create it with: {command}")
        self._topic_seen = True

    def _send(self, trace: Trace | FeedbackRecord, raw: bytes) -> FutureRecordMetadata:
        self._check_topic()
        future = self._producer.send(self.topic, value=raw, key=trace.namespace.encode("utf-8"))
        self.sent += 1
        if hasattr(future, "add_callback"):
            trace_id = trace.trace_id
            future.add_callback(self._on_delivered)
            future.add_errback(lambda exc: self._on_failed(trace_id, exc))
        return future

    def send_record(self, record: Trace | FeedbackRecord, raw: bytes) -> FutureRecordMetadata:
        """Send ``raw`` (already validated, keyed by ``record``'s namespace) to this publisher's topic."""
        return self._send(record, raw)

    def check_open(self) -> None:
        self._check_open()

    def _on_delivered(self, _metadata: Any) -> None:
        self.delivered += 1

    def _on_failed(self, trace_id: str, exc: BaseException) -> None:
        self.failed += 1
        log.warning("trace %s was not delivered to %s: %s: %s", trace_id, self.topic, type(exc).__name__, exc)

    def publish(self, trace: Trace | Mapping[str, Any]) -> FutureRecordMetadata:
        """Validate one trace and send it; returns kafka-python's future for the record's metadata.

        Raises InvalidNamespace / TraceError (see :func:`encode_trace`) without sending anything;
        :class:`~combee.errors.TopicMissing` when the cluster has no traces topic (nothing sent);
        RuntimeError after :meth:`close`; kafka-python's ``KafkaTimeoutError`` when the producer cannot take
        the record within ``max_block_ms`` (no metadata for the topic, or a full buffer).
        """
        self._check_open()
        parsed, raw = self._encode(trace)
        return self._send(parsed, raw)

    def publish_many(self, traces: Iterable[Trace | Mapping[str, Any]]) -> list[FutureRecordMetadata]:
        """Validate *all* traces first, then send them in order: one invalid trace means nothing is sent.

        Raises TraceError / InvalidNamespace naming the position (``trace #3: ...``) of the first bad one, and
        TopicMissing before sending anything when the traces topic does not exist.
        """
        self._check_open()
        encoded: list[tuple[Trace, bytes]] = []
        for i, trace in enumerate(traces):
            try:
                encoded.append(self._encode(trace))
            except TraceError as exc:
                raise TraceError(f"trace #{i}: {exc.reason}") from None
            except InvalidNamespace as exc:
                raise InvalidNamespace(f"trace #{i}: {exc}") from None
        return [self._send(parsed, raw) for parsed, raw in encoded]

    def _encode(self, trace: Trace | Mapping[str, Any]) -> tuple[Trace, bytes]:
        """Validated (and signed, when this publisher has a producer key) as :func:`encode_trace` does."""
        parsed, raw = encode_trace(trace, default_namespace=self.default_namespace)
        if self.signer is None:
            return parsed, raw
        try:
            return encode_trace(self.signer.sign(parsed))
        except ValidationError as exc:  # the producer's two metadata entries took it over a limit
            raise TraceError(f"trace could not be signed: {exc.errors()[0]['msg']}"[:300]) from None

    def flush(self, timeout: float | None = None) -> None:
        """Block until every record sent so far is acknowledged or failed (kafka-python raises
        KafkaTimeoutError if ``timeout`` seconds pass first)."""
        self._check_open()
        self._producer.flush(timeout=timeout)

    def close(self, timeout: float | None = None) -> None:
        """Flush and close the producer (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._producer.close(timeout=timeout)

    def __enter__(self) -> TracePublisher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class FeedbackPublisher:
    """Send trusted feedback (:class:`combee.feedback.FeedbackRecord`) to the ``feedback`` topic, signed as
    ``producer_id`` with ``producer_key`` (or, with settings, ``COMBEE_PRODUCER_ID`` / ``COMBEE_PRODUCER_KEY``).

    Workers learn a record only in a namespace whose feedback is trusted (``COMBEE_FEEDBACK``), and only from a
    producer whose key grants ``"feedback"`` for that namespace (docs/security.md, "Trusted feedback"). An
    unsigned record is always refused, so a key is required: ConfigError without one. Connection, delivery and
    the topic check are :class:`TracePublisher`'s (the same producer settings; keyword arguments pass through).
    """

    def __init__(
        self,
        kafka: StreamSettings | str,
        topics: Topics | None = None,
        *,
        producer_id: str | None = None,
        producer_key: SecretStr | str | None = None,
        client_id: str = "combee-feedback-publisher",
        **kwargs: Any,
    ) -> None:
        if not isinstance(kafka, str) and producer_id is None and producer_key is None:
            producer_id, producer_key = kafka.producer_id, kafka.producer_key
        signer = TraceSigner.of(producer_id, producer_key)
        if signer is None:
            raise ConfigError(
                "trusted feedback must be signed: set producer_id and producer_key (COMBEE_PRODUCER_ID/_KEY)"
            )
        self.signer = signer
        self._out = TracePublisher(kafka, topics, client_id=client_id, producer_id=None, producer_key=None, **kwargs)
        self._out.topic = self._out.topics.feedback

    @property
    def failed(self) -> int:
        """Records whose delivery failed so far (logged too)."""
        return self._out.failed

    def __repr__(self) -> str:
        return f"FeedbackPublisher(producer={self.signer.producer!r}, topic={self._out.topic!r})"

    def publish(self, namespace: str, trace_id: str, feedback: Feedback | Mapping[str, Any]) -> FutureRecordMetadata:
        """Sign and send the feedback of trace ``trace_id`` of ``namespace``; returns kafka-python's future.

        Raises InvalidNamespace, TraceError for feedback the workers would refuse (nothing sent), TopicMissing
        when the feedback topic does not exist (``combee topics create``)."""
        validate_namespace(namespace)
        try:
            body = feedback if isinstance(feedback, Feedback) else Feedback.model_validate(dict(feedback))
            record = FeedbackRecord(trace_id=trace_id, namespace=namespace, feedback=body)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in err["loc"])
            raise TraceError(f"invalid feedback: {loc}: {err['msg']}"[:300]) from None
        signed = sign_feedback(record, self.signer.producer, self.signer.key.get_secret_value().encode())
        self._out.check_open()
        return self._out.send_record(signed, signed.model_dump_json(by_alias=True).encode("utf-8"))

    def flush(self, timeout: float | None = None) -> None:
        self._out.flush(timeout)

    def close(self, timeout: float | None = None) -> None:
        self._out.close(timeout)

    def __enter__(self) -> FeedbackPublisher:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
