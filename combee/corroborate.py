"""Corroboration and caps: one trace, or one producer, must not be able to teach the whole fleet. Pure.

A trace is untrusted input (docs/security.md): :mod:`combee.guard` screens what a lesson says; this module
decides whether enough independent runs said it. Applied by :func:`combee.engine.finish_ops` last, to the
operations that would otherwise be applied (after near duplicates are folded, so an ADD folded into an
UPDATE of an established bullet is judged as that UPDATE). The rules (:class:`Corroboration`; by default only
the harmful-tag rule holds anything back):

* **Teachers.** An operation's teachers are its source traces, each counted as its producer
  (``metadata.producer``) when the trace names one, else as itself: ten traces of one producer are one
  teacher. An operation citing no trace counts as one teacher.
* **Caps** (``trace_cap``, ``producer_cap``): in one window, a trace (a producer) may be a source of at most
  that many new bullets (ADDs). A source over its cap is taken off the ADD; an ADD left with no source is
  refused (reason ``trace_cap`` / ``producer_cap``, counted).
* **Corroboration** (``min_traces`` = k): a new bullet goes live only when at least k distinct teachers taught
  it. Until then it is *pending* (:class:`PendingLesson`: its text, its traces and producers); a later ADD
  that is a near duplicate of it (the de-duplication rule, :meth:`combee.dedup.Similarity.best_match`) adds
  its teachers. Once it has k it goes live as an ADD in that window's delta, citing every trace that taught
  it. The same holds for an UPDATE or a REMOVE of an *established* bullet (``helpful`` ≥
  ``established_helpful``, or pinned): pending until k teachers asked for it (UPDATEs of one bullet corroborate
  one another when their texts are near duplicates; REMOVEs of one bullet always do). An UPDATE or REMOVE of a
  bullet not yet established passes as before.
* **A change is taught by the lessons that state it.** When the window's lessons are known (per trace, what its
  reflection said: :func:`combee.evidence.window_lessons`), an UPDATE of an established bullet that adds
  content (at least :data:`CHANGE_WORDS` content words its bullet did not have, :func:`added_words`) counts as
  teachers only the cited traces whose own lessons state at least half of the added words
  (:func:`stated_by`). Citing a genuine trace does not lend its voice to a clause only the attacker's traces
  said: on the real model a near-duplicate attack rewrote an established lesson through an UPDATE that cited
  nine attack traces and one genuine one (docs/results/redteam-real-3, ``b00006``). Held for this reason when
  the cited teachers alone would have been enough: counted ``change_unstated``.
* **Harmful tags** (``harmful_tags``, default 2): harmful tags on an established bullet count only when at
  least that many reflections of the window (and at least k) tagged it harmful (:func:`corroborate_tags`).
  A trace reports which bullets its agent used and whether it succeeded, so without this rule one crafted
  failure marks any lesson harmful; the red-team suite saw it on the real model (docs/results/redteam-real).
  The taggers are counted as teachers too (:func:`combee.playbook.harmful_taggers`): two traces of one
  producer in one window are one.
* **Pending pool.** Pending lessons stay across windows until they are corroborated, their bullet goes away
  (an UPDATE or REMOVE of a bullet no longer there is dropped), or the pool is over ``max_pending``: the
  least recently supported go first (counted ``expired``). The pool is state beside the playbook (the stream
  keeps it in Redis, :mod:`streams.pending`; the offline learner carries it from window to window).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from combee.dedup import Similarity
from combee.embeddings import NearDuplicates
from combee.models import GENERAL_SECTION, LIMITS, AddOp, BulletId, DeltaOp, Playbook, RemoveOp, Section, UpdateOp
from combee.wording import content_words

__all__ = [
    "CHANGE_WORDS",
    "DEFAULT_HARMFUL_TAGS",
    "HELD_REASONS",
    "Corroborated",
    "Corroboration",
    "PendingLesson",
    "added_words",
    "corroborate",
    "corroborate_tags",
    "corroborate_with",
    "established",
    "stated_by",
    "teachers",
]

HELD_REASONS = ("pending", "trace_cap", "producer_cap", "expired", "harmful_tag", "change_unstated")
"""Why an operation did not go live in its window (a bounded set: it labels a metric)."""

DEFAULT_HARMFUL_TAGS = 2
"""Reflections of one window that must tag an established bullet harmful before the tags count (module docstring)."""

CHANGE_WORDS = 2
"""Content words an UPDATE must add to its bullet before only the lessons that state them count its teachers (fewer:
a rewording, taught by every trace it cites)."""

_MAX_TRACES = 64  # trace ids kept per pending lesson (its teachers are counted from them)


@dataclass(frozen=True)
class Corroboration:
    """A namespace's corroboration rules (module docstring). By default only a lone harmful tag on an established
    bullet is held back."""

    min_traces: int = 1
    trace_cap: int | None = None
    producer_cap: int | None = None
    established_helpful: int = 1
    max_pending: int = 256
    harmful_tags: int = DEFAULT_HARMFUL_TAGS

    def __post_init__(self) -> None:
        if min(self.min_traces, self.established_helpful, self.harmful_tags) < 1 or self.max_pending < 0:
            raise ValueError("min_traces, established_helpful and harmful_tags must be >= 1, max_pending >= 0")
        if any(c is not None and c < 1 for c in (self.trace_cap, self.producer_cap)):
            raise ValueError("a cap must be >= 1 (or None: no cap)")

    @property
    def active(self) -> bool:
        return self.min_traces > 1 or self.trace_cap is not None or self.producer_cap is not None


class PendingLesson(BaseModel):
    """An operation waiting for corroboration: what it would do, and who taught it so far."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: Annotated[str, StringConstraints(pattern=r"^p[0-9a-f]{12}$")]
    namespace: str
    op: Literal["ADD", "UPDATE", "REMOVE"]
    section: Section = GENERAL_SECTION
    bullet_id: BulletId | None = None
    content: Annotated[str, StringConstraints(max_length=LIMITS.bullet_chars)] = ""
    traces: tuple[str, ...] = Field(default=(), max_length=_MAX_TRACES)
    producers: tuple[str, ...] = Field(default=(), max_length=_MAX_TRACES)
    # distinct teachers so far: "p:<producer>" or "t:<trace id>" (what ``min_traces`` counts)
    teachers: tuple[str, ...] = Field(default=(), max_length=_MAX_TRACES)
    # trace id -> verified producer (combee.identity) of the traces above that were signed: recorded in the bullet
    # when the lesson goes live, however many windows later
    verified: dict[str, str] = Field(default_factory=dict, max_length=_MAX_TRACES)
    # trace id -> producer of the trusted feedback (combee.feedback) the traces above were joined to: recorded in
    # the bullet's feedback_producers when the lesson goes live
    graded: dict[str, str] = Field(default_factory=dict, max_length=_MAX_TRACES)
    first_window: Annotated[str, StringConstraints(max_length=256)]
    last_window: Annotated[str, StringConstraints(max_length=256)]
    windows: int = Field(default=1, ge=1)
    held_at: float
    supported_at: float

    def as_op(self) -> DeltaOp:
        if self.op == "UPDATE" and self.bullet_id is not None:
            return UpdateOp(bullet_id=self.bullet_id, content=self.content, sources=self.traces)
        if self.op == "REMOVE" and self.bullet_id is not None:
            return RemoveOp(bullet_id=self.bullet_id)
        return AddOp(section=self.section, content=self.content, sources=self.traces)


