"""Trusted feedback: an outcome sent by a source other than the agent, joined to its trace by trace id. Pure.

A trace carries the feedback its agent reported about itself, which is exactly what an attacker writes (issue
25: ``success = false`` with a forged ``ground_truth`` asks the reflector for the attacker's lesson). A
namespace can take its feedback from a trusted source instead: a grader, a user-facing service, a human review
tool publishes a :class:`FeedbackRecord` on the feedback topic (``<prefix>.feedback``, keyed by namespace),
signed with its key (:mod:`combee.signing`, the same HMAC form traces are signed in). The key file that holds
the producers' trace keys says which producers may send feedback for which namespaces (``"feedback": [...]``
in :func:`combee.identity.parse_producer_keys`), granted apart from signing traces.

Modes (:data:`MODES`), per namespace (:class:`FeedbackPolicy`: a default and per-namespace overrides):

* ``agent`` (the default): the trace's own feedback is learned, as before; feedback records are ignored.
* ``trusted``: the trace's own feedback is never learned. The trace waits (at most ``wait_s``) for its
  feedback record; joined, it is learned with that feedback; on timeout it is learned with no feedback at all
  (success unknown).
* ``required``: as ``trusted``, but a trace whose feedback does not come within ``wait_s`` is refused (a dead
  letter with the reason :data:`TIMEOUT_KIND`).

:func:`verify_feedback` refuses a record that is unsigned, signed by a producer with no key or not with its key,
or sent by a producer not authorised for feedback in the record's namespace (:data:`NOT_ALLOWED`).

:class:`FeedbackJoin` is the join itself, as a data structure the window stage drives (it owns no clock: every
call takes ``now``). Traces wait in their arrival order per (namespace, partition) and leave in that order
(:meth:`FeedbackJoin.release`): a trace whose feedback came early still waits for the earlier ones, so the
windows of a namespace keep their offsets in order. Feedback that comes before its trace is kept (at most
``early_limit`` records, each at most ``early_s`` seconds) and joined when the trace comes. The first feedback
for a trace wins; a later one is a duplicate. Items (the trace's and the feedback's Kafka events, to the caller)
travel with them, so the caller can acknowledge a feedback record only once the trace it joined is durable.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from combee.errors import ConfigError
from combee.identity import (
    BAD_SIGNATURE,
    MIN_KEY_CHARS,
    UNKNOWN_PRODUCER,
    UNSIGNED,
    IdentityPolicy,
    Verification,
    check_producer_id,
    check_signed,
)
from combee.models import Feedback, Namespace, ProducerId, Trace, TraceId
from combee.signing import canonical_json, hmac_hex

__all__ = [
    "AGENT",
    "DUPLICATE",
    "EARLY",
    "EXPIRED",
    "FEEDBACK_SCHEMA",
    "IGNORED",
    "JOINED",
    "LATE",
    "MODES",
    "NOT_ALLOWED",
    "OUTCOMES",
    "REFUSALS",
    "REFUSED",
    "REQUIRED",
    "TIMED_OUT",
    "TIMEOUT_KIND",
    "TRUSTED",
    "FeedbackJoin",
    "FeedbackPolicy",
    "FeedbackRecord",
    "Offered",
    "Released",
    "canonical_feedback",
    "parse_modes",
    "sign_feedback",
    "verify_feedback",
    "with_trusted_feedback",
]

FEEDBACK_SCHEMA = "combee.feedback/1"

AGENT = "agent"
TRUSTED = "trusted"
REQUIRED = "required"
MODES = (AGENT, TRUSTED, REQUIRED)

NOT_ALLOWED = "feedback_not_allowed"
REFUSALS = (UNSIGNED, BAD_SIGNATURE, UNKNOWN_PRODUCER, NOT_ALLOWED)
"""Why a feedback record is refused: the ``reason`` of its dead letter and of ``combee_feedback_total``."""
TIMEOUT_KIND = "feedback_timeout"
"""The dead-letter kind of a trace of a ``required`` namespace whose feedback did not come in time."""

# What became of a feedback record or a waiting trace (the ``outcome`` label of ``combee_feedback_total``).
JOINED = "joined"  # a feedback record joined its trace
EARLY = "early"  # a feedback record came before its trace and is kept for it
DUPLICATE = "duplicate"  # a second feedback record for a trace that has one (the first wins)
LATE = "late"  # a feedback record for a trace already gone on (joined or timed out)
EXPIRED = "expired"  # an early feedback record whose trace never came (in early_s, or pushed out by early_limit)
IGNORED = "ignored"  # a feedback record for a namespace that learns its agents' feedback
TIMED_OUT = "timed_out"  # a trace whose feedback did not come in wait_s
REFUSED = "refused"  # a feedback record verify_feedback refused (reason: one of REFUSALS)
OUTCOMES = (JOINED, EARLY, DUPLICATE, LATE, EXPIRED, IGNORED, TIMED_OUT, REFUSED)


class FeedbackRecord(BaseModel):
    """How trace ``trace_id`` of ``namespace`` went, said by ``producer`` (not the agent), signed with its key.

    ``feedback`` has the fields a trace's feedback has (score, success, ground_truth, message); it replaces the
    trace's own. ``signature``: the hex HMAC-SHA256 under the producer's key of :func:`canonical_feedback`."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    schema_: Literal["combee.feedback/1"] = Field(default="combee.feedback/1", alias="schema")
    trace_id: TraceId
    namespace: Namespace
    feedback: Feedback
    producer: ProducerId | None = None
    signature: str | None = None


