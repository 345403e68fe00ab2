"""Versioned wire envelopes between the stages. Decoded in one place: :mod:`streams.codec`.

Each envelope names its schema (``"combee.window/1"`` …) so that a worker that meets a newer, unknown schema
dead-letters it with a clear reason instead of mis-reading it. Domain models (traces, reflections, ops,
playbooks) travel inside envelopes unchanged; envelopes add only routing and bookkeeping.

Flow (as in README.md, "How it works")::

    traces ──window stage──▶ windows (WindowEnvelope: the window decision and its traces, durable)
    windows ──map stage──▶ reflect (ReflectTask: a slice of a window's traces, to any worker of the pool)
    reflect ──reflect workers──▶ reflections (Reflected: the slice's reflections, back to the window's owner)
    reflections ──map stage──▶ groups (GroupTask per level-1 group) + partials (WindowPlan: what to expect)
    groups ──curate workers──▶ partials (Partial, level 1)
    partials ──combiner──▶ merges (levels ≥ 2) ▶ apply ▶ deltas (DeltaRecord), playbooks (Snapshot), Redis
    combiner taking a partition ──▶ deltas (Claim: the epoch its DeltaRecords carry; streams/deltalog.py)
    any stage ──▶ deadletter (DeadLetter) for records it cannot accept
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from combee.evidence import Explanation, LessonLine
from combee.models import Delta, DeltaOp, Playbook, ProducerId, Reflection, Trace, TraceId
from combee.plan import ShuffleKey
from combee.quarantine import QuarantinedBullet
from combee.scan import ReduceTracker
from combee.screen import RunFacts

__all__ = [
    "Claim",
    "Control",
    "DeadLetter",
    "DeltaRecord",
    "Envelope",
    "GroupTask",
    "Partial",
    "ReflectTask",
    "Reflected",
    "Snapshot",
    "WindowEnvelope",
    "WindowPlan",
]


class _Envelope(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WindowEnvelope(_Envelope):
    """A closed window: which traces (by source partition and offsets) and the traces themselves.

    Written before the traces' offsets are committed, so a window, once decided, is never re-formed
    differently after a crash: a restarted window stage reads its own decisions back from this topic.
    """

    schema_: Literal["combee.window/1"] = Field(default="combee.window/1", alias="schema")
    window_id: str
    namespace: str
    source: str
    first_offset: int
    last_offset: int
    offsets: tuple[int, ...]
    seed_key: str
    closed_by: Literal["size", "max_wait", "backlog", "replay"]
    traces: tuple[Trace, ...]
    closed_at: float
    verified_producers: dict[TraceId, ProducerId] = Field(
        default_factory=dict,
        description="trace id -> producer, for the traces whose signature the window stage verified "
        "(combee.identity); a producer a trace only names is not here",
    )
    feedback_producers: dict[TraceId, ProducerId] = Field(
        default_factory=dict,
        description="trace id -> producer of the trusted feedback the trace was joined to (combee.feedback); "
        "such a trace's own feedback was replaced",
    )

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class ReflectTask(_Envelope):
    """Reflect on a slice of window ``window_id``'s traces (task ``index``) against ``playbook`` (frozen).

    Any worker may take it; redoing it is harmless (the window's owner keeps the first answer per task)."""

    schema_: Literal["combee.reflect/1"] = Field(default="combee.reflect/1", alias="schema")
    window_id: str
    namespace: str
    seq: int
    index: int = Field(ge=0)
    playbook: Playbook
    traces: tuple[Trace, ...] = Field(min_length=1)

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Reflected(_Envelope):
    """The answer to a :class:`ReflectTask`: one reflection per trace of the slice, in order (None where the
    trace's answers never parsed), computed against playbook version ``base_version``."""

    schema_: Literal["combee.reflected/1"] = Field(default="combee.reflected/1", alias="schema")
    window_id: str
    namespace: str
    index: int = Field(ge=0)
    base_version: int = Field(ge=0)
    reflections: tuple[Reflection | None, ...]
    service_s: float = 0.0
    worker: str = ""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class GroupTask(_Envelope):
    """One level-1 curator call: a group's reflections against playbook version ``base_version``."""

    schema_: Literal["combee.group/1"] = Field(default="combee.group/1", alias="schema")
    window_id: str
    namespace: str
    seq: int
    index: int = Field(ge=0)
    playbook: Playbook
    reflections: tuple[Reflection, ...]

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class WindowPlan(_Envelope):
    """Sent to the combiner when a window is mapped: what to expect and what to apply besides the ops.

    ``groups``, ``tree``, ``roots`` and ``unite`` lay out the window's reduce (:class:`combee.plan.Forest`):
    the paper's shape is one tree whose root is the delta; a keyed shape is one tree per section, or bare
    groups, whose roots are united."""

    schema_: Literal["combee.plan/1"] = Field(default="combee.plan/1", alias="schema")
    window_id: str
    namespace: str
    seq: int
    source: str
    first_offset: int
    last_offset: int
    offsets: tuple[int, ...] = ()
    seed_key: str = ""
    trace_count: int
    reflections: int
    base_version: int
    groups: int = Field(ge=0)
    tree: tuple[tuple[tuple[int, ...], ...], ...] = Field(
        description="merge levels: tree[i][j] lists the children (nodes of level i+1) of node j of level i+2"
    )
    shape: ShuffleKey = Field(
        default="none", description="the reduce's shape (combee.engine.SHUFFLE_KEYS); none before shapes existed"
    )
    roots: tuple[tuple[int, int], ...] = Field(
        default=(),
        description="the nodes (level, index) whose operations make the window's delta, in order; "
        "empty: the last level's one node (plans written before reduce shapes)",
    )
    unite: bool = Field(default=False, description="the roots' operations united (exact duplicates dropped)")
    tag_counts: dict[str, tuple[int, int]]
    harmful_taggers: dict[str, tuple[str, ...]] = Field(
        default_factory=dict,
        description="bullet id -> the traces whose reflections tagged it harmful (combee.playbook.harmful_taggers): "
        "corroboration counts their producers; empty in plans written before it was carried",
    )
    closed_at: float
    mapped_at: float
    map_service_s: float = 0.0
    skipped_traces: int = 0
    trace_ids: tuple[str, ...] = Field(default=(), description="the window's traces (provenance of what it taught)")
    producers: dict[str, str] = Field(
        default_factory=dict,
        description="trace id -> producer the window's traces count as (combee.identity.counted_producer: the "
        "verified one, else the one named in metadata): corroboration counts a producer's traces as one teacher",
    )
    verified_producers: dict[TraceId, ProducerId] = Field(
        default_factory=dict,
        description="trace id -> verified producer (WindowEnvelope.verified_producers): recorded in the bullets",
    )
    feedback_producers: dict[TraceId, ProducerId] = Field(
        default_factory=dict,
        description="trace id -> producer of its trusted feedback (WindowEnvelope.feedback_producers): recorded in "
        "the bullets",
    )
    lessons: dict[str, tuple[LessonLine, ...]] = Field(
        default_factory=dict,
        description="per trace id, the lessons its reflection stated, cut short (combee.evidence.window_lessons); "
        "the combiner quotes them in the evidence of the version",
    )
    run_facts: dict[TraceId, RunFacts] = Field(
        default_factory=dict,
        description="trace id -> its particular numbers, numeric answer and listed ground truth "
        "(combee.screen.RunFacts): the combiner's screen judges each operation against its source runs; empty in "
        "plans written before it was carried (then only the rules that need no run apply)",
    )

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _reduce_is_whole(self) -> WindowPlan:
        """A plan whose roots are not nodes of its reduce is refused at decoding (dead-lettered), never half run."""
        ReduceTracker(self.groups, self.tree, self.roots, self.unite)  # raises ValueError
        return self


class Partial(_Envelope):
    """A partial delta for node (``level``, ``index``) of a window's reduce; idempotent per that key."""

    schema_: Literal["combee.partial/1"] = Field(default="combee.partial/1", alias="schema")
    window_id: str
    namespace: str
    level: int = Field(ge=1)
    index: int = Field(ge=0)
    ops: tuple[DeltaOp, ...]
    ok: bool = True
    service_s: float = 0.0
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Control(_Envelope):
    """An operator command for a namespace's combiner: roll back to an earlier version's content
    (``to_version``), act on one bullet (``bullet_id``: release a quarantined one, remove, pin or unpin a
    live one; combee/quarantine.py), or promote / reject a candidate version (``to_version``;
    combee/promotion.py). Each but a promotion makes the next version."""

    schema_: Literal["combee.control/1"] = Field(default="combee.control/1", alias="schema")
    namespace: str
    kind: Literal["rollback", "release", "remove", "pin", "unpin", "promote", "reject"]
    to_version: int = Field(default=0, ge=0)
    bullet_id: str | None = Field(default=None, max_length=16, description="a bullet id, or a quarantine id")
    # Several live bullets removed in one version (kind ``remove`` only). Left out of the record when empty, so a
    # record without it is byte for byte what it was before the field existed (and its signature unchanged).
    bullet_ids: tuple[Annotated[str, Field(max_length=16)], ...] = Field(
        default=(), max_length=4096, exclude_if=lambda ids: not ids, description="live bullets removed at once"
    )
    actor: str | None = Field(default=None, max_length=128, description="who asked (OS user or --actor)")
    requested_at: float
    signature: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="hex HMAC-SHA256 of the record without it, under COMBEE_CONTROL_KEY (streams/control_auth.py)",
    )

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def _several_only_to_remove(self) -> Control:
        if self.bullet_ids and (self.kind != "remove" or self.bullet_id is not None):
            raise ValueError("bullet_ids names the bullets of a remove, instead of bullet_id")
        return self


