"""Injected faults: which one a request draws, and how malformed content is made.

Per request the server draws at most one fault from a *fault rng* seeded from the request digest **and** the
server's request counter, so the same request body can fail once and succeed when retried (unlike content
and latency, which depend on the body alone). One uniform draw ``u`` partitions [0, 1):

    [0, r500)                → HTTP 500
    [r500, +r429)            → HTTP 429 with Retry-After
    [.., +r_timeout)         → hang ``timeout_hang_s · time_scale`` seconds, then HTTP 504
    [.., +r_malformed)       → 200 OK with malformed content (:func:`malform`)
    rest                     → no fault

The outage switch is not a draw: while it is on, every request gets 503 at once.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import random
from dataclasses import replace

from combee.sim.config import SimConfig
from combee.sim.generic import Answer, compiled_schema

__all__ = [
    "FaultKind",
    "Malformation",
    "broken_json",
    "draw_fault",
    "fault_rng",
    "malform",
    "malformed_again",
    "retry_after_headers",
]


class FaultKind(enum.StrEnum):
    """A fault drawn for one request (the names are the keys of ``/admin/stats`` ``faults``)."""

    HTTP_500 = "http_500"
    HTTP_429 = "http_429"
    TIMEOUT = "timeout"
    MALFORMED = "malformed"


class Malformation(enum.StrEnum):
    """How a malformed-content fault broke the content (also counted in ``/admin/stats``)."""

    BROKEN_JSON = "malformed_broken_json"
    SCHEMA_VIOLATION = "malformed_schema_violation"


def fault_rng(digest: bytes, counter: int) -> random.Random:
    """The fault rng of request number ``counter`` with body digest ``digest`` (the seed is in the digest)."""
    mixed = hashlib.sha256(b"fault|%d|" % counter + digest).digest()
    return random.Random(int.from_bytes(mixed[:16], "big"))


def draw_fault(config: SimConfig, rng: random.Random) -> FaultKind | None:
    """At most one fault, with the configured probabilities; consumes exactly one draw."""
    u = rng.random()
    for kind, rate in (
        (FaultKind.HTTP_500, config.fault_500_rate),
        (FaultKind.HTTP_429, config.fault_429_rate),
        (FaultKind.TIMEOUT, config.fault_timeout_rate),
        (FaultKind.MALFORMED, config.fault_malformed_rate),
    ):
        if u < rate:
            return kind
        u -= rate
    return None


def retry_after_headers(config: SimConfig) -> dict[str, str]:
    """The 429 hint, scaled by ``time_scale`` like every simulated delay.

    ``Retry-After`` carries whole seconds (the HTTP grammar; rounded up), ``retry-after-ms`` the exact value,
    which the ``openai`` client reads first.
    """
    seconds = config.retry_after_s * config.time_scale
    return {"Retry-After": str(math.ceil(seconds)), "retry-after-ms": f"{seconds * 1000.0:.3f}"}


def broken_json(text: str, rng: random.Random) -> str:
    """``text`` cut at an rng-chosen point in its middle half, guaranteed not to parse as JSON.

    Cutting JSON mid-way is what a dropped or garbled generation looks like; for non-JSON text (prose, fenced
    JSON) the cut still breaks any JSON inside it.
    """
    cut = rng.randint(max(1, len(text) // 4), max(1, (3 * len(text)) // 4)) if len(text) >= 2 else 0
    text = text[:cut]
    try:
        json.loads(text)
    except ValueError:
        return text or '{"'
    return text + '{"'  # the prefix parsed (e.g. a number): make it unparseable


def _violating_text(text: str, answer: Answer, rng: random.Random) -> str | None:
    if answer.schema is not None:
        return compiled_schema(answer.schema).violation(rng)
    try:
        value = json.loads(text)
    except ValueError:
        return None
    # No schema known: change the top-level shape, which breaks any parser expecting the original one.
    wrapped = {"combee_sim_malformed": value} if isinstance(value, list) else [value]
    return json.dumps(wrapped, ensure_ascii=False)


def malform(answer: Answer, rng: random.Random) -> tuple[Answer, Malformation]:
    """The answer with its content (or first tool call's arguments) made malformed.

    Half the time (by ``rng``) it tries a *schema violation*: valid JSON of a top-level type the answer's
    schema forbids (or, with no schema but JSON content, the content wrapped into another top-level type).
    Otherwise — or when no violation can be built — *broken JSON* (:func:`broken_json`). ``finish_reason`` is
    left as it was: the response looks normal on the wire.
    """
    target = answer.tool_calls[0].arguments if answer.tool_calls else (answer.content or "")
    new_text: str | None = None
    kind = Malformation.BROKEN_JSON
    if rng.random() < 0.5:
        new_text = _violating_text(target, answer, rng)
        if new_text is not None:
            kind = Malformation.SCHEMA_VIOLATION
    if new_text is None:
        new_text = broken_json(target, rng)
    if answer.tool_calls:
        first = replace(answer.tool_calls[0], arguments=new_text)
        return replace(answer, tool_calls=(first, *answer.tool_calls[1:])), kind
    return replace(answer, content=new_text), kind


def malformed_again(answer: Answer, digest: bytes, counter: int) -> Answer:
    """The malformed answer the server gave request number ``counter`` with body digest ``digest``.

    The server drew the fault from ``fault_rng(digest, counter)`` (one draw), then malformed the answer with
    the same rng; repeating both gives the same content, so a replay takes the same repair turns.
    """
    rng = fault_rng(digest, counter)
    rng.random()  # the draw that chose the fault (draw_fault)
    return malform(answer, rng)[0]
