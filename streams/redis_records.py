"""What the publish script writes to Redis, read back: a prompt hash and the history's entries.

Shared by the store (:mod:`streams.redis_store`) and the readers (:mod:`streams.client`).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from combee.evidence import parse_explanations
from combee.models import Playbook
from combee.promptdiff import VersionRecord, parse_provenance
from combee.store import PublishedPrompt

if TYPE_CHECKING:
    pass

__all__ = [
    "MAX_VERSION",
    "RECORD_FIELDS",
    "HistoryEntry",
    "check_version",
    "in_version_range",
    "parse_history",
    "parse_prompt_fields",
    "parse_version_record",
    "reply_float",
    "reply_text",
]

log = logging.getLogger("streams.redis_store")  # the name it logged under before the module was split

MAX_VERSION: Final = 2**53 - 1
"""Versions are compared inside Lua, whose numbers are doubles: integers are exact up to 2**53."""

# ---------------------------------------------------------------------------------------------------------
# Parsing what the script wrote (shared with streams.client)
# ---------------------------------------------------------------------------------------------------------


def reply_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def reply_float(value: Any) -> float | None:
    text = reply_text(value)
    if not text:
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def parse_prompt_fields(namespace: str, values: Sequence[Any]) -> PublishedPrompt | None:
    """A PublishedPrompt from an ``HMGET <hash> version prompt playbook window_id published_at`` reply, or
    None when the hash does not exist. Raises ValueError when the hash exists but is malformed."""
    version, prompt, playbook, window_id, published_at = (reply_text(v) for v in values)
    if version is None:
        return None
    if prompt is None or playbook is None:
        raise ValueError(f"prompt hash of namespace {namespace!r} version {version} is missing fields")
    return PublishedPrompt(
        namespace=namespace,
        version=int(version),
        prompt=prompt,
        playbook_json=playbook,
        window_id=window_id or None,
        published_at=reply_float(published_at),
    )


RECORD_FIELDS: Final = ("version", "playbook", "window_id", "meta")
"""The fields of a prompt hash that :func:`parse_version_record` reads (``HMGET <hash> *RECORD_FIELDS``)."""


def parse_version_record(namespace: str, values: Sequence[Any]) -> VersionRecord | None:
    """A :class:`~combee.promptdiff.VersionRecord` (playbook and provenance) from an ``HMGET <hash>
    *RECORD_FIELDS`` reply, or None when the hash does not exist. A missing or malformed ``meta`` (versions
    published before provenance was stored) gives no provenance, a missing or malformed ``evidence`` no
    evidence. Raises ValueError for a malformed playbook."""
    version, playbook, window_id, meta = (reply_text(v) for v in values)
    if version is None:
        return None
    if playbook is None:
        raise ValueError(f"prompt hash of namespace {namespace!r} version {version} has no playbook")
    try:
        parsed_meta = json.loads(meta) if meta else {}
    except ValueError:
        parsed_meta = {}
    parsed_meta = parsed_meta if isinstance(parsed_meta, dict) else {}
    return VersionRecord(
        version=int(version),
        playbook=Playbook.model_validate_json(playbook),
        window_id=window_id or None,
        provenance=parse_provenance(parsed_meta),
        evidence=parse_explanations(parsed_meta),
    )


@dataclass(frozen=True)
class HistoryEntry:
    """One published version as the history remembers it (the compact summary, not the prompt itself).

    ``bullets`` is the playbook's bullet count and ``tokens`` the prompt's estimated token count at publish time
    (None when unknown). ``meta`` is what the publisher passed (window stats, trace counts, ...).
    """

    version: int
    window_id: str | None = None
    published_at: float | None = None
    bullets: int | None = None
    tokens: int | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        body: dict[str, Any] = {"version": self.version}
        if self.window_id is not None:
            body["window_id"] = self.window_id
        if self.published_at is not None:
            body["published_at"] = self.published_at
        if self.bullets is not None:
            body["bullets"] = self.bullets
        if self.tokens is not None:
            body["tokens"] = self.tokens
        if self.meta:
            body["meta"] = dict(self.meta)
        return json.dumps(body, separators=(",", ":"), sort_keys=True, allow_nan=False, ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: str | bytes) -> HistoryEntry:
        """Parse a history member; raises ValueError when it is not a summary this module wrote."""
        obj = json.loads(raw)
        if not isinstance(obj, dict) or not isinstance(obj.get("version"), int):
            raise ValueError("history entry is not an object with an integer version")
        meta = obj.get("meta") or {}
        return cls(
            version=obj["version"],
            window_id=obj.get("window_id"),
            published_at=obj.get("published_at"),
            bullets=obj.get("bullets"),
            tokens=obj.get("tokens"),
            meta=meta if isinstance(meta, dict) else {},
        )


def parse_history(members: Iterable[Any]) -> list[HistoryEntry]:
    """Parse history members in the given order, skipping (and logging) any that are not valid summaries."""
    out: list[HistoryEntry] = []
    for member in members:
        raw = reply_text(member[0] if isinstance(member, list | tuple) else member) or ""
        try:
            out.append(HistoryEntry.from_json(raw))
        except (ValueError, TypeError):
            log.warning("skipping a malformed history entry: %.120r", raw)
    return out


def in_version_range(version: int) -> bool:
    """Whether ``version`` lies in [0, MAX_VERSION], the numbers a store, a client and the web page accept."""
    return 0 <= version <= MAX_VERSION


def check_version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or not in_version_range(version):
        raise ValueError(f"version must be an integer in [0, 2**53 - 1], got {version!r}")
    return version
