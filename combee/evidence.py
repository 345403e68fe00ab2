"""Why a window changed the playbook: per applied operation, the traces that taught it and their lessons.

Pure. The map stage keeps, per trace, the lessons its reflection stated (:func:`window_lessons`, bounded and
carried to the combiner in the window plan); after the combiner applies a window's delta,
:func:`explain_delta` turns each final operation into an :class:`OpEvidence`: what the curator did (ADD,
UPDATE, REMOVE), what came of it on the playbook (added, changed, confirmed, merged, removed, ...), the bullet
it landed on, the trace ids it cites (``op.sources``: the reflections that taught it, not the whole window) and,
for a few of those traces, the lesson as the reflector stated it. The evidence is logged with the window's
delta record and stored with the version it produced (:data:`EVIDENCE_KEY` of the version's ``meta``), so
``combee prompt diff`` can say why a bullet changed (:mod:`combee.promptdiff`).

Every part is bounded: lessons are cut to :data:`LESSON_CHARS`, an operation quotes at most
:data:`LESSONS_PER_OP` of them, and a version keeps the evidence of at most :data:`EVIDENCE_PER_VERSION`
operations (the rest are counted in :attr:`Explanation.omitted`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from combee.models import LIMITS, AddOp, Bullet, DeltaOp, Playbook, Reflection, RemoveOp, UpdateOp

__all__ = [
    "CARRIED_WINDOWS",
    "EVIDENCE_KEY",
    "EVIDENCE_PER_VERSION",
    "LESSONS_PER_OP",
    "LESSON_CHARS",
    "Explanation",
    "Lesson",
    "LessonLine",
    "OpEvidence",
    "Outcome",
    "carry_evidence",
    "evidence_entry",
    "explain_delta",
    "parse_explanations",
    "window_lessons",
]

EVIDENCE_KEY = "evidence"
"""The key of a published version's ``meta`` that lists the :class:`Explanation` of every window it covers
(JSON; one, unless the publisher carried superseded versions' into it, :func:`carry_evidence`)."""

CARRIED_WINDOWS = 32
"""Most windows' evidence one published version carries (the newest; older superseded ones are dropped)."""

LESSON_CHARS = 240
"""A lesson is quoted up to this many characters (an ellipsis marks a cut)."""

LESSONS_PER_OP = 3
"""Most distinct lessons one operation's evidence quotes (its trace ids are all kept)."""

EVIDENCE_PER_VERSION = 2_000
"""Most operations whose evidence a version keeps; the others are counted, not described."""

Outcome = Literal["added", "changed", "confirmed", "merged", "removed", "evicted", "missing"]
"""What an operation did to the playbook:

* ``added``: an ADD made a new bullet (``bullet_id``);
* ``merged``: an ADD restated a bullet and was folded into it (``bullet_id`` is that bullet; its wording may
  have become the ADD's, more specific one);
* ``changed``: an UPDATE rewrote the bullet;
* ``confirmed``: an UPDATE kept the bullet's wording: its traces taught the bullet again;
* ``removed``: a REMOVE took the bullet out;
* ``evicted``: an ADD whose bullet the token budget dropped in the same window;
* ``missing``: an UPDATE or REMOVE of a bullet that was no longer there (a counted no-op).
"""

_WORD_RE = re.compile(r"[a-z0-9]+")
LessonLine = Annotated[str, StringConstraints(min_length=1, max_length=LESSON_CHARS)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Lesson(_Frozen):
    """A lesson as the reflector of trace ``trace_id`` stated it (cut to :data:`LESSON_CHARS`)."""

    trace_id: Annotated[str, StringConstraints(min_length=1, max_length=LIMITS.trace_id_chars)]
    text: LessonLine


class OpEvidence(_Frozen):
    """One applied operation: the curator's ``op``, its ``outcome``, the bullet, who taught it and what they said."""

    op: Literal["ADD", "UPDATE", "REMOVE"]
    outcome: Outcome
    bullet_id: str
    sources: tuple[str, ...] = Field(default=(), max_length=LIMITS.sources_per_op)
    lessons: tuple[Lesson, ...] = Field(default=(), max_length=LESSONS_PER_OP)


class Explanation(_Frozen):
    """The evidence of the window that made ``version``: one entry per operation (at most
    :data:`EVIDENCE_PER_VERSION`)."""

    version: int = Field(ge=0)
    ops: tuple[OpEvidence, ...] = Field(default=(), max_length=EVIDENCE_PER_VERSION)
    omitted: int = Field(default=0, ge=0)

    def for_bullet(self, bullet_id: str) -> tuple[OpEvidence, ...]:
        return tuple(e for e in self.ops if e.bullet_id == bullet_id)


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= LESSON_CHARS else text[: LESSON_CHARS - 1].rstrip() + "…"


def window_lessons(reflections: Iterable[Reflection]) -> dict[str, tuple[str, ...]]:
    """Per trace id, the lessons its reflection stated (insight contents, each cut to :data:`LESSON_CHARS`).

    Traces whose reflection taught nothing are left out. A trace reflected twice keeps its first reflection.
    """
    out: dict[str, tuple[str, ...]] = {}
    for r in reflections:
        if r.insights and r.trace_id not in out:
            out[r.trace_id] = tuple(dict.fromkeys(_cut(i.content) for i in r.insights))
    return out


def _words(text: str) -> set[str]:
    return set(_WORD_RE.findall(text.casefold()))


def _closest(lessons: Sequence[str], wording: str) -> str | None:
    """The lesson sharing the most words with ``wording`` (the first on a tie); None when there is none."""
    if not lessons:
        return None
    target = _words(wording)
    return max(lessons, key=lambda text: len(_words(text) & target))


def _lessons_for(sources: Sequence[str], wording: str, lessons: Mapping[str, Sequence[str]]) -> tuple[Lesson, ...]:
    """For the cited traces in order, the lesson of each closest to ``wording``; distinct texts only, bounded."""
    quoted: dict[str, Lesson] = {}
    for trace_id in sources:
        text = _closest(lessons.get(trace_id, ()), wording)
        if text is not None and text not in quoted:
            quoted[text] = Lesson(trace_id=trace_id, text=text)
            if len(quoted) >= LESSONS_PER_OP:
                break
    return tuple(quoted.values())


def _number(bullet_id: str) -> int:
    return int(bullet_id[1:])


def _where_added(after: Playbook, bullet_id: str, sources: Sequence[str]) -> tuple[str, Outcome]:
    """Where an ADD's new bullet ended: kept, folded into an older bullet that now cites its traces, or evicted."""
    if after.bullet(bullet_id) is not None:
        return bullet_id, "added"
    cited = set(sources)
    for b in after.bullets:
        if cited & set(b.sources) and _number(b.id) < _number(bullet_id):
            return b.id, "merged"
    return bullet_id, "evicted"


def explain_delta(
    before: Playbook,
    proposed: Sequence[DeltaOp],
    final: Sequence[DeltaOp],
    after: Playbook,
    lessons: Mapping[str, Sequence[str]],
) -> Explanation:
    """Why ``final`` (the operations applied to ``before``, giving ``after``) changed what it changed.

    ``proposed`` are the window's operations as the curators and merges answered them, before they were made
    ready to apply (:func:`combee.engine.finish_ops`): an UPDATE in ``final`` of a bullet no proposed UPDATE
    named is an ADD the de-duplication folded into that bullet (``merged``). ``lessons`` are the window's
    lessons per trace (:func:`window_lessons`). New bullet ids are numbered from ``before.next_id`` in the
    order of the ADDs, as :func:`combee.playbook.apply_delta` numbers them.
    """
    curated = {op.bullet_id for op in proposed if isinstance(op, UpdateOp)}
    old: dict[str, Bullet] = {b.id: b for b in before.bullets}
    next_id = before.next_id
    out: list[OpEvidence] = []
    for op in final[:EVIDENCE_PER_VERSION]:
        if isinstance(op, AddOp):
            bullet_id, outcome = _where_added(after, f"b{next_id:05d}", op.sources)
            next_id += 1
            kind, wording = "ADD", op.content
        elif isinstance(op, UpdateOp):
            was = old.get(op.bullet_id)
            bullet_id, kind, wording = op.bullet_id, "UPDATE", op.content
            if was is None:
                outcome = "missing"
            elif op.bullet_id not in curated:
                outcome = "merged"
            else:
                outcome = "confirmed" if op.content == was.content else "changed"
        else:
            assert isinstance(op, RemoveOp)
            was = old.get(op.bullet_id)
            bullet_id, kind, outcome = op.bullet_id, "REMOVE", "removed" if was is not None else "missing"
            wording = was.content if was is not None else ""
        lessons_of = _lessons_for(op.sources, wording, lessons)
        out.append(OpEvidence(op=kind, outcome=outcome, bullet_id=bullet_id, sources=op.sources, lessons=lessons_of))
    return Explanation(version=after.version, ops=tuple(out), omitted=max(0, len(final) - EVIDENCE_PER_VERSION))


def evidence_entry(explanation: Explanation) -> list[dict[str, Any]]:
    """``meta[EVIDENCE_KEY]`` of the version ``explanation`` made (JSON-ready)."""
    return [explanation.model_dump(mode="json")]


def carry_evidence(superseded: Mapping[str, Any] | None, meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with a superseded (never published) version's evidence in front of its own, the newest
    :data:`CARRIED_WINDOWS` kept: the version that is published explains every window it covers."""
    older, own = (superseded or {}).get(EVIDENCE_KEY), meta.get(EVIDENCE_KEY)
    if not isinstance(older, list) or not isinstance(own, list):
        return meta
    return {**meta, EVIDENCE_KEY: [*older, *own][-CARRIED_WINDOWS:]}


def parse_explanations(meta: Mapping[str, Any] | None) -> tuple[Explanation, ...]:
    """The evidence a published version's ``meta`` holds, oldest window first; malformed entries are skipped."""
    raw = (meta or {}).get(EVIDENCE_KEY)
    out: list[Explanation] = []
    for item in raw if isinstance(raw, list) else ():
        try:
            out.append(Explanation.model_validate(item))
        except ValidationError:
            continue
    return tuple(out)
