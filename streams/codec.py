"""The one codec: bytes on Kafka ⇄ envelopes and traces.

* Traces are plain JSON objects (any producer may publish them); they decode through
  :func:`combee.tracefile.parse_trace`, the same rules as offline files.
* Envelopes are JSON objects with a ``schema`` field naming their type and version.

Decoding failures raise :class:`CodecError` with a reason fit for a dead-letter record.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

from pydantic import TypeAdapter, ValidationError

from combee.errors import CombeeError, TraceError
from combee.feedback import FeedbackRecord
from combee.models import Trace, validate_namespace
from combee.tracefile import parse_trace
from streams.envelopes import DeadLetter, Envelope

__all__ = ["CodecError", "dead_letter", "decode", "decode_feedback", "decode_trace", "encode", "preview"]

_ADAPTER: TypeAdapter[Envelope] = TypeAdapter(Envelope)
MAX_ENVELOPE_BYTES = 16 * 1024 * 1024
_PREVIEW_BYTES = 1024


class CodecError(CombeeError, ValueError):
    """A record could not be decoded; ``reason`` explains, ``kind`` names the failure for counting."""

    def __init__(self, reason: str, kind: str = "invalid") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


def encode(envelope: Envelope) -> bytes:
    """Compact JSON of an envelope (by alias, so the ``schema`` field is named ``schema``)."""
    return envelope.model_dump_json(by_alias=True).encode("utf-8")


def decode(raw: bytes) -> Envelope:
    """Decode an envelope or raise CodecError (unknown schema, invalid fields, not JSON, too large)."""
    if len(raw) > MAX_ENVELOPE_BYTES:
        raise CodecError(f"envelope is {len(raw)} bytes, over the {MAX_ENVELOPE_BYTES}-byte limit")
    try:
        obj = json.loads(raw)
    except RecursionError:
        raise CodecError("envelope is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer over the 4300-digit limit
        raise CodecError(f"envelope is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(obj, dict):
        raise CodecError("envelope must be a JSON object")
    schema = obj.get("schema")
    if not isinstance(schema, str):
        raise CodecError("envelope has no 'schema' field")
    try:
        return _ADAPTER.validate_python(obj)
    except ValidationError as exc:
        err = exc.errors()[0]
        if err["type"] == "union_tag_invalid":
            raise CodecError(f"unknown envelope schema {schema!r}") from None
        loc = ".".join(str(x) for x in err["loc"])
        raise CodecError(f"invalid {schema} envelope: {loc}: {err['msg']}"[:300]) from None


def decode_trace(raw: bytes | None, key: bytes | None = None) -> Trace:
    """A trace record from the traces topic; the key (namespace) fills a missing namespace field."""
    if raw is None:
        raise CodecError("empty record (null value)", "empty")
    namespace = None
    if key:
        try:
            namespace = key.decode("utf-8")
        except UnicodeDecodeError:
            namespace = None
    try:
        return parse_trace(raw, default_namespace=namespace)
    except TraceError as exc:
        raise CodecError(exc.reason, exc.kind) from None


def decode_feedback(raw: bytes | None) -> FeedbackRecord:
    """A record of the feedback topic (:class:`combee.feedback.FeedbackRecord`, compact JSON), or CodecError."""
    if raw is None:
        raise CodecError("empty record (null value)", "empty")
    if len(raw) > MAX_ENVELOPE_BYTES:
        raise CodecError(f"feedback record is {len(raw)} bytes, over the {MAX_ENVELOPE_BYTES}-byte limit", "oversized")
    try:
        record = FeedbackRecord.model_validate_json(raw)
        validate_namespace(record.namespace)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise CodecError(f"invalid feedback record: {loc}: {err['msg']}"[:300]) from None
    except CombeeError as exc:  # InvalidNamespace
        raise CodecError(f"invalid feedback record: {exc}"[:300]) from None
    return record


def preview(raw: bytes | None) -> str:
    """A bounded, printable excerpt of a raw value for dead-letter records (binary is base64)."""
    if raw is None:
        return ""
    head = raw[:_PREVIEW_BYTES]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(head).decode("ascii")
    return _printable(text)


def _printable(text: str, keep: str = "\n\t") -> str:
    """``text`` with every non-printable character but ``keep`` written as an escape (``\\x1b``), never raw."""
    return "".join(c if c.isprintable() or c in keep else f"\\x{ord(c):02x}" for c in text)


def dead_letter(
    *, stage: str, reason: str, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None
) -> DeadLetter:
    key_text = None
    if key is not None:
        key_text = _printable(key.decode("utf-8", "backslashreplace"), keep="")[:256]
    return DeadLetter(
        stage=stage,
        reason=reason[:500],
        topic=topic,
        partition=partition,
        offset=offset,
        key=key_text,
        size=len(value or b""),
        value_preview=preview(value),
        received_at=datetime.now(UTC),
    )
