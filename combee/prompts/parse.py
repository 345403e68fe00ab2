"""Parsing every role's answer into typed values.

**Parsing never drops silently.** An answer yields a :class:`Parsed` value or raises
:class:`~combee.errors.LLMParseError` with a ``kind`` and a message precise enough to send back to the model
as a repair turn (:meth:`Ask.again`). A missing required key is a failure, never an empty result. Items are
salvaged one by one: an answer with some invalid operations (or tags, or proposal ids) keeps the valid ones
and lists what it dropped in :attr:`Parsed.invalid`; only an answer whose every item is invalid fails. The
JSON object is found in code fences of any spelling, in prose around exactly one object, and after a
``<think>``/``<reasoning>`` block; two different objects are refused as ambiguous.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from combee.errors import LLMParseError
from combee.models import (
    LIMITS,
    AddOp,
    BulletTag,
    DeltaOp,
    Insight,
    Reflection,
    RemoveOp,
    UpdateOp,
)
from combee.playbook import with_sources
from combee.prompts.extract import first_validation_error, load_object, require_keys, shown_ids
from combee.sections import label_of

__all__ = [
    "MergeAnswer",
    "Parsed",
    "Proposal",
    "T",
    "parse_answer",
    "parse_merge",
    "parse_operations",
    "parse_reflection",
    "read_merge",
    "read_operations",
    "read_reflection",
    "resolve_merge",
]


T = TypeVar("T")


@dataclass(frozen=True)
class Parsed(Generic[T]):
    """A parsed answer and what was dropped from it (one reason per invalid item), for counting."""

    value: T
    invalid: tuple[str, ...] = ()


@dataclass(frozen=True)
class Proposal:
    """An operation offered to a merge call under the id ``p<N>``."""

    id: str
    op: DeltaOp


class _RawOp(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    op: str
    section: str | None = None
    content: str | None = None
    bullet_id: str | None = None
    cited: Any = Field(default=None, alias="from")


def _section(raw: Any, sections: Sequence[str] | None) -> str:
    """A section label: an offered one as is, ``new: <name>`` as the name's slug. Lenient beyond the schema
    (which admits only those two forms): any other text is taken as a label too, slugged, and canonicalised
    later like any new one (:func:`combee.engine.section_map`) — a model without a grammar loses nothing."""
    text = raw.strip() if isinstance(raw, str) else ""
    label = label_of(text, sections) if sections is not None else None
    return label if label is not None else (text or "general")


def _sources(raw: Any, refs: Mapping[str, str] | None) -> tuple[str, ...]:
    """The trace ids an operation cites through ``from`` (the refs of the reflections shown). Lenient beyond
    the schema (which requires at least one shown ref): refs that were not shown are left out and a missing
    ``from`` cites nothing — the operation is still a lesson, only its provenance is unknown."""
    if refs is None or not isinstance(raw, list):
        return ()
    return tuple(dict.fromkeys(refs[r] for r in raw if isinstance(r, str) and r in refs))[: LIMITS.sources_per_op]


def _to_op(
    raw: Any,
    where: str,
    bullet_ids: Collection[str] | None,
    sections: Sequence[str] | None = None,
    refs: Mapping[str, str] | None = None,
) -> DeltaOp:
    """One operation, or raise LLMParseError. With ``bullet_ids`` given, UPDATE/REMOVE must name one of them;
    ``sections`` and ``refs`` read the section and the cited reflections (:func:`_section`, :func:`_sources`)."""
    try:
        r = _RawOp.model_validate(raw)
    except ValidationError as exc:
        raise LLMParseError(f"{where}: invalid operation ({first_validation_error(exc)})", kind="bad_shape") from None
    kind = r.op.strip().upper()
    if kind not in ("ADD", "UPDATE", "REMOVE"):
        raise LLMParseError(f"{where}: unknown operation {r.op!r} (expected ADD, UPDATE or REMOVE)", kind="bad_shape")
    bullet_id = (r.bullet_id or "").strip()
    if kind != "ADD" and bullet_ids is not None and bullet_id not in bullet_ids:
        raise LLMParseError(
            f"{where}: {kind} names bullet_id {bullet_id!r}, which is not a bullet shown {shown_ids(bullet_ids)}",
            kind="bad_shape",
        )
    sources = _sources(r.cited, refs)
    try:
        if kind == "ADD":
            section = _section(r.section, sections)
            return AddOp(section=section, content=r.content or "", sources=sources)
        if kind == "UPDATE":
            return UpdateOp(bullet_id=bullet_id, content=r.content or "", sources=sources)
        return RemoveOp(bullet_id=bullet_id, sources=sources)
    except ValidationError as exc:
        raise LLMParseError(f"{where}: invalid {kind} ({first_validation_error(exc)})", kind="bad_shape") from None


def _no_valid(what: str, reasons: Sequence[str]) -> LLMParseError:
    shown = "; ".join(reasons[:3]) + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")
    return LLMParseError(f"no usable {what}: {shown}", kind="no_valid_items")


def read_reflection(
    text: str,
    trace_id: str,
    base_version: int,
    *,
    bullet_ids: Collection[str] | None = None,
    sections: Sequence[str] | None = None,
) -> Parsed[Reflection]:
    """Parse a reflector answer. ``bullet_ids``: the ids the request showed (None: any well-formed id);
    ``sections``: the sections it offered (None: any label, slugged).

    Required: ``insights``, and ``bullet_tags`` when bullets were shown. Invalid insights and tags (an id that
    was not shown, an unknown tag) are dropped and listed in ``invalid``; an answer whose every insight is
    invalid raises.
    """
    obj = load_object(text)
    require_keys(obj, ["insights", "bullet_tags"] if bullet_ids else ["insights"])
    insights_raw, tags_raw = obj["insights"], obj.get("bullet_tags", [])
    if not isinstance(insights_raw, list):
        raise LLMParseError("'insights' must be a list", kind="bad_shape")
    if not isinstance(tags_raw, list):
        raise LLMParseError("'bullet_tags' must be a list", kind="bad_shape")
    if len(insights_raw) > LIMITS.insights_per_reflection:
        raise LLMParseError(
            f"too many insights: {len(insights_raw)} > {LIMITS.insights_per_reflection}", kind="too_many"
        )
    if len(tags_raw) > LIMITS.tags_per_reflection:
        raise LLMParseError(f"too many bullet_tags: {len(tags_raw)} > {LIMITS.tags_per_reflection}", kind="too_many")
    diagnosis = obj.get("diagnosis") or ""
    if not isinstance(diagnosis, str):
        raise LLMParseError("'diagnosis' must be a string", kind="bad_shape")
    invalid: list[str] = []
    insights: list[Insight] = []
    for i, raw in enumerate(insights_raw):
        try:
            if sections is not None and isinstance(raw, dict):
                raw = {**raw, "section": _section(raw.get("section"), sections)}
            insights.append(Insight.model_validate(raw))
        except ValidationError as exc:
            invalid.append(f"insight {i + 1}: {first_validation_error(exc)}")
    if insights_raw and not insights:
        raise _no_valid("insight", invalid)
    tags: list[BulletTag] = []
    for i, raw in enumerate(tags_raw):
        try:
            tag = BulletTag.model_validate(raw)
        except ValidationError as exc:
            invalid.append(f"bullet_tag {i + 1}: {first_validation_error(exc)}")
            continue
        if bullet_ids is not None and tag.bullet_id not in bullet_ids:
            invalid.append(f"bullet_tag {i + 1}: {tag.bullet_id!r} is not a bullet shown {shown_ids(bullet_ids)}")
            continue
        tags.append(tag)
    reflection = Reflection(
        trace_id=trace_id,
        base_version=base_version,
        diagnosis=diagnosis[: LIMITS.diagnosis_chars],
        insights=tuple(insights),
        tags=tuple(tags),
    )
    return Parsed(reflection, tuple(invalid))


def parse_reflection(
    text: str,
    trace_id: str,
    base_version: int,
    *,
    bullet_ids: Collection[str] | None = None,
    sections: Sequence[str] | None = None,
) -> Reflection:
    """:func:`read_reflection`'s value (what was dropped is not reported)."""
    return read_reflection(text, trace_id, base_version, bullet_ids=bullet_ids, sections=sections).value