class Claim(_Envelope):
    """A combiner taking ownership of one partition of the deltas log. Its offset there is the *epoch* that
    every :class:`DeltaRecord` it appends afterwards carries; a later claim fences it (streams/deltalog.py)."""

    schema_: Literal["combee.claim/1"] = Field(default="combee.claim/1", alias="schema")
    partition: int = Field(ge=0)
    owner: str = Field(description="who claimed: host/pid/random id of the worker process")
    claimed_at: float

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class DeltaRecord(_Envelope):
    """The log of applied windows: one record per window (or control action) and playbook version.

    ``epoch`` is the offset of the writer's :class:`Claim` in this partition; records written before claims
    existed have none (streams/deltalog.py says which records count)."""

    schema_: Literal["combee.delta/1"] = Field(default="combee.delta/1", alias="schema")
    namespace: str
    version: int
    window_id: str
    seq: int
    source: str | None = None
    last_offset: int | None = None
    offsets: tuple[int, ...] = ()
    seed_key: str | None = None
    delta: Delta
    trace_count: int
    entries: int
    closed_at: float | None = None
    applied_at: float
    critical_path_s: float = 0.0
    shape: ShuffleKey = Field(
        default="none", description="the reduce shape the window was learned with (a replay uses the same)"
    )
    note: str | None = None
    rollback_to: int | None = None
    playbook: Playbook | None = Field(default=None, description="the resulting playbook, for rollback records")
    epoch: int | None = Field(default=None, ge=0, description="offset of the writer's claim in this partition")
    trace_ids: tuple[str, ...] = Field(default=(), description="the window's traces (provenance of what it taught)")
    evidence: Explanation | None = Field(
        default=None, description="per operation, the traces that taught it and their lessons (combee.evidence)"
    )
    quarantined: tuple[QuarantinedBullet, ...] = Field(
        default=(), description="operations the guard held back in this window (combee.guard), to be stored"
    )
    resolves: str | None = Field(default=None, description="the quarantine id an operator's release published")

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Snapshot(_Envelope):
    """Latest state of a namespace (compacted topic): the playbook and the exactly-once ledger.

    ``delta_offset`` is the offset, in the deltas log, of the record that produced this playbook, and ``epoch``
    that record's epoch (the claim in force there): together, a point a replay of the log may start after."""

    schema_: Literal["combee.snapshot/1"] = Field(default="combee.snapshot/1", alias="schema")
    playbook: Playbook
    applied: tuple[str, ...] = ()
    watermarks: tuple[tuple[str, int], ...] = ()
    next_seq: int = 0
    delta_offset: int = -1
    epoch: int | None = Field(default=None, ge=0)
    updated_at: float

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class DeadLetter(_Envelope):
    """A record a stage refused, with why and where it came from. ``value_preview`` is a bounded excerpt."""

    schema_: Literal["combee.deadletter/1"] = Field(default="combee.deadletter/1", alias="schema")
    stage: str
    reason: str
    topic: str
    partition: int
    offset: int
    key: str | None = None
    size: int
    value_preview: str
    received_at: datetime

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


Envelope = Annotated[
    WindowEnvelope
    | ReflectTask
    | Reflected
    | GroupTask
    | WindowPlan
    | Partial
    | Control
    | Claim
    | DeltaRecord
    | Snapshot
    | DeadLetter,
    Field(discriminator="schema_"),
]