def canonical_feedback(record: FeedbackRecord) -> bytes:
    """The bytes a feedback record's signature covers: every field but the signature (the namespace, the trace
    id and the producer included), as canonical JSON."""
    fields = record.model_dump(mode="json", by_alias=True, exclude={"signature"})
    return canonical_json(fields)


def sign_feedback(record: FeedbackRecord, producer: str, key: bytes) -> FeedbackRecord:
    """``record`` naming ``producer`` and signed with ``key``. Raises ConfigError for an invalid producer id or a
    key shorter than :data:`combee.identity.MIN_KEY_CHARS`."""
    check_producer_id(producer)
    if len(key) < MIN_KEY_CHARS:
        raise ConfigError(f"a producer key needs at least {MIN_KEY_CHARS} characters")
    named = record.model_copy(update={"producer": producer, "signature": None})
    return named.model_copy(update={"signature": hmac_hex(key, canonical_feedback(named))})


def verify_feedback(record: FeedbackRecord, policy: IdentityPolicy) -> Verification:
    """Whether ``record`` is signed by the producer it names, with that producer's key, and whether that producer
    may send feedback for the record's namespace. Feedback is trusted only when all of this holds: every other
    outcome is a refusal (``refused`` True, ``message`` the dead letter's reason). Never raises."""
    where = f"feedback for trace {record.trace_id!r} of {record.namespace!r}"
    if record.signature is None:
        return Verification(UNSIGNED, None, True, f"{UNSIGNED}: {where} is not signed")
    return check_signed(
        policy, record.producer, record.signature, canonical_feedback(record), where,
        allowed=lambda key: key.allows_feedback(record.namespace),
        refusal=(NOT_ALLOWED, f"send feedback for {record.namespace!r}"),
    )  # fmt: skip


def with_trusted_feedback(trace: Trace, record: FeedbackRecord | None) -> Trace:
    """``trace`` as a trusted-feedback namespace learns it: with ``record``'s feedback, or with none (success
    unknown) when no record came. Its own feedback is never kept."""
    feedback = record.feedback if record is not None else Feedback()
    return trace.model_copy(update={"feedback": feedback})


def parse_modes(text: str) -> dict[str, str]:
    """``COMBEE_FEEDBACK_NAMESPACES``: comma-separated ``namespace=mode`` overrides; empty: none. Raises
    ConfigError for an entry without ``=`` or a mode not in :data:`MODES`."""
    modes = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        namespace, sep, mode = (s.strip() for s in part.partition("="))
        if not sep or not namespace or mode not in MODES:
            raise ConfigError(f"COMBEE_FEEDBACK_NAMESPACES: {part[:80]!r} is not namespace=mode, mode one of {MODES}")
        modes[namespace] = mode
    return modes


@dataclass(frozen=True)
class FeedbackPolicy:
    """Where each namespace's feedback comes from (``default`` unless ``overrides`` names the namespace), how long
    a trace waits for trusted feedback, and how much early feedback is kept. The default changes nothing."""

    default: str = AGENT
    overrides: Mapping[str, str] = field(default_factory=dict)
    wait_s: float = 30.0
    early_s: float = 600.0
    early_limit: int = 10_000

    def __post_init__(self) -> None:
        for mode in (self.default, *self.overrides.values()):
            if mode not in MODES:
                raise ConfigError(f"feedback mode {mode!r} is not one of {MODES}")

    def mode(self, namespace: str) -> str:
        return self.overrides.get(namespace, self.default)

    def trusted(self, namespace: str) -> bool:
        """Whether ``namespace`` takes its feedback from feedback records (``trusted`` or ``required``)."""
        return self.mode(namespace) != AGENT


T = TypeVar("T")
F = TypeVar("F")


@dataclass
class _Waiting(Generic[T, F]):
    trace_id: str
    item: T
    deadline: float
    record: FeedbackRecord | None = None
    feedback_item: F | None = None


@dataclass
class _Early(Generic[F]):
    record: FeedbackRecord
    item: F
    expires: float


@dataclass(frozen=True)
class Released(Generic[T, F]):
    """A trace done waiting: ``item`` as it was added, its feedback ``record`` and that record's item (None, None
    when it timed out)."""

    item: T
    record: FeedbackRecord | None
    feedback_item: F | None

    @property
    def timed_out(self) -> bool:
        return self.record is None


@dataclass(frozen=True)
class Offered(Generic[F]):
    """What :meth:`FeedbackJoin.offer` did with a record (``outcome``: JOINED, EARLY, DUPLICATE or LATE), and the
    early records it pushed out to stay within ``early_limit`` (their items, done with)."""

    outcome: str
    dropped: tuple[F, ...] = ()