def read_operations(
    text: str,
    *,
    bullet_ids: Collection[str] | None = None,
    sections: Sequence[str] | None = None,
    refs: Mapping[str, str] | None = None,
) -> Parsed[tuple[DeltaOp, ...]]:
    """Parse a curator answer. ``bullet_ids``: the ids UPDATE/REMOVE may name (None: any well-formed id);
    ``sections``: the sections an ADD may use (None: any); ``refs``: the reflections shown (ref -> trace id),
    which every operation must cite in ``from`` (None: no ``from``).

    Invalid operations are dropped and listed; an answer whose every operation is invalid, or with more than
    ``LIMITS.ops_per_llm_answer`` operations, raises.
    """
    obj = load_object(text)
    require_keys(obj, ["operations"])
    ops_raw = obj["operations"]
    if not isinstance(ops_raw, list):
        raise LLMParseError("'operations' must be a list", kind="bad_shape")
    if len(ops_raw) > LIMITS.ops_per_llm_answer:
        raise LLMParseError(f"too many operations: {len(ops_raw)} > {LIMITS.ops_per_llm_answer}", kind="too_many")
    ops: list[DeltaOp] = []
    invalid: list[str] = []
    for i, raw in enumerate(ops_raw):
        try:
            ops.append(_to_op(raw, f"operation {i + 1}", bullet_ids, sections, refs))
        except LLMParseError as exc:
            invalid.append(str(exc))
    if ops_raw and not ops:
        raise _no_valid("operation", invalid)
    return Parsed(tuple(ops), tuple(invalid))


