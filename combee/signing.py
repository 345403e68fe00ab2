"""HMAC-SHA256 over a canonical JSON form: the one way Combee signs a record and checks a signature. Pure.

Two kinds of record are signed with it: control records (``COMBEE_CONTROL_KEY``, :mod:`streams.control_auth`) and
traces (per-producer keys, :mod:`combee.identity`). Both sign :func:`canonical_json` of the record's fields
without its signature — keys sorted, no spaces, UTF-8, no NaN — and compare digests in constant time
(:func:`signature_matches`), so a signature tells nothing about the right one by how fast it is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["canonical_json", "hmac_hex", "signature_matches"]


def canonical_json(fields: Mapping[str, Any]) -> bytes:
    """``fields`` as canonical JSON bytes: keys sorted at every level, no spaces, UTF-8 (not ASCII-escaped).

    Raises ValueError for NaN or infinities (JSON has no spelling for them, so two writers could disagree)."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def hmac_hex(key: bytes, data: bytes) -> str:
    """The hex HMAC-SHA256 of ``data`` under ``key`` (64 lowercase hex digits)."""
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def signature_matches(signature: str, key: bytes, data: bytes) -> bool:
    """Whether ``signature`` is :func:`hmac_hex` of ``data`` under ``key``, compared in constant time."""
    return hmac.compare_digest(signature.encode(), hmac_hex(key, data).encode())