@dataclass
class FeedbackJoin(Generic[T, F]):
    """Traces waiting for their feedback, and feedback waiting for its trace (module docstring).

    Bounded: at most ``early_limit`` early records (the oldest pushed out first) and ``recent_limit`` remembered
    trace ids of traces gone on (to tell a late record from an early one); waiting traces are bounded by the
    caller (they count in their namespace's buffer)."""

    wait_s: float
    early_s: float
    early_limit: int
    recent_limit: int = 10_000
    _queues: dict[tuple[str, int], deque[_Waiting[T, F]]] = field(default_factory=dict)
    _waiting: dict[tuple[str, str], list[_Waiting[T, F]]] = field(default_factory=dict)
    _early: OrderedDict[tuple[str, str], _Early[F]] = field(default_factory=OrderedDict)
    _recent: OrderedDict[tuple[str, str], None] = field(default_factory=OrderedDict)
    _counts: Counter[str] = field(default_factory=Counter)  # waiting traces per namespace

    def add_trace(self, namespace: str, partition: int, trace_id: str, item: T, now: float) -> None:
        """A trace of a trusted-feedback namespace arrived (in offset order for its namespace and partition); it
        waits until ``now + wait_s`` unless its feedback is here already."""
        waiting: _Waiting[T, F] = _Waiting(trace_id, item, now + self.wait_s)
        early = self._early.pop((namespace, trace_id), None)
        if early is not None:
            waiting.record, waiting.feedback_item = early.record, early.item
        self._queues.setdefault((namespace, partition), deque()).append(waiting)
        self._waiting.setdefault((namespace, trace_id), []).append(waiting)
        self._counts[namespace] += 1

    def offer(self, record: FeedbackRecord, item: F, now: float) -> Offered[F]:
        """A verified feedback record arrived. JOINED: the waiting trace(s) of its id take it (``item`` is done
        when they are); EARLY: kept for a trace to come; DUPLICATE / LATE: not used (``item`` is done now)."""
        key = (record.namespace, record.trace_id)
        waiting = self._waiting.get(key)
        if waiting:
            unjoined = [w for w in waiting if w.record is None]
            if not unjoined:
                return Offered(DUPLICATE)
            for w in unjoined[:1]:  # one item, acknowledged once: the first waiting trace of the id holds it
                w.record, w.feedback_item = record, item
            for w in unjoined[1:]:
                w.record = record
            return Offered(JOINED)
        if key in self._early:
            return Offered(DUPLICATE)
        if key in self._recent:
            return Offered(LATE)
        self._early[key] = _Early(record, item, now + self.early_s)
        dropped = []
        while len(self._early) > self.early_limit:
            dropped.append(self._early.popitem(last=False)[1].item)
        return Offered(EARLY, tuple(dropped))

    def release(self, now: float) -> list[Released[T, F]]:
        """The traces done waiting (joined, or past their deadline), each queue's in its order: a trace leaves
        only after every earlier one of its namespace and partition has."""
        out: list[Released[T, F]] = []
        for qkey, queue in list(self._queues.items()):
            while queue and (queue[0].record is not None or queue[0].deadline <= now):
                w = queue.popleft()
                self._forget_waiting(qkey[0], w)
                out.append(Released(w.item, w.record, w.feedback_item))
            if not queue:
                del self._queues[qkey]
        return out

    def expire(self, now: float) -> list[F]:
        """Early records older than ``early_s``, let go (their items, done with): their trace never came."""
        gone = [k for k, e in self._early.items() if e.expires <= now]
        return [self._early.pop(k).item for k in gone]

    def waiting(self, namespace: str) -> int:
        """How many traces of ``namespace`` wait (they count in its buffer)."""
        return self._counts.get(namespace, 0)

    def early(self) -> int:
        return len(self._early)

    def next_deadline(self) -> float | None:
        """The soonest deadline of a trace at the head of its queue (when :meth:`release` next has work)."""
        heads = [q[0].deadline for q in self._queues.values() if q]
        return min(heads) if heads else None

    def forget(self, partition: int) -> list[T]:
        """The partition was revoked: drop its waiting traces (their new owner reads them again) and return them."""
        dropped = []
        for qkey in [k for k in self._queues if k[1] == partition]:
            for w in self._queues.pop(qkey):
                self._forget_waiting(qkey[0], w, remember=False)
                dropped.append(w.item)
        return dropped

    def forget_early(self, keep: Callable[[F], bool]) -> None:
        """Drop the early records whose item ``keep(item)`` says False about (a revoked feedback partition)."""
        for k in [k for k, e in self._early.items() if not keep(e.item)]:
            del self._early[k]

    def _forget_waiting(self, namespace: str, w: _Waiting[T, F], remember: bool = True) -> None:
        key = (namespace, w.trace_id)
        self._counts[namespace] -= 1
        if not self._counts[namespace]:
            del self._counts[namespace]
        rest = [x for x in self._waiting.get(key, []) if x is not w]
        if rest:
            self._waiting[key] = rest
        else:
            self._waiting.pop(key, None)
        if remember:
            self._recent[key] = None
            self._recent.move_to_end(key)
            while len(self._recent) > self.recent_limit:
                self._recent.popitem(last=False)