@dataclass(frozen=True)
class Corroborated:
    """A window's operations after corroboration: the ones that go live, the pool after the window (every
    entry, in pool order), the pool ids that went live or were dropped, and the counts of what was held."""

    ops: tuple[DeltaOp, ...]
    pending: tuple[PendingLesson, ...] = ()
    resolved: tuple[str, ...] = ()
    held: Mapping[str, int] = field(default_factory=dict)
    changed: tuple[str, ...] = ()  # the pool ids whose entry this window wrote
    verified: Mapping[str, str] = field(default_factory=dict)  # trace -> verified producer of the lessons gone live
    graded: Mapping[str, str] = field(default_factory=dict)  # trace -> trusted feedback's producer, the same


def established(playbook: Playbook, bullet_id: str, policy: Corroboration) -> bool:
    """Whether bullet ``bullet_id`` is established: pinned, or found helpful at least ``established_helpful``
    times (a bullet nobody found helpful yet is as new as an ADD, and may be changed as before)."""
    b = playbook.bullet(bullet_id)
    return b is not None and (b.pinned or b.helpful >= policy.established_helpful)


def _sources(op: DeltaOp) -> tuple[str, ...]:
    return tuple(getattr(op, "sources", ()) or ())


def teachers(traces: Sequence[str], producers: Mapping[str, str]) -> set[str]:
    """The distinct teachers of ``traces``: a trace's producer when known, else the trace itself."""
    return {f"p:{producers[t]}" if t in producers else f"t:{t}" for t in traces}


