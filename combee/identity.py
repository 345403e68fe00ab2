"""Producer identity: a trace signed with its producer's key, the key scoped to namespaces. Pure.

A producer that has a key (``COMBEE_PRODUCER_ID`` / ``COMBEE_PRODUCER_KEY`` on the agent's side, or
``TracePublisher(producer_id=..., producer_key=...)``) names itself in ``metadata["producer"]`` and puts
``metadata["producer_signature"]``: the hex HMAC-SHA256, under its key, of :func:`canonical_trace` — the whole
validated trace (namespace, task, steps, output, feedback, metadata, ...) without the signature, as canonical
JSON (:mod:`combee.signing`, the same form control records are signed in). A signature therefore cannot be moved
to another namespace, nor kept with altered feedback.

The worker's window stage holds the keys (``COMBEE_PRODUCER_KEYS_FILE``, :func:`parse_producer_keys`) and asks
:func:`verify_trace` about every trace. The outcomes (:data:`OUTCOMES`):

* ``verified``: signed by a known producer with its key, in a namespace its key is scoped to. The producer id is
  recorded as verified (the window carries it to the combiner, which records it in the bullets it teaches).
* ``unsigned``: no signature. Accepted unless the namespace requires signed traces (``COMBEE_REQUIRE_SIGNED``);
  a producer it names is a claim, never treated as verified.
* ``unknown_producer``, ``bad_signature``, ``namespace_not_allowed``: signed, but not by a producer with a key
  here, or not with its key (the trace or its namespace changed since it was signed), or by a producer whose key
  is not scoped to the trace's namespace. Always refused: a signature that does not hold is a forgery or a
  misconfiguration, both worth a dead letter.

Quotas and corroboration key a trace by :func:`counted_producer`: the verified producer, else the claimed
name, except that a claim naming a producer that has a key is counted apart (``unverified:<name>``), so an
unsigned trace can never spend or share the budget of the producer it names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pydantic import SecretStr

from combee.errors import ConfigError
from combee.forget import PRODUCER_KEY, producer_of
from combee.models import PRODUCER_ID_PATTERN, Trace
from combee.redaction import redact
from combee.signing import canonical_json, hmac_hex, signature_matches

__all__ = [
    "ANY_NAMESPACE",
    "BAD_SIGNATURE",
    "MIN_KEY_CHARS",
    "NAMESPACE_NOT_ALLOWED",
    "OUTCOMES",
    "REFUSALS",
    "SIGNATURE_KEY",
    "UNKNOWN_PRODUCER",
    "UNSIGNED",
    "UNVERIFIED_PREFIX",
    "VERIFIED",
    "IdentityPolicy",
    "ProducerKey",
    "TraceSigner",
    "Verification",
    "canonical_trace",
    "check_producer_id",
    "check_signed",
    "counted_producer",
    "parse_producer_keys",
    "parse_required",
    "sign_trace",
    "verify_trace",
]

SIGNATURE_KEY = "producer_signature"
"""The metadata key of a trace's signature (the producer is ``metadata["producer"]``)."""

VERIFIED = "verified"
UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad_signature"
UNKNOWN_PRODUCER = "unknown_producer"
NAMESPACE_NOT_ALLOWED = "namespace_not_allowed"
OUTCOMES = (VERIFIED, UNSIGNED, BAD_SIGNATURE, UNKNOWN_PRODUCER, NAMESPACE_NOT_ALLOWED)
REFUSALS = (UNSIGNED, BAD_SIGNATURE, UNKNOWN_PRODUCER, NAMESPACE_NOT_ALLOWED)
"""Why a trace can be refused: the ``reason`` label of ``combee_traces_total{outcome="dead_lettered"}``."""

ANY_NAMESPACE = "*"
MIN_KEY_CHARS = 16
UNVERIFIED_PREFIX = "unverified:"
_PRODUCER_ID_RE = re.compile(PRODUCER_ID_PATTERN)
_SIGNATURE_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ProducerKey:
    """One producer's key, the namespaces it may sign traces for and those it may send trusted feedback for
    (:mod:`combee.feedback`; ``*``: every namespace). The two are granted apart: a grader that only sends
    feedback need not be able to sign traces, and an agent that signs traces cannot vouch for its own outcome
    unless it is given ``feedback`` too."""

    producer: str
    key: SecretStr
    namespaces: frozenset[str]
    feedback: frozenset[str] = frozenset()

    def allows(self, namespace: str) -> bool:
        return ANY_NAMESPACE in self.namespaces or namespace in self.namespaces

    def allows_feedback(self, namespace: str) -> bool:
        return ANY_NAMESPACE in self.feedback or namespace in self.feedback


