"""Quarantined lessons and the operator's actions on bullets, as pure values and functions.

The guard (:mod:`combee.guard`) holds back an operation whose text must not go live; the combiner stores it
as a :class:`QuarantinedBullet` (per namespace, in Redis: ``streams.quarantine``) with its reason, the traces
that taught it, the window and the time. It is never rendered into the prompt. An operator lists it, and
either releases it (:func:`release`: applied as a new version, as a window's delta would be) or removes it.
The operator can also remove a live bullet (:func:`remove_bullet`) or pin it (:func:`set_pinned`: learning
then never rewrites, removes or evicts it, :func:`combee.playbook.apply_delta`). Each action makes the next
version of the playbook; the combiner publishes it through the same commit as a window. Every action is
recorded as an :class:`AuditEntry` (``combee bullet audit``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from combee.errors import CombeeError
from combee.models import (
    GENERAL_SECTION,
    LIMITS,
    AddOp,
    BulletId,
    Delta,
    DeltaOp,
    LessonText,
    Playbook,
    Section,
    Sources,
    UpdateOp,
)
from combee.playbook import ApplyPolicy, apply_delta

__all__ = [
    "ACTIONS",
    "AuditEntry",
    "QuarantineId",
    "QuarantinedBullet",
    "UnknownBullet",
    "is_quarantine_id",
    "quarantine_id",
    "quarantined",
    "release",
    "remove_bullet",
    "remove_bullets",
    "set_pinned",
    "text_hash",
]

ACTIONS = ("release", "remove", "pin", "unpin")
"""The operator's actions on bullets (a :class:`AuditEntry`'s ``action``)."""

QuarantineId = Annotated[str, StringConstraints(pattern=r"^q[0-9a-f]{12}$")]


class UnknownBullet(CombeeError):
    """The bullet (live or quarantined) an operator named is not there."""


def is_quarantine_id(value: str) -> bool:
    return len(value) == 13 and value[0] == "q" and all(c in "0123456789abcdef" for c in value[1:])


def text_hash(text: str) -> str:
    """The SHA-256 of a lesson's text (UTF-8), hex: how the audit log names a text without repeating it."""
    return hashlib.sha256(text.encode()).hexdigest()


def quarantine_id(window_id: str, op: DeltaOp) -> str:
    """A stable id for an operation held back in window ``window_id``: a redelivered window stores it again
    under the same id, never twice."""
    target = op.section if isinstance(op, AddOp) else getattr(op, "bullet_id", "")
    digest = hashlib.sha256("\x1f".join((window_id, op.op, target, getattr(op, "content", ""))).encode())
    return "q" + digest.hexdigest()[:12]


class QuarantinedBullet(BaseModel):
    """An ADD or UPDATE the guard held back: what it would have written, why not, who taught it, when."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: QuarantineId
    namespace: str
    op: Literal["ADD", "UPDATE"]
    section: Section = GENERAL_SECTION
    bullet_id: BulletId | None = None
    content: LessonText
    reason: Annotated[str, StringConstraints(min_length=1, max_length=32)]
    sources: Sources = ()
    window_id: Annotated[str, StringConstraints(max_length=256)]
    base_version: int = Field(ge=0)
    quarantined_at: float

    def as_op(self) -> DeltaOp:
        if self.op == "UPDATE" and self.bullet_id is not None:
            return UpdateOp(bullet_id=self.bullet_id, content=self.content, sources=self.sources)
        return AddOp(section=self.section, content=self.content, sources=self.sources)


def quarantined(
    namespace: str, window_id: str, base_version: int, held: Iterable[tuple[DeltaOp, str]], at: float
) -> tuple[QuarantinedBullet, ...]:
    """The entries to store for the operations ``held`` back in one window (one per distinct id)."""
    out: dict[str, QuarantinedBullet] = {}
    for op, reason in held:
        if not isinstance(op, AddOp | UpdateOp):
            continue
        qid = quarantine_id(window_id, op)
        out.setdefault(
            qid,
            QuarantinedBullet(
                id=qid,
                namespace=namespace,
                op=op.op,
                section=op.section if isinstance(op, AddOp) else GENERAL_SECTION,
                bullet_id=op.bullet_id if isinstance(op, UpdateOp) else None,
                content=op.content[: LIMITS.bullet_chars],
                reason=reason,
                sources=op.sources,
                window_id=window_id,
                base_version=base_version,
                quarantined_at=at,
            ),
        )
    return tuple(out.values())


def release(playbook: Playbook, entry: QuarantinedBullet, window_id: str, policy: ApplyPolicy) -> Playbook:
    """The next version of ``playbook`` with ``entry`` applied as learning would have applied it: an UPDATE of
    a bullet still there and not pinned rewrites it; otherwise (an ADD, or its bullet is gone or pinned) the
    text is added as a new bullet, in the ADD's section or the updated bullet's."""
    op = entry.as_op()
    if isinstance(op, UpdateOp):
        target = playbook.bullet(op.bullet_id)
        if target is None or target.pinned:
            section = target.section if target is not None else entry.section
            op = AddOp(section=section, content=op.content, sources=op.sources)
    delta = Delta(namespace=playbook.namespace, window_id=window_id, base_version=playbook.version, ops=(op,))
    return apply_delta(playbook, delta, policy)[0]


def _require(playbook: Playbook, bullet_id: str) -> None:
    if playbook.bullet(bullet_id) is None:
        raise UnknownBullet(f"{playbook.namespace}: no bullet {bullet_id} in version {playbook.version}")


def remove_bullet(playbook: Playbook, bullet_id: str) -> Playbook:
    """The next version of ``playbook`` without bullet ``bullet_id`` (pinned or not: the operator decides).
    Raises :class:`UnknownBullet` when it is not there."""
    _require(playbook, bullet_id)
    kept = tuple(b for b in playbook.bullets if b.id != bullet_id)
    return playbook.model_copy(update={"version": playbook.version + 1, "bullets": kept})


def remove_bullets(playbook: Playbook, bullet_ids: Sequence[str]) -> Playbook:
    """The next version of ``playbook`` without any of ``bullet_ids``: one version, however many are named.
    Raises :class:`UnknownBullet` when one is not there (and removes none)."""
    for bullet_id in bullet_ids:
        _require(playbook, bullet_id)
    gone = set(bullet_ids)
    kept = tuple(b for b in playbook.bullets if b.id not in gone)
    return playbook.model_copy(update={"version": playbook.version + 1, "bullets": kept})


def set_pinned(playbook: Playbook, bullet_id: str, pinned: bool) -> Playbook:
    """The next version of ``playbook`` with bullet ``bullet_id`` pinned (or unpinned). Raises
    :class:`UnknownBullet` when it is not there."""
    _require(playbook, bullet_id)
    bullets = tuple(b.model_copy(update={"pinned": pinned}) if b.id == bullet_id else b for b in playbook.bullets)
    return playbook.model_copy(update={"version": playbook.version + 1, "bullets": bullets})


class AuditEntry(BaseModel):
    """One operator action on a bullet, as the audit log keeps it (append-only, per namespace)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action: Literal["release", "remove", "pin", "unpin"]
    namespace: str
    bullet_id: Annotated[str, StringConstraints(min_length=1, max_length=16)]
    text_sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None
    actor: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    at: float
    outcome: Annotated[str, StringConstraints(max_length=256)] = ""
    version: int | None = None