def _cap(
    ops: Sequence[DeltaOp], producers: Mapping[str, str], policy: Corroboration, held: Counter[str]
) -> list[DeltaOp]:
    """The ADDs of ``ops`` with the sources over their trace or producer cap taken off (an ADD left with no
    source refused and counted); other operations as they are."""
    if policy.trace_cap is None and policy.producer_cap is None:
        return list(ops)
    per_trace: Counter[str] = Counter()
    per_producer: Counter[str] = Counter()
    out: list[DeltaOp] = []
    for op in ops:
        if not isinstance(op, AddOp) or not op.sources:
            out.append(op)
            continue
        kept, refusal = [], "trace_cap"
        for t in op.sources:
            if policy.trace_cap is not None and per_trace[t] >= policy.trace_cap:
                continue
            p = producers.get(t)
            if p is not None and policy.producer_cap is not None and per_producer[p] >= policy.producer_cap:
                refusal = "producer_cap"
                continue
            kept.append(t)
        if not kept:
            held[refusal] += 1
            continue
        per_trace.update(kept)
        per_producer.update({producers[t] for t in kept if t in producers})
        out.append(op if len(kept) == len(op.sources) else op.model_copy(update={"sources": tuple(kept)}))
    return out


def _pending_id(namespace: str, window_id: str, op: DeltaOp) -> str:
    target = op.section if isinstance(op, AddOp) else getattr(op, "bullet_id", "")
    digest = hashlib.sha256("\x1f".join((namespace, window_id, op.op, target, getattr(op, "content", ""))).encode())
    return "p" + digest.hexdigest()[:12]


def _match(op: DeltaOp, pool: Mapping[str, PendingLesson], similarity: Similarity) -> str | None:
    """The pool entry ``op`` corroborates: a near-duplicate ADD, an UPDATE of the same bullet with a near
    duplicate text, a REMOVE of the same bullet."""
    if isinstance(op, RemoveOp):
        return next((k for k, e in pool.items() if e.op == "REMOVE" and e.bullet_id == op.bullet_id), None)
    if isinstance(op, UpdateOp):
        same = [(k, e.content) for k, e in pool.items() if e.op == "UPDATE" and e.bullet_id == op.bullet_id]
        return similarity.best_match(op.content, same)
    if isinstance(op, AddOp):
        return similarity.best_match(op.content, [(k, e.content) for k, e in pool.items() if e.op == "ADD"])
    return None


def _support(
    entry: PendingLesson | None,
    op: DeltaOp,
    producers: Mapping[str, str],
    verified: Mapping[str, str],
    where: tuple[str, float, str],
    graded: Mapping[str, str],
    stated: Sequence[str] | None = None,
) -> PendingLesson:
    """``entry`` (or a new entry for ``op``) with ``op``'s teachers added; ``where`` is (window id, time,
    namespace). ``stated``: the cited traces that count as teachers (:func:`stated_by`; None: all of them);
    every cited trace is recorded."""
    window_id, at, ns = where
    srcs = _sources(op) or (f"window:{window_id}",)
    new_teachers = sorted(teachers(srcs if stated is None else stated, producers))
    new_producers = [producers[t] for t in srcs if t in producers]
    if entry is None:
        return PendingLesson(
            id=_pending_id(ns, window_id, op),
            namespace=ns,
            op=op.op,
            section=op.section if isinstance(op, AddOp) else GENERAL_SECTION,
            bullet_id=getattr(op, "bullet_id", None),
            content=getattr(op, "content", "")[: LIMITS.bullet_chars],
            traces=tuple(dict.fromkeys(srcs))[-_MAX_TRACES:],
            producers=tuple(dict.fromkeys(new_producers))[-_MAX_TRACES:],
            teachers=tuple(new_teachers)[-_MAX_TRACES:],
            verified=_verified_of(srcs, {}, verified),
            graded=_verified_of(srcs, {}, graded),
            first_window=window_id,
            last_window=window_id,
            held_at=at,
            supported_at=at,
        )
    update: dict[str, object] = {
        "traces": tuple(dict.fromkeys((*entry.traces, *srcs)))[-_MAX_TRACES:],
        "producers": tuple(dict.fromkeys((*entry.producers, *new_producers)))[-_MAX_TRACES:],
        "teachers": tuple(dict.fromkeys((*entry.teachers, *new_teachers)))[-_MAX_TRACES:],
        "verified": _verified_of((*entry.traces, *srcs), entry.verified, verified),
        "graded": _verified_of((*entry.traces, *srcs), entry.graded, graded),
        "supported_at": at,
    }
    if window_id != entry.last_window:
        update |= {"last_window": window_id, "windows": entry.windows + 1}
    if isinstance(op, AddOp | UpdateOp):  # the newest wording
        update["content"] = op.content[: LIMITS.bullet_chars]
    return entry.model_copy(update=update)


