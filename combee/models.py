"""Domain models of the method: traces, reflections, bullets, playbooks and deltas.

All models are frozen pydantic models with hard size limits on every free-text field, enforced at validation,
so nothing oversized or malformed gets past the edge. These are *domain* models; the wire envelopes that carry
them through Kafka live in :mod:`streams.envelopes` and wrap these.
"""

from __future__ import annotations

import enum
import re
import unicodedata
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from combee.errors import InvalidNamespace

__all__ = [
    "LIMITS",
    "PRODUCER_ID_PATTERN",
    "AddOp",
    "Bullet",
    "BulletTag",
    "Delta",
    "DeltaOp",
    "Feedback",
    "Insight",
    "Limits",
    "Playbook",
    "ProducerId",
    "Reflection",
    "RemoveOp",
    "Step",
    "Tag",
    "Trace",
    "TraceId",
    "UpdateOp",
    "normalise_section",
    "one_line",
    "validate_namespace",
]


class Limits:
    """Size limits. Generous for real agent traces, small enough that one record cannot hurt a worker."""

    namespace_chars = 64
    trace_id_chars = 128
    task_chars = 8_000
    step_chars = 4_000
    max_steps = 200
    output_chars = 8_000
    feedback_chars = 4_000
    ground_truth_chars = 2_000
    metadata_items = 32
    metadata_key_chars = 64
    metadata_value_chars = 512
    bullet_ids_used = 512
    trace_bytes = 256 * 1024  # a whole encoded trace record
    section_chars = 48
    bullet_chars = 600
    diagnosis_chars = 2_000
    insights_per_reflection = 8
    tags_per_reflection = 256
    ops_per_llm_answer = 48  # what one curator/merge call may propose; more is rejected as malformed
    ops_per_delta = 20_000  # a merged window delta (bounded by the window size)
    sections = 24  # distinct sections a playbook may hold; more fold into "general"
    sources_per_op = 64  # trace ids an operation cites (the reflections that taught it)
    sources_per_bullet = 16  # trace ids a bullet keeps (the most recent; ``support`` counts them all)
    producers_per_bullet = 16  # verified producer ids a bullet keeps (the most recent)


LIMITS = Limits()

_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_SECTION_RE = re.compile(r"[^a-z0-9]+")
_BULLET_ID_RE = re.compile(r"^b\d{5,9}$")
GENERAL_SECTION = "general"


