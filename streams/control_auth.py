"""Control records (:class:`streams.envelopes.Control`: a rollback) are authenticated with HMAC-SHA256.

Write access to the internal partials topic would otherwise be control of every prompt. The operator's CLI
signs each control record with the key ``COMBEE_CONTROL_KEY``; a worker that has the key applies only records
whose ``signature`` is the HMAC-SHA256, under that key, of the record's canonical form (:func:`canonical`: its
JSON without the signature, keys sorted, no spaces, UTF-8; :mod:`combee.signing`, as traces are signed).
Anything else is refused with a reason the worker dead-letters and counts.

A worker without a key accepts every control record, signed or not (the behaviour before keys existed) and
says so when it starts; docs/security.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from combee.signing import canonical_json, hmac_hex, signature_matches
from streams.envelopes import Control

if TYPE_CHECKING:
    from streams.settings import KafkaSettings

__all__ = ["BAD_SIGNATURE", "UNSIGNED", "canonical", "control_key", "refusal", "sign"]

UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad_signature"


def control_key(settings: KafkaSettings) -> bytes | None:
    """The key of ``COMBEE_CONTROL_KEY`` as bytes (UTF-8), None when unset or empty."""
    secret = settings.control_key.get_secret_value() if settings.control_key is not None else ""
    return secret.encode() if secret else None


def canonical(ctrl: Control) -> bytes:
    """The bytes a control record's signature covers: every field but ``signature``, as canonical JSON."""
    return canonical_json(ctrl.model_dump(mode="json", by_alias=True, exclude={"signature"}))


def sign(ctrl: Control, key: bytes) -> Control:
    """``ctrl`` with its ``signature`` set (hex HMAC-SHA256 of :func:`canonical` under ``key``)."""
    return ctrl.model_copy(update={"signature": hmac_hex(key, canonical(ctrl))})


def refusal(ctrl: Control, key: bytes | None) -> tuple[str, str] | None:
    """Why a worker holding ``key`` must not apply ``ctrl``: ``(kind, message)``, kind :data:`UNSIGNED` or
    :data:`BAD_SIGNATURE`; None when it may (signed with ``key``, or no key: nothing to check)."""
    if key is None:
        return None
    if ctrl.signature is None:
        return UNSIGNED, f"control record for {ctrl.namespace!r} is not signed (this worker has COMBEE_CONTROL_KEY)"
    if not signature_matches(ctrl.signature, key, canonical(ctrl)):
        return BAD_SIGNATURE, f"control record for {ctrl.namespace!r} has a signature that does not match"
    return None