def _verified_of(traces: Sequence[str], known: Mapping[str, str], verified: Mapping[str, str]) -> dict[str, str]:
    """Trace -> verified producer (or trusted feedback's producer) of the most recent ``_MAX_TRACES`` of
    ``traces`` (the ones a lesson keeps)."""
    kept = tuple(dict.fromkeys(traces))[-_MAX_TRACES:]
    both = {**known, **verified}
    return {t: both[t] for t in kept if t in both}


def _live(entry: PendingLesson, op: DeltaOp) -> DeltaOp:
    """``op`` as it goes live once ``entry`` is corroborated: citing every trace that taught it."""
    if isinstance(op, AddOp | UpdateOp):
        return op.model_copy(update={"sources": tuple(t for t in entry.traces if not t.startswith("window:"))})
    return op


def _needs_corroboration(op: DeltaOp, playbook: Playbook, policy: Corroboration) -> bool:
    if isinstance(op, AddOp):
        return True
    bullet_id = getattr(op, "bullet_id", None)
    return bullet_id is not None and established(playbook, bullet_id, policy)


def _stale(entry: PendingLesson, playbook: Playbook) -> bool:
    """An UPDATE or REMOVE whose bullet is gone: nothing left to corroborate."""
    return entry.bullet_id is not None and entry.op != "ADD" and playbook.bullet(entry.bullet_id) is None


def added_words(op: DeltaOp, playbook: Playbook) -> frozenset[str]:
    """The content words (:func:`combee.wording.content_words`) an UPDATE's text adds to its bullet in
    ``playbook``; empty for any other operation or a bullet not there."""
    old = playbook.bullet(op.bullet_id) if isinstance(op, UpdateOp) else None
    if old is None or not isinstance(op, UpdateOp):
        return frozenset()
    return content_words(op.content) - content_words(old.content)


def stated_by(op: DeltaOp, playbook: Playbook, lessons: Mapping[str, Sequence[str]] | None) -> tuple[str, ...] | None:
    """The traces ``op`` cites whose own lessons state what it adds to its bullet (module docstring): each
    trace's lessons together hold at least half of :func:`added_words`. None (every cited trace counts) when
    ``lessons`` is None (not known, as in a plan written before they were carried) or ``op`` adds fewer than
    :data:`CHANGE_WORDS` content words. A cited trace with no lessons states nothing."""
    added = added_words(op, playbook)
    if lessons is None or len(added) < CHANGE_WORDS:
        return None
    need = (len(added) + 1) // 2
    return tuple(t for t in _sources(op) if len(added & content_words(" ".join(lessons.get(t, ())))) >= need)


def corroborate(
    ops: Sequence[DeltaOp],
    pending: Sequence[PendingLesson],
    playbook: Playbook,
    policy: Corroboration,
    *,
    window_id: str,
    at: float,
    producers: Mapping[str, str] | None = None,
    verified: Mapping[str, str] | None = None,
    similarity: Similarity | None = None,
    graded: Mapping[str, str] | None = None,
    lessons: Mapping[str, Sequence[str]] | None = None,
) -> Corroborated:
    """``ops`` (a window's finished operations against ``playbook``) judged by ``policy`` against the pool
    ``pending`` (module docstring). ``producers`` maps a trace id to its producer (traces not in it are their
    own teacher), ``verified`` to its verified producer (kept with a pending lesson, returned in
    ``Corroborated.verified`` when it goes live), ``graded`` to the producer of its trusted feedback (the same,
    in ``Corroborated.graded``), ``lessons`` to the lessons its reflection stated (None: not known; an UPDATE's
    teachers are then all the traces it cites); ``similarity`` is the near-duplicate rule over the texts of
    ``ops`` and ``pending`` (None: equal texts only). Deterministic; the order of ``ops`` is kept for the ones
    that go live, and a pending lesson that goes live takes the place of the operation that corroborated it."""
    if not policy.active and not pending:
        return Corroborated(tuple(ops))
    producers, verified, graded = producers or {}, verified or {}, graded or {}
    similarity = similarity or Similarity()
    went_live: dict[str, str] = {}
    graded_live: dict[str, str] = {}
    held: Counter[str] = Counter()
    pool = {e.id: e for e in pending if not _stale(e, playbook)}
    resolved = [e.id for e in pending if e.id not in pool]
    changed: list[str] = []
    live: list[DeltaOp] = []
    for op in _cap(ops, producers, policy, held):
        if not _needs_corroboration(op, playbook, policy):
            live.append(op)
            continue
        key = _match(op, pool, similarity)
        where = (window_id, at, playbook.namespace)
        stated = stated_by(op, playbook, lessons) if policy.min_traces > 1 else None  # k = 1: every cited trace
        entry = _support(pool.get(key) if key else None, op, producers, verified, where, graded, stated)
        if len(entry.teachers) >= policy.min_traces:
            live.append(_live(entry, op))
            went_live.update(entry.verified)
            graded_live.update(entry.graded)
            if key is not None:
                del pool[key]
                resolved.append(key)
            continue
        held["pending"] += 1
        if stated is not None:
            cited = _support(pool.get(key) if key else None, op, producers, verified, where, graded)
            held["change_unstated"] += len(cited.teachers) >= policy.min_traces
        if key is not None:
            del pool[key]  # re-inserted last: the pool's order is by last support
        pool[entry.id] = entry
        changed.append(entry.id)
    if len(pool) > policy.max_pending:
        for key in list(pool)[: len(pool) - policy.max_pending]:
            del pool[key]
            resolved.append(key)
            held["expired"] += 1
    kept = tuple(pool.values())
    changed_kept = tuple(c for c in changed if c in pool)
    return Corroborated(tuple(live), kept, tuple(resolved), dict(held), changed_kept, went_live, graded_live)