@dataclass(frozen=True)
class IdentityPolicy:
    """The producers' keys a worker holds and the namespaces that refuse unsigned traces (``*``: all).
    The default holds no key and requires nothing: every unsigned trace is accepted, as before keys existed."""

    keys: Mapping[str, ProducerKey] = field(default_factory=dict)
    require_signed: frozenset[str] = frozenset()

    def requires_signature(self, namespace: str) -> bool:
        return ANY_NAMESPACE in self.require_signed or namespace in self.require_signed


@dataclass(frozen=True)
class Verification:
    """What :func:`verify_trace` found: ``outcome`` (one of :data:`OUTCOMES`), the producer id when verified,
    whether the trace is refused, and a one-line reason (starting with the outcome) for its dead letter."""

    outcome: str
    producer: str | None = None
    refused: bool = False
    message: str = ""


def canonical_trace(trace: Trace) -> bytes:
    """The bytes a trace's signature covers: every field that differs from its default (the namespace and the
    feedback included), metadata without :data:`SIGNATURE_KEY`, as canonical JSON."""
    fields = trace.model_dump(mode="json", exclude_defaults=True)
    metadata = {k: v for k, v in fields.get("metadata", {}).items() if k != SIGNATURE_KEY}
    if metadata:
        fields["metadata"] = metadata
    else:
        fields.pop("metadata", None)
    return canonical_json(fields)


def sign_trace(trace: Trace, producer: str, key: bytes) -> Trace:
    """``trace`` naming ``producer`` in its metadata and signed with ``key``. Raises ConfigError for a producer
    id that is not 1-64 letters, digits, ``.``, ``_`` or ``-``, or an empty key."""
    check_producer_id(producer)
    if not key:
        raise ConfigError("a producer key is empty")
    named = {k: v for k, v in trace.metadata.items() if k != SIGNATURE_KEY}
    named[PRODUCER_KEY] = producer
    unsigned = trace.model_copy(update={"metadata": named})
    signature = hmac_hex(key, canonical_trace(unsigned))
    return Trace.model_validate({**unsigned.model_dump(), "metadata": {**named, SIGNATURE_KEY: signature}})


@dataclass(frozen=True)
class TraceSigner:
    """A producer's own identity: signs the traces it publishes (:func:`sign_trace`). The key never prints."""

    producer: str
    key: SecretStr

    @classmethod
    def of(cls, producer: str | None, key: SecretStr | str | None) -> TraceSigner | None:
        """The signer of ``producer`` with ``key``; None when neither is set. Raises ConfigError when only one
        is, for a producer id outside the namespace alphabet, or for a key shorter than :data:`MIN_KEY_CHARS`."""
        secret = key.get_secret_value() if isinstance(key, SecretStr) else key
        if not producer and not secret:
            return None
        if not producer or not secret:
            raise ConfigError("signing traces needs both a producer id and its key (COMBEE_PRODUCER_ID/_KEY)")
        check_producer_id(producer)
        if len(secret) < MIN_KEY_CHARS:
            raise ConfigError(f"a producer key needs at least {MIN_KEY_CHARS} characters")
        return cls(producer, SecretStr(secret))

    def sign(self, trace: Trace) -> Trace:
        return sign_trace(trace, self.producer, self.key.get_secret_value().encode())


def verify_trace(trace: Trace, policy: IdentityPolicy) -> Verification:
    """Whether ``trace`` is signed by the producer it names, with that producer's key, for its namespace; and
    whether the worker must refuse it (module docstring). Never raises."""
    signature = trace.metadata.get(SIGNATURE_KEY)
    where = f"trace {trace.trace_id!r} of {trace.namespace!r}"
    if signature is None:
        if policy.requires_signature(trace.namespace):
            return Verification(UNSIGNED, None, True, f"{UNSIGNED}: {where} is not signed (COMBEE_REQUIRE_SIGNED)")
        return Verification(UNSIGNED)
    return check_signed(
        policy, producer_of(trace), signature, canonical_trace(trace), where,
        allowed=lambda key: key.allows(trace.namespace),
        refusal=(NAMESPACE_NOT_ALLOWED, f"sign traces of {trace.namespace!r}"),
    )  # fmt: skip