def parse_operations(
    text: str,
    *,
    bullet_ids: Collection[str] | None = None,
    sections: Sequence[str] | None = None,
    refs: Mapping[str, str] | None = None,
) -> tuple[DeltaOp, ...]:
    """:func:`read_operations`'s value (what was dropped is not reported)."""
    return read_operations(text, bullet_ids=bullet_ids, sections=sections, refs=refs).value


@dataclass(frozen=True)
class MergeAnswer:
    keep: tuple[str, ...]
    combine: tuple[tuple[tuple[str, ...], DeltaOp], ...]


def read_merge(
    text: str,
    *,
    proposal_ids: Collection[str] | None = None,
    bullet_ids: Collection[str] | None = None,
    sections: Sequence[str] | None = None,
) -> Parsed[MergeAnswer]:
    """Parse a merger answer (ids to keep, groups to combine).

    Required: ``keep`` and ``combine`` (both empty is an explicit "keep nothing"). With ``proposal_ids``, ids
    that were not listed are dropped (a combine entry left with no known source is dropped whole); with
    ``bullet_ids``, combined UPDATE/REMOVE must name one of them. Everything dropped is listed; an answer
    whose every entry is invalid raises.
    """
    obj = load_object(text)
    require_keys(obj, ["keep", "combine"])
    keep_raw, combine_raw = obj["keep"], obj["combine"]
    if not isinstance(keep_raw, list):
        raise LLMParseError("'keep' must be a list of proposal ids", kind="bad_shape")
    if not isinstance(combine_raw, list):
        raise LLMParseError("'combine' must be a list", kind="bad_shape")
    if len(combine_raw) > LIMITS.ops_per_llm_answer:
        raise LLMParseError(
            f"too many combined operations: {len(combine_raw)} > {LIMITS.ops_per_llm_answer}", kind="too_many"
        )
    invalid: list[str] = []

    def known(pid: Any, where: str) -> bool:
        if not isinstance(pid, str):
            invalid.append(f"{where}: {pid!r} is not a proposal id")
            return False
        if proposal_ids is not None and pid not in proposal_ids:
            invalid.append(f"{where}: {pid!r} is not a listed proposal {shown_ids(proposal_ids)}")
            return False
        return True

    keep = tuple(pid for pid in keep_raw if known(pid, "keep"))
    groups: list[tuple[tuple[str, ...], DeltaOp]] = []
    for i, entry in enumerate(combine_raw):
        where = f"combine entry {i + 1}"
        if not isinstance(entry, dict) or not isinstance(entry.get("from"), list) or not entry["from"]:
            invalid.append(f"{where} needs a non-empty 'from' list and an 'op'")
            continue
        sources = tuple(pid for pid in entry["from"] if known(pid, where))
        if not sources:
            continue
        try:
            groups.append((sources, _to_op(entry.get("op"), where, bullet_ids, sections)))
        except LLMParseError as exc:
            invalid.append(str(exc))
    if (keep_raw or combine_raw) and not keep and not groups:
        raise _no_valid("keep id or combine entry", invalid)
    return Parsed(MergeAnswer(keep=keep, combine=tuple(groups)), tuple(invalid))


