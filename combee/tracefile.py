"""Decoding traces from bytes (one record) and from JSON-lines files.

:func:`parse_trace` is the single place a raw trace record becomes a :class:`~combee.models.Trace`: the
offline reader and the stream codec both use it, so a record is accepted or refused for the same reason
everywhere. Refusals raise :class:`~combee.errors.TraceError` with a short reason fit for a dead-letter record.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from combee.errors import TraceError
from combee.models import LIMITS, Trace

__all__ = ["LineError", "TraceFile", "parse_trace", "read_traces"]

_MAX_DEPTH = 32


def _depth_ok(raw: str) -> bool:
    """Reject JSON nested deeper than ``_MAX_DEPTH`` before parsing it (cheap bracket scan, strings skipped)."""
    if raw.count("[") + raw.count("{") <= _MAX_DEPTH:
        return True  # too few brackets to nest that deep: the usual trace needs no scan
    depth, in_str, escape = 0, False, False
    for c in raw:
        if in_str:
            if escape:
                escape = False
            elif c == "\\":
                escape = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
            if depth > _MAX_DEPTH:
                return False
        elif c in "]}":
            depth -= 1
    return True


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "record"
    msg = err["msg"]
    return f"{loc}: {msg}"[:300]


def parse_trace(raw: bytes | str, *, default_namespace: str | None = None) -> Trace:
    """Decode one trace record (JSON object) or raise TraceError with a reason.

    Checks, in order: size (``LIMITS.trace_bytes``), UTF-8, nesting depth, JSON syntax, object shape, then
    the model's validation. A missing ``trace_id`` is derived from the record's bytes (stable across
    re-deliveries); a missing ``namespace`` falls back to ``default_namespace`` (the Kafka key) if given.
    """
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if len(data) > LIMITS.trace_bytes:
        raise TraceError(f"trace is {len(data)} bytes, over the {LIMITS.trace_bytes}-byte limit", "oversized")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"not valid UTF-8 (byte {exc.start})", "encoding") from None
    if not _depth_ok(text):
        raise TraceError(f"JSON nested deeper than {_MAX_DEPTH} levels", "json")
    try:
        obj: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"not valid JSON: {exc.msg} at position {exc.pos}", "json") from None
    except RecursionError:
        raise TraceError("JSON nested too deeply", "json") from None
    except ValueError as exc:  # e.g. an integer over Python's 4300-digit conversion limit
        raise TraceError(f"not valid JSON: {str(exc)[:120]}", "json") from None
    if not isinstance(obj, dict):
        raise TraceError(f"a trace must be a JSON object, got {type(obj).__name__}", "shape")
    if "trace_id" not in obj:
        obj["trace_id"] = "h-" + hashlib.sha256(data).hexdigest()[:24]
    if "namespace" not in obj and default_namespace is not None:
        obj["namespace"] = default_namespace
    try:
        return Trace.model_validate(obj)
    except ValidationError as exc:
        raise TraceError(f"invalid trace: {_first_error(exc)}") from None


@dataclass(frozen=True)
class LineError:
    line: int
    reason: str


@dataclass
class TraceFile:
    traces: list[Trace] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    blank: int = 0


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as fh:
        for number, line in enumerate(fh, start=1):
            yield number, line.rstrip(b"\r\n")


def read_traces(path: Path, *, namespace: str | None = None) -> TraceFile:
    """Read a JSON-lines trace file. Bad lines are collected with their line number and reason, not raised.

    ``namespace`` overrides every trace's namespace (learning a file into a chosen playbook).
    Raises FileNotFoundError / IsADirectoryError / PermissionError for an unreadable path.
    """
    out = TraceFile()
    for number, line in _lines(path):
        if not line.strip():
            out.blank += 1
            continue
        try:
            trace = parse_trace(line)
        except TraceError as exc:
            out.errors.append(LineError(number, exc.reason))
            continue
        if namespace is not None and trace.namespace != namespace:
            trace = trace.model_copy(update={"namespace": namespace})
        out.traces.append(trace)
    return out