def corroborate_tags(
    tag_counts: Mapping[str, tuple[int, int]],
    playbook: Playbook,
    policy: Corroboration,
    *,
    taggers: Mapping[str, Sequence[str]] | None = None,
    producers: Mapping[str, str] | None = None,
) -> tuple[dict[str, tuple[int, int]], int]:
    """``tag_counts`` (``{bullet_id: (helpful, harmful)}`` of one window) with the harmful tags of an established
    bullet dropped when fewer than ``harmful_tags`` (or ``min_traces``, the larger) teachers gave them; and how
    many tags were dropped.

    ``taggers`` (:func:`combee.playbook.harmful_taggers`: per bullet, the traces whose reflections tagged it
    harmful) counts the teachers as :func:`teachers` does, each trace as its producer when ``producers`` names
    one: two traces of one producer are one teacher. Tags that count count once per teacher, on an established
    bullet and on a new one alike (a producer that sent ten failed runs beside one other producer's adds one
    tag, not ten: the red-team suite saw an attacker's tags outnumber the genuine agents' they rode in with,
    docs/results/redteam-real-4); a new bullet needs no quorum. A bullet missing from ``taggers`` (or no
    ``taggers``: a plan written before they were carried) counts one teacher per tag, as every reflection is one
    trace's."""
    needed = max(policy.min_traces, policy.harmful_tags)
    if needed <= 1:
        return dict(tag_counts), 0
    out: dict[str, tuple[int, int]] = {}
    dropped = 0
    for bullet_id, (helpful, harmful) in tag_counts.items():
        traces = (taggers or {}).get(bullet_id)
        count = harmful if traces is None else len(teachers(traces, producers or {}))
        if harmful > 0:
            # an established bullet needs `needed` teachers; a new one takes the tags at once, once per teacher
            kept = min(count, harmful)
            if kept < needed and established(playbook, bullet_id, policy):
                kept = 0
            dropped += harmful - kept
            harmful = kept
        out[bullet_id] = (helpful, harmful)
    return out, dropped


async def corroborate_with(
    ops: Sequence[DeltaOp],
    pending: Sequence[PendingLesson],
    playbook: Playbook,
    policy: Corroboration,
    dedup: NearDuplicates | None,
    *,
    producers: Mapping[str, str],
    verified: Mapping[str, str] | None = None,
    window_id: str,
    at: float,
    graded: Mapping[str, str] | None = None,
    lessons: Mapping[str, Sequence[str]] | None = None,
) -> Corroborated:
    """:func:`combee.corroborate.corroborate` with the near-duplicate rule's vectors for the texts it compares
    (none needed, and none asked for, while the pool is empty)."""
    similarity = None
    if dedup is not None and pending:
        texts = [e.content for e in pending if e.content]
        texts += [op.content for op in ops if isinstance(op, AddOp | UpdateOp)]
        similarity = await dedup.similarity(texts)
    return corroborate(
        ops, pending, playbook, policy, window_id=window_id, at=at, producers=producers, verified=verified,
        similarity=similarity, graded=graded, lessons=lessons,
    )  # fmt: skip