def parse_merge(
    text: str,
    *,
    proposal_ids: Collection[str] | None = None,
    bullet_ids: Collection[str] | None = None,
    sections: Sequence[str] | None = None,
) -> MergeAnswer:
    """:func:`read_merge`'s value (what was dropped is not reported)."""
    return read_merge(text, proposal_ids=proposal_ids, bullet_ids=bullet_ids, sections=sections).value


def resolve_merge(proposals: Sequence[Proposal], answer: MergeAnswer) -> tuple[tuple[DeltaOp, ...], int, int]:
    """The merged operations, in the order of each one's first proposal; the count of unknown ids; and the count
    of combine entries dropped because the answer also kept every proposal they combine.

    A kept proposal stays, even when a ``combine`` entry names it too (keeping by id loses nothing, and the
    prompt asks not to restate a kept proposal); a combined operation replaces the proposals it names that were
    not kept, is placed where the first of its known proposals stood, and cites the traces of every proposal it
    combines. A combine entry whose every known proposal was kept is dropped: the local model answered "keep
    all 35" and "combine all 35 into one" in one answer, and the combined text was a vague line in place of 35
    lessons (docs/results/overload-formula64-final).
    """
    position = {p.id: i for i, p in enumerate(proposals)}
    kept = {pid for pid in answer.keep if pid in position}
    unknown = sum(1 for pid in answer.keep if pid not in position)
    redundant = 0
    placed: list[tuple[int, int, DeltaOp]] = []
    consumed: set[str] = set()
    for j, (sources, op) in enumerate(answer.combine):
        known = [position[s] for s in sources if s in position]
        unknown += len(sources) - len(known)
        if not known:
            continue
        if all(s in kept for s in sources if s in position):
            redundant += 1
            continue
        consumed.update(s for s in sources if s in position and s not in kept)
        cited = [proposals[i].op.sources for i in sorted(known)]
        placed.append((min(known), 1 + j, with_sources(op.model_copy(update={"sources": ()}), *cited)))
    seen: set[str] = set()
    for pid in answer.keep:
        if pid in position and pid not in consumed and pid not in seen:
            seen.add(pid)
            placed.append((position[pid], 0, proposals[position[pid]].op))
    placed.sort(key=lambda t: (t[0], t[1]))
    return tuple(op for _, _, op in placed), unknown, redundant


def parse_answer(text: str) -> str:
    """The generator's final answer (``final_answer``; ``reasoning`` is optional), or raise LLMParseError."""
    obj = load_object(text)
    require_keys(obj, ["final_answer"])
    answer = obj["final_answer"]
    if not isinstance(answer, str | int | float) or isinstance(answer, bool):
        raise LLMParseError("'final_answer' must be a string", kind="bad_shape")
    return str(answer).strip()