def check_signed(
    policy: IdentityPolicy,
    claimed: str | None,
    signature: object,
    payload: bytes,
    where: str,
    *,
    allowed: Callable[[ProducerKey], bool],
    refusal: tuple[str, str],
) -> Verification:
    """The checks every signed record passes (a trace, a feedback record): the producer it names (``claimed``)
    has a key here, ``signature`` is well formed and matches ``payload`` under that key, and ``allowed`` grants
    that producer what the record does; ``refusal`` is (reason, "may not ..." text) when it does not. ``where``
    names the record in the messages. Never raises."""
    known = policy.keys.get(claimed) if claimed is not None else None
    if known is None:
        who = "names no producer" if claimed is None else f"names producer {claimed!r}, which has no key here"
        return Verification(UNKNOWN_PRODUCER, None, True, f"{UNKNOWN_PRODUCER}: {where} is signed but {who}")
    key = known.key.get_secret_value().encode()
    if not isinstance(signature, str) or not _SIGNATURE_RE.fullmatch(signature):
        return Verification(BAD_SIGNATURE, None, True, f"{BAD_SIGNATURE}: {where} has a malformed signature")
    if not signature_matches(signature, key, payload):
        return Verification(
            BAD_SIGNATURE, None, True, f"{BAD_SIGNATURE}: {where} does not match producer {claimed!r}'s signature"
        )
    if not allowed(known):
        reason, what = refusal
        return Verification(reason, None, True, f"{reason}: producer {claimed!r} may not {what} ({where})")
    return Verification(VERIFIED, claimed)


def check_producer_id(producer: str, source: str = "") -> None:
    """Raise ConfigError unless ``producer`` is a valid producer id (1-64 letters, digits, ``.``, ``_``, ``-``);
    ``source`` prefixes the message."""
    if not _PRODUCER_ID_RE.fullmatch(producer):
        where = f"{source}: " if source else ""
        raise ConfigError(f"{where}invalid producer id {producer[:80]!r}: use 1-64 letters, digits, '.', '_' or '-'")


def counted_producer(trace: Trace, verified: str | None, policy: IdentityPolicy) -> str | None:
    """Who quotas and corroboration count ``trace`` as: ``verified`` (its verified producer) when given, else the
    producer it claims — prefixed :data:`UNVERIFIED_PREFIX` when that name has a key here — else None."""
    if verified is not None:
        return verified
    claimed = producer_of(trace)
    if claimed is not None and claimed in policy.keys:
        return UNVERIFIED_PREFIX + claimed
    return claimed


def parse_required(text: str) -> frozenset[str]:
    """``COMBEE_REQUIRE_SIGNED``: a comma-separated list of namespaces, or ``*`` for all; empty: none."""
    return frozenset(part.strip() for part in text.split(",") if part.strip())


def parse_producer_keys(text: str, source: str = "the producer keys file") -> dict[str, ProducerKey]:
    """The keys of a JSON object ``{producer_id: {"key": "...", "namespaces": ["ns", ...], "feedback": [...]}}``
    (``"*"``: every namespace). ``namespaces``: where the producer may sign traces; ``feedback`` (optional):
    where it may send trusted feedback (:mod:`combee.feedback`). At least one of them must name a namespace.
    Raises ConfigError naming ``source`` and the producer at fault; a key never appears in it."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{source} is not JSON: {redact(str(exc))}"[:300]) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must hold a JSON object {{producer_id: {{key, namespaces}}}}")
    return {producer: _producer_key(producer, entry, source) for producer, entry in data.items()}


def _producer_key(producer: str, entry: object, source: str) -> ProducerKey:
    check_producer_id(producer, source)
    if not isinstance(entry, dict) or set(entry) - {"key", "namespaces", "feedback"}:
        raise ConfigError(
            f'{source}: producer {producer!r} must map to {{"key": ..., "namespaces": [...], "feedback": [...]}}'
        )
    key = entry.get("key")
    if not isinstance(key, str) or len(key) < MIN_KEY_CHARS:
        raise ConfigError(f"{source}: producer {producer!r} needs a key of at least {MIN_KEY_CHARS} characters")
    namespaces, feedback = entry.get("namespaces", []), entry.get("feedback", [])
    for name, value in (("namespaces", namespaces), ("feedback", feedback)):
        if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
            raise ConfigError(f'{source}: producer {producer!r}: "{name}" must be a list of names or "*"')
    if not namespaces and not feedback:
        raise ConfigError(
            f'{source}: producer {producer!r} needs "namespaces" (traces it may sign) or "feedback" (namespaces '
            'it may send trusted feedback for): a non-empty list of names or "*"'
        )
    return ProducerKey(producer, SecretStr(key), frozenset(namespaces), frozenset(feedback))