def validate_namespace(name: str) -> str:
    """Return ``name`` if it is safe as a Kafka key and a Redis key component, else raise InvalidNamespace.

    Allowed: 1–64 characters of ASCII letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit.
    Colons, spaces, slashes, braces and wildcards are refused because they have meaning in Redis keys/patterns.
    """
    if not isinstance(name, str) or not _NAMESPACE_RE.fullmatch(name):
        shown = name if isinstance(name, str) and len(name) <= 80 else f"{str(name)[:80]}…"
        raise InvalidNamespace(
            f"invalid namespace {shown!r}: use 1-64 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def normalise_section(section: str) -> str:
    """Canonical section slug: lowercase ASCII words joined by ``_``, at most 48 characters; empty -> general."""
    folded = unicodedata.normalize("NFKD", section).encode("ascii", "ignore").decode("ascii").lower()
    slug = _SECTION_RE.sub("_", folded).strip("_")[: LIMITS.section_chars].strip("_")
    return slug or GENERAL_SECTION


# Every C0 control character but newline and tab, DEL, and every C1 control character (U+0080-U+009F: a terminal
# reads U+009B as CSI, the start of an escape sequence, just as it reads ESC [). Carriage return is dropped too: on
# a terminal it rewinds the line, so the text after it would overwrite what a reader was shown.
_CONTROL_CHARS_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# The same and newline and tab: for one-line fields (ids, kinds, metadata), which a log line prints whole.
_LINE_CONTROL_CHARS_RE = re.compile("[\x00-\x1f\x7f-\x9f]")


def _no_control_chars(text: str) -> str:
    # Newlines and tabs are fine in free text; other control characters are dropped, not rejected, so a trace
    # copied from a terminal still validates. They would otherwise end up in prompts, in Redis, in logs and on
    # terminals (`combee prompt diff`). (A regular expression: every string of every envelope passes here, and a
    # per-character loop was a tenth of a worker's CPU.)
    return _CONTROL_CHARS_RE.sub("", text) if _CONTROL_CHARS_RE.search(text) else text


def one_line(text: str) -> str:
    """``text`` without any control character, newline and tab included (ids, step kinds, metadata; and text read
    back from a store that may predate these rules)."""
    return _LINE_CONTROL_CHARS_RE.sub("", text) if _LINE_CONTROL_CHARS_RE.search(text) else text


def _one_line_id(text: str) -> str:
    text = one_line(text)
    if not text:
        raise ValueError("holds nothing but control characters")
    return text


def _lesson_text(v: str) -> str:
    v = _no_control_chars(v).strip()
    if not v:
        raise ValueError("content is empty")
    return v


def _section_slug(v: Any) -> Any:
    return normalise_section(v) if isinstance(v, str) else v


Namespace = Annotated[str, StringConstraints(min_length=1, max_length=LIMITS.namespace_chars)]
BulletId = Annotated[str, StringConstraints(pattern=r"^b\d{5,9}$")]
# The text of a lesson (insight, bullet, ADD/UPDATE): control characters dropped, trimmed, never empty.
LessonText = Annotated[
    str, StringConstraints(min_length=1, max_length=LIMITS.bullet_chars), AfterValidator(_lesson_text)
]
# A producer id with a key (combee.identity): the namespace alphabet, so it is safe in logs, keys and labels.
PRODUCER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
ProducerId = Annotated[str, StringConstraints(pattern=PRODUCER_ID_PATTERN)]
# A trace id: one line, control characters dropped (it is logged and shown as a bullet's source).
TraceId = Annotated[
    str, StringConstraints(min_length=1, max_length=LIMITS.trace_id_chars), AfterValidator(_one_line_id)
]
# Free text of a trace (task, output, step content, feedback): newlines and tabs kept, other control chars dropped.
FreeText = AfterValidator(_no_control_chars)
# The traces whose reflections taught an operation (or a bullet), in first-cited order, without repeats.
Sources = Annotated[tuple[TraceId, ...], Field(max_length=LIMITS.sources_per_op), AfterValidator(
    lambda v: tuple(dict.fromkeys(v))
)]  # fmt: skip


# A section name, normalised to a slug before its length is checked.
Section = Annotated[
    str, BeforeValidator(_section_slug), StringConstraints(min_length=1, max_length=LIMITS.section_chars)
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=False)


class Step(_Frozen):
    """One step of an agent's trajectory (a thought, an action, a tool result, ...)."""

    kind: Annotated[str, StringConstraints(min_length=1, max_length=32), AfterValidator(_one_line_id)] = "step"
    content: Annotated[str, StringConstraints(max_length=LIMITS.step_chars), FreeText]


class Feedback(_Frozen):
    """How the run went: any of a score, a success flag, the ground truth and a free-text message."""

    score: float | None = Field(default=None, allow_inf_nan=False)
    success: bool | None = None
    ground_truth: Annotated[str, StringConstraints(max_length=LIMITS.ground_truth_chars), FreeText] | None = None
    message: Annotated[str, StringConstraints(max_length=LIMITS.feedback_chars), FreeText] | None = None


MetadataKey = Annotated[str, StringConstraints(max_length=LIMITS.metadata_key_chars), AfterValidator(one_line)]
MetadataValue = (
    Annotated[str, StringConstraints(max_length=LIMITS.metadata_value_chars), AfterValidator(one_line)]
    | int
    | Annotated[float, Field(allow_inf_nan=False)]
    | bool
    | None
)


class Trace(_Frozen):
    """One agent run, published by the fleet: the unit Combee learns from.

    ``namespace`` names the playbook the trace teaches (namespaces never mix). ``playbook_version`` and
    ``bullet_ids`` say which prompt the agent ran with and which bullets it used, so reflections can tag them.
    ``trajectory`` is accepted as a single-string alternative to ``steps`` on input.
    """

    schema_version: Literal[1] = 1
    trace_id: TraceId
    namespace: Namespace
    task: Annotated[str, StringConstraints(min_length=1, max_length=LIMITS.task_chars), FreeText]
    steps: tuple[Step, ...] = Field(default=(), max_length=LIMITS.max_steps)
    output: Annotated[str, StringConstraints(max_length=LIMITS.output_chars), FreeText] = ""
    feedback: Feedback = Field(default_factory=Feedback)
    playbook_version: int | None = Field(default=None, ge=0)
    bullet_ids: tuple[BulletId, ...] = Field(default=(), max_length=LIMITS.bullet_ids_used)
    metadata: dict[MetadataKey, MetadataValue] = Field(default_factory=dict, max_length=LIMITS.metadata_items)
    created_at: datetime | None = None

    @model_validator(mode="before")
    @classmethod
    def _accept_trajectory(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "trajectory" in data:
            data = dict(data)
            trajectory = data.pop("trajectory")
            if data.get("steps"):
                raise ValueError("give either 'steps' or 'trajectory', not both")
            if isinstance(trajectory, str):
                data["steps"] = [{"kind": "trajectory", "content": trajectory}]
            elif isinstance(trajectory, list):
                data["steps"] = trajectory
            else:
                raise ValueError("'trajectory' must be a string or a list of steps")
        return data

    @field_validator("namespace")
    @classmethod
    def _namespace_safe(cls, v: str) -> str:
        try:
            return validate_namespace(v)
        except InvalidNamespace as exc:
            raise ValueError(str(exc)) from None


class Tag(enum.StrEnum):
    HELPFUL = "helpful"
    HARMFUL = "harmful"
    NEUTRAL = "neutral"


class BulletTag(_Frozen):
    bullet_id: BulletId
    tag: Tag


class Insight(_Frozen):
    """A candidate lesson proposed by the reflector: where it belongs and what it says."""

    section: Section
    content: LessonText


class Reflection(_Frozen):
    """The reflector's reading of one trace, computed against playbook version ``base_version``."""

    trace_id: TraceId
    base_version: int = Field(ge=0)
    diagnosis: Annotated[str, StringConstraints(max_length=LIMITS.diagnosis_chars), FreeText] = ""
    insights: tuple[Insight, ...] = Field(default=(), max_length=LIMITS.insights_per_reflection)
    tags: tuple[BulletTag, ...] = Field(default=(), max_length=LIMITS.tags_per_reflection)


class Provenance(_Frozen):
    """Where a bullet came from: the window whose delta created or last changed it, and at which version."""

    window_id: Annotated[str, StringConstraints(max_length=256)]
    version: int = Field(ge=0)


class Bullet(_Frozen):
    """One playbook entry. ``helpful``/``harmful`` count reflection tags over the bullet's lifetime."""

    id: BulletId
    section: Annotated[str, StringConstraints(min_length=1, max_length=LIMITS.section_chars)]
    # Cleaned again here: a playbook may be read back from a snapshot written before these rules (or tampered).
    content: Annotated[str, StringConstraints(min_length=1, max_length=LIMITS.bullet_chars), FreeText]
    helpful: int = Field(default=0, ge=0)
    harmful: int = Field(default=0, ge=0)
    created: Provenance
    updated: Provenance
    # The traces whose reflections taught or changed it: the most recent ``sources_per_bullet`` ids, and how
    # many distinct traces were ever cited (ids older than the kept ones are counted, not kept).
    sources: tuple[TraceId, ...] = Field(default=(), max_length=LIMITS.sources_per_bullet)
    support: int = Field(default=0, ge=0)
    # The verified producers (combee.identity) whose signed traces taught or changed it, the most recent kept.
    # A producer a trace merely names in its metadata is never recorded here. Empty before identity existed.
    verified_producers: tuple[ProducerId, ...] = Field(default=(), max_length=LIMITS.producers_per_bullet)
    # The producers whose trusted feedback (combee.feedback) graded the traces that taught or changed it, the most
    # recent kept: a lesson learned from an outcome the agent did not report itself. Empty: agent feedback only.
    feedback_producers: tuple[ProducerId, ...] = Field(default=(), max_length=LIMITS.producers_per_bullet)
    # Pinned by an operator (``combee bullet pin``): learning never updates, removes, folds or evicts it.
    pinned: bool = False

    @property
    def score(self) -> int:
        """helpful − harmful: the eviction order under a token budget (lowest goes first)."""
        return self.helpful - self.harmful


class AddOp(_Frozen):
    op: Literal["ADD"] = "ADD"
    section: Section
    content: LessonText
    sources: Sources = ()


class UpdateOp(_Frozen):
    op: Literal["UPDATE"] = "UPDATE"
    bullet_id: BulletId
    content: LessonText
    sources: Sources = ()


class RemoveOp(_Frozen):
    op: Literal["REMOVE"] = "REMOVE"
    bullet_id: BulletId
    sources: Sources = ()


DeltaOp = Annotated[AddOp | UpdateOp | RemoveOp, Field(discriminator="op")]


class Delta(_Frozen):
    """Operations against playbook version ``base_version``, produced for window ``window_id``.

    Bullet tags are not operations: they are counted separately (:func:`combee.playbook.count_tags`) and
    carried in ``tag_counts`` as ``{bullet_id: (helpful, harmful)}`` increments.
    """

    namespace: Namespace
    window_id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    base_version: int = Field(ge=0)
    ops: tuple[DeltaOp, ...] = Field(default=(), max_length=LIMITS.ops_per_delta)
    tag_counts: dict[BulletId, tuple[int, int]] = Field(default_factory=dict)
    trace_count: int = Field(default=0, ge=0)
    # trace id -> verified producer of the window's signed traces: apply records them in the bullets they teach
    verified_producers: dict[TraceId, ProducerId] = Field(default_factory=dict, max_length=LIMITS.ops_per_delta)
    # trace id -> producer of the trace's trusted feedback (combee.feedback): recorded in the bullets they teach
    feedback_producers: dict[TraceId, ProducerId] = Field(default_factory=dict, max_length=LIMITS.ops_per_delta)


class Playbook(_Frozen):
    """The learned system prompt of one namespace, as structured bullets.

    ``version`` increases by one per applied delta. ``next_id`` is the counter fresh bullet ids come from, so
    ids are never reused, even after removals.
    """

    namespace: Namespace
    version: int = Field(default=0, ge=0)
    bullets: tuple[Bullet, ...] = ()
    next_id: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _unique_ids(self) -> Playbook:
        ids = [b.id for b in self.bullets]
        if len(ids) != len(set(ids)):
            raise ValueError("playbook bullet ids must be unique")
        return self

    def bullet(self, bullet_id: str) -> Bullet | None:
        for b in self.bullets:
            if b.id == bullet_id:
                return b
        return None

    @property
    def sections(self) -> tuple[str, ...]:
        """Sections in order of first appearance."""
        seen: dict[str, None] = {}
        for b in self.bullets:
            seen.setdefault(b.section, None)
        return tuple(seen)


def is_bullet_id(value: str) -> bool:
    return bool(_BULLET_ID_RE.fullmatch(value))
