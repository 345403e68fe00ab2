"""Playbook algebra: deterministic tag counting, delta application, de-duplication, token budget, rendering.

Laws (tested with hypothesis in ``tests/unit/test_playbook_laws.py``):

* ``count_tags`` is independent of the order of reflections (it is a sum).
* ``apply_delta`` with an empty delta and no tags only bumps the version.
* ``apply_window`` of a window already applied returns the state unchanged (exactly-once effect).
* the same state and the same delta always give the same result (fresh ids come from a counter, never reused).
* after ``apply_delta`` no two bullets share a de-duplication key and the rendering fits the token budget.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from combee.guard import one_line_lesson
from combee.models import (
    GENERAL_SECTION,
    LIMITS,
    AddOp,
    Bullet,
    Delta,
    DeltaOp,
    Playbook,
    Provenance,
    Reflection,
    RemoveOp,
    Tag,
    UpdateOp,
)
from combee.tokens import estimate_tokens
from combee.wording import more_specific

__all__ = [
    "ApplyPolicy",
    "ApplyStats",
    "Deduplicator",
    "NormalisedText",
    "PlaybookState",
    "TokenJaccard",
    "apply_delta",
    "apply_window",
    "cite",
    "count_tags",
    "fit_budget",
    "harmful_taggers",
    "normalise_text",
    "playbook_tokens",
    "render_prompt",
    "settling_mark",
    "unite_ops",
    "with_producers",
    "with_sources",
]

_PUNCT_RE = re.compile(r"[^\w\s]+")
_SPACE_RE = re.compile(r"\s+")


def normalise_text(text: str) -> str:
    """Case-, accent-, punctuation- and whitespace-insensitive form of a bullet's content."""
    folded = unicodedata.normalize("NFKD", text)
    folded = "".join(c for c in folded if not unicodedata.combining(c)).casefold()
    return _SPACE_RE.sub(" ", _PUNCT_RE.sub(" ", folded)).strip()


def with_sources(op: DeltaOp, *more: Iterable[str]) -> DeltaOp:
    """``op`` citing also the traces of ``more`` (after its own, first-cited order, no repeats, bounded)."""
    cited = tuple(dict.fromkeys([*op.sources, *(s for group in more for s in group)]))[: LIMITS.sources_per_op]
    return op if cited == op.sources else op.model_copy(update={"sources": cited})


def unite_ops(partials: Iterable[Sequence[DeltaOp]]) -> tuple[DeltaOp, ...]:
    """The partials' operations in order, each exact duplicate (same kind, bullet and normalised content) after
    its first dropped, its sources added to the first's. Associative when order is kept: uniting united parts
    gives the same as uniting them all."""
    first: dict[tuple[str, str, str], int] = {}
    out: list[DeltaOp] = []
    for partial in partials:
        for op in partial:
            key = (op.op, getattr(op, "bullet_id", ""), normalise_text(getattr(op, "content", "")))
            if key in first:
                out[first[key]] = with_sources(out[first[key]], op.sources)
            else:
                first[key] = len(out)
                out.append(op)
    return tuple(out)


def cite(
    bullet: Bullet,
    sources: Iterable[str],
    verified: Mapping[str, str] | None = None,
    feedback: Mapping[str, str] | None = None,
) -> Bullet:
    """``bullet`` taught again by ``sources``: the most recent ``sources_per_bullet`` ids kept, and ``support``
    raised by each id not already kept (an id that has fallen out of the kept ones counts again). ``verified``
    maps a trace id to its verified producer: those of ``sources`` join ``verified_producers`` (most recent kept);
    ``feedback`` maps a trace id to the producer of its trusted feedback (combee.feedback): those join
    ``feedback_producers`` the same way."""
    sources = tuple(dict.fromkeys(sources))
    bullet = with_producers(bullet, ((verified or {}).get(s) for s in sources))
    bullet = with_producers(bullet, ((feedback or {}).get(s) for s in sources), "feedback_producers")
    fresh = [s for s in sources if s not in bullet.sources]
    if not fresh:
        return bullet
    kept = (*bullet.sources, *fresh)[-LIMITS.sources_per_bullet :]
    return bullet.model_copy(update={"sources": kept, "support": bullet.support + len(fresh)})


def with_producers(
    bullet: Bullet,
    producers: Iterable[str | None],
    field: Literal["verified_producers", "feedback_producers"] = "verified_producers",
) -> Bullet:
    """``bullet`` with ``producers`` (None skipped) among its ``field`` (verified producers, or producers of
    trusted feedback): a producer already there moves to the most recent end; the most recent
    ``producers_per_bullet`` are kept."""
    named = [p for p in producers if p]
    if not named:
        return bullet
    current: tuple[str, ...] = getattr(bullet, field)
    order = [p for p in current if p not in named] + list(dict.fromkeys(named))
    kept = tuple(order)[-LIMITS.producers_per_bullet :]
    return bullet if kept == current else bullet.model_copy(update={field: kept})


class Deduplicator(Protocol):
    """Decides which bullets say the same thing. Must be deterministic and symmetric."""

    def duplicates(self, bullets: Sequence[Bullet], fresh: set[str]) -> dict[str, str]:
        """Map each redundant bullet id to the id of the bullet it duplicates (an older, kept one).

        ``fresh`` holds the ids added or changed by the delta being applied: only pairs involving at least one
        fresh bullet need checking, since older bullets were de-duplicated when they were applied.
        """
        ...


@dataclass(frozen=True)
class NormalisedText:
    """Two bullets are duplicates when their normalised texts are equal (section ignored)."""

    def duplicates(self, bullets: Sequence[Bullet], fresh: set[str]) -> dict[str, str]:
        first: dict[str, str] = {}
        dropped: dict[str, str] = {}
        for b in bullets:  # bullets are in id order, so the oldest of a group is kept
            key = normalise_text(b.content)
            if key in first:
                dropped[b.id] = first[key]
            else:
                first[key] = b.id
        return dropped


@dataclass(frozen=True)
class TokenJaccard:
    """Duplicates when the Jaccard similarity of word sets is at least ``threshold`` (default 0.85)."""

    threshold: float = 0.85

    def duplicates(self, bullets: Sequence[Bullet], fresh: set[str]) -> dict[str, str]:
        words = {b.id: frozenset(normalise_text(b.content).split()) for b in bullets}
        dropped: dict[str, str] = {}
        kept: list[Bullet] = []
        for b in bullets:
            match = None
            if b.id in fresh:
                candidates: Iterable[Bullet] = kept
            else:
                candidates = (k for k in kept if k.id in fresh)
            for k in candidates:
                a, c = words[b.id], words[k.id]
                union = len(a | c)
                if union and len(a & c) / union >= self.threshold:
                    match = k.id
                    break
            if match is None:
                kept.append(b)
            else:
                dropped[b.id] = match
        return dropped


@dataclass(frozen=True)
class ApplyPolicy:
    """How a delta is applied: de-duplication rule and the prompt's hard size budget (tokens, bullets)."""

    token_budget: int = 24_000
    max_bullets: int = 5_000
    dedup: Deduplicator = field(default_factory=NormalisedText)

    def __post_init__(self) -> None:
        if self.token_budget < 64 or self.max_bullets < 1:
            raise ValueError("token_budget must be >= 64 and max_bullets >= 1")


@dataclass
class ApplyStats:
    """What an application did; counted, never raised."""

    added: int = 0
    updated: int = 0
    confirmed: int = 0  # UPDATEs with the bullet's own wording: cited again, not changed
    removed: int = 0
    missing_update: int = 0
    missing_remove: int = 0
    deduplicated: int = 0
    evicted: int = 0
    tags_applied: int = 0
    tags_missing: int = 0
    sections_folded: int = 0
    pinned_kept: int = 0  # UPDATEs and REMOVEs of a pinned bullet, not applied

    def merge(self, other: ApplyStats) -> ApplyStats:
        return ApplyStats(**{k: getattr(self, k) + getattr(other, k) for k in self.__dataclass_fields__})


def _verdicts(reflection: Reflection) -> dict[str, Tag]:
    """One verdict per bullet of one reflection; a contradiction within it resolves to harmful, the conservative
    reading, independent of the order the tags were listed in."""
    seen: dict[str, Tag] = {}
    for t in reflection.tags:
        prev = seen.get(t.bullet_id)
        if prev is None or t.tag == Tag.HARMFUL or (prev == Tag.NEUTRAL and t.tag == Tag.HELPFUL):
            seen[t.bullet_id] = t.tag
    return seen


def harmful_taggers(reflections: Iterable[Reflection]) -> dict[str, tuple[str, ...]]:
    """Per bullet id, the traces whose reflections tagged it harmful (sorted; the verdicts of
    :func:`count_tags`): corroboration counts their producers (:func:`combee.corroborate.corroborate_tags`)."""
    out: dict[str, set[str]] = {}
    for r in reflections:
        for bullet_id, tag in _verdicts(r).items():
            if tag == Tag.HARMFUL:
                out.setdefault(bullet_id, set()).add(r.trace_id)
    return {bid: tuple(sorted(out[bid])) for bid in sorted(out)}


def count_tags(reflections: Iterable[Reflection]) -> dict[str, tuple[int, int]]:
    """Sum helpful/harmful tags per bullet id over reflections (a reflection counts a bullet at most once).

    Neutral tags count nothing. The result is independent of the order of ``reflections``.
    """
    helpful: Counter[str] = Counter()
    harmful: Counter[str] = Counter()
    for r in reflections:
        for bullet_id, tag in _verdicts(r).items():
            if tag == Tag.HELPFUL:
                helpful[bullet_id] += 1
            elif tag == Tag.HARMFUL:
                harmful[bullet_id] += 1
    return {bid: (helpful[bid], harmful[bid]) for bid in sorted(set(helpful) | set(harmful))}


def _bullet_id(n: int) -> str:
    return f"b{n:05d}"


def apply_delta(playbook: Playbook, delta: Delta, policy: ApplyPolicy | None = None) -> tuple[Playbook, ApplyStats]:
    """Apply ``delta`` to ``playbook`` deterministically and return version ``playbook.version + 1``.

    Order: tag counts, then the operations in the order given, then de-duplication, then the budget.
    An UPDATE or REMOVE naming a bullet that does not exist (removed meanwhile, or never there) is a counted
    no-op, not an error. ADD gets a fresh id from ``playbook.next_id``. Counters of duplicates are summed into
    the kept (older) bullet, which takes the more specific of the two wordings when they differ beyond
    normalisation (:func:`combee.wording.more_specific`). When the rendering exceeds ``policy.token_budget``
    (or ``max_bullets``), bullets are evicted worst first: lowest helpful−harmful, then the least recently
    updated, then the highest id. A pinned bullet (``Bullet.pinned``, set by an operator) is never rewritten,
    removed, folded into another or evicted: an UPDATE of it only cites it, a REMOVE is a counted no-op.
    """
    policy = policy or ApplyPolicy()
    stats = ApplyStats()
    version = playbook.version + 1
    prov = Provenance(window_id=delta.window_id, version=version)
    bullets: dict[str, Bullet] = {b.id: b for b in playbook.bullets}
    next_id = playbook.next_id
    fresh: set[str] = set()
    sections = {b.section for b in playbook.bullets}

    for bullet_id, (helpful, harmful) in sorted(delta.tag_counts.items()):
        b = bullets.get(bullet_id)
        if b is None:
            stats.tags_missing += 1
            continue
        bullets[bullet_id] = b.model_copy(update={"helpful": b.helpful + helpful, "harmful": b.harmful + harmful})
        stats.tags_applied += 1

    for op in delta.ops:
        if isinstance(op, AddOp):
            bid = _bullet_id(next_id)
            next_id += 1
            section = op.section
            if section not in sections:
                if len(sections) >= LIMITS.sections:
                    section = GENERAL_SECTION
                    stats.sections_folded += 1
                sections.add(section)
            bullets[bid] = cite(
                Bullet(id=bid, section=section, content=op.content, created=prov, updated=prov),
                op.sources,
                delta.verified_producers,
                delta.feedback_producers,
            )
            fresh.add(bid)
            stats.added += 1
        elif isinstance(op, UpdateOp):
            b = bullets.get(op.bullet_id)
            if b is None:
                stats.missing_update += 1
                continue
            if b.pinned:  # an operator fixed its wording: learning may cite it, not rewrite it
                bullets[op.bullet_id] = cite(b, op.sources, delta.verified_producers, delta.feedback_producers)
                stats.pinned_kept += 1
                continue
            if op.content == b.content:  # the same wording: the op's traces taught the bullet again, no change
                bullets[op.bullet_id] = cite(b, op.sources, delta.verified_producers, delta.feedback_producers)
                stats.confirmed += 1
                continue
            changed = b.model_copy(update={"content": op.content, "updated": prov})
            bullets[op.bullet_id] = cite(changed, op.sources, delta.verified_producers, delta.feedback_producers)
            fresh.add(op.bullet_id)
            stats.updated += 1
        elif isinstance(op, RemoveOp):
            pinned = bullets.get(op.bullet_id)
            if pinned is not None and pinned.pinned:
                stats.pinned_kept += 1
            elif bullets.pop(op.bullet_id, None) is None:
                stats.missing_remove += 1
            else:
                fresh.discard(op.bullet_id)
                stats.removed += 1

    ordered = sorted(bullets.values(), key=lambda b: _id_number(b.id))
    if fresh:
        merged = {b.id: b for b in ordered}
        dropped = {d: k for d, k in policy.dedup.duplicates(ordered, fresh).items() if not merged[d].pinned}
        if dropped:
            for dup_id, keep_id in sorted(dropped.items()):
                dup, keep = merged[dup_id], merged[keep_id]
                update: dict[str, object] = {
                    "helpful": keep.helpful + dup.helpful,
                    "harmful": keep.harmful + dup.harmful,
                }
                if not keep.pinned and normalise_text(dup.content) != normalise_text(keep.content):
                    wording = more_specific(keep.content, dup.content)
                    if wording != keep.content:
                        update.update(content=wording, updated=prov)
                common = len(set(keep.sources) & set(dup.sources))
                update.update(
                    sources=tuple(dict.fromkeys([*keep.sources, *dup.sources]))[-LIMITS.sources_per_bullet :],
                    support=keep.support + dup.support - common,
                )
                kept_bullet = with_producers(keep.model_copy(update=update), dup.verified_producers)
                merged[keep_id] = with_producers(kept_bullet, dup.feedback_producers, "feedback_producers")
            ordered = [merged[b.id] for b in ordered if b.id not in dropped]
            stats.deduplicated += len(dropped)

    ordered, evicted = _within_budget(version, next_id, ordered, policy)
    stats.evicted += evicted
    return (
        Playbook(namespace=playbook.namespace, version=version, bullets=tuple(ordered), next_id=next_id),
        stats,
    )


def _id_number(bullet_id: str) -> int:
    return int(bullet_id[1:])


def fit_budget(playbook: Playbook, policy: ApplyPolicy) -> Playbook:
    """``playbook`` with the bullets that ``policy``'s budget evicts taken out, exactly as :func:`apply_delta`
    evicts them (same version; the budget is the rendering's upper-bound estimate)."""
    kept, evicted = _within_budget(playbook.version, playbook.next_id, list(playbook.bullets), policy)
    return playbook if not evicted else playbook.model_copy(update={"bullets": tuple(kept)})


def _within_budget(version: int, next_id: int, bullets: list[Bullet], policy: ApplyPolicy) -> tuple[list[Bullet], int]:
    # An upper bound of the rendering's estimate (estimate_tokens is sub-additive over its lines): every line
    # with its newline, a blank line and heading for each settled section, and for each newer bullet too (a
    # run of one section there has its own heading), plus the fixed lines.
    mark = settling_mark(next_id)

    def line(text: str) -> int:
        return estimate_tokens(text + "\n")

    def cost(b: Bullet) -> int:
        own = line(bullet_line(b))
        return own if _id_number(b.id) < mark else own + 1 + line(_section_heading(b.section))

    fixed = line(_header()) + 1 + line(_NEWER) + 1 + line(_footer(version))
    total = fixed + sum(cost(b) for b in bullets)
    total += sum(1 + line(_section_heading(s)) for s in {b.section for b in bullets if _id_number(b.id) < mark})
    if total <= policy.token_budget and len(bullets) <= policy.max_bullets:
        return bullets, 0
    # pinned bullets are never evicted: an operator's choice outranks the budget
    worst_first = sorted(
        (b for b in bullets if not b.pinned), key=lambda b: (b.score, b.updated.version, -_id_number(b.id))
    )
    evict: set[str] = set()
    count = len(bullets)
    for b in worst_first:
        if total <= policy.token_budget and count <= policy.max_bullets:
            break
        evict.add(b.id)
        total -= cost(b)
        count -= 1
    return [b for b in bullets if b.id not in evict], len(evict)


@dataclass(frozen=True)
class PlaybookState:
    """A playbook plus the ids of the windows already applied to it (the exactly-once ledger).

    ``applied`` keeps the most recent ``ledger_size`` window ids in application order; windows also carry
    increasing sequence numbers per source, so older duplicates are caught by ``watermarks``.
    """

    playbook: Playbook
    applied: tuple[str, ...] = ()
    watermarks: tuple[tuple[str, int], ...] = ()  # (source, highest last offset applied), sorted by source
    ledger_size: int = 4096
    stats: ApplyStats = field(default_factory=ApplyStats)

    def seen(self, window_id: str, source: str | None = None, last_offset: int | None = None) -> bool:
        if window_id in self.applied:
            return True
        if source is not None and last_offset is not None:
            mark = dict(self.watermarks).get(source)
            return mark is not None and last_offset <= mark
        return False


def apply_window(
    state: PlaybookState,
    delta: Delta,
    policy: ApplyPolicy | None = None,
    *,
    source: str | None = None,
    last_offset: int | None = None,
) -> PlaybookState:
    """Apply a window's delta once: a window already in the ledger leaves ``state`` unchanged."""
    if state.seen(delta.window_id, source, last_offset):
        return state
    playbook, stats = apply_delta(state.playbook, delta, policy)
    applied = (*state.applied, delta.window_id)[-state.ledger_size :]
    marks = dict(state.watermarks)
    if source is not None and last_offset is not None:
        marks[source] = max(marks.get(source, -1), last_offset)
    return PlaybookState(
        playbook=playbook,
        applied=applied,
        watermarks=tuple(sorted(marks.items())),
        ledger_size=state.ledger_size,
        stats=state.stats.merge(stats),
    )


# --- rendering --------------------------------------------------------------------------------------------
#
# Layout for prefix caching. A server caches a prompt by its prefix, so the rendering is laid out so that the
# text of version t is, as far as possible, a prefix of version t+1's: nothing that changes per version
# (the version number) before the bullets, and new bullets after the old ones. Keeping every bullet under its
# section's one heading would insert a new bullet in the middle (at the end of its section) and change all
# the text after it; listing bullets purely by id would scatter sections. The compromise: bullets with ids
# below a *settling mark* are grouped by section (sections in first-appearance order, bullets by id); newer
# ones follow in id order, each run of one section under its own heading, after a line saying so. The mark
# moves only when ``next_id`` passes the next step of a geometric ladder (16, 20, 25, 31, ...: +25 % each;
# below 16 ids everything is grouped), so the text is re-grouped a few dozen times over thousands of bullets,
# and the newer part never holds more than about a fifth of the ids. Between two re-groupings, adding bullets
# only appends to the text; an UPDATE or REMOVE changes the text from its bullet onwards.

_TITLE = "Playbook"

_INTRO = (
    "Lessons learned from earlier runs of this agent. Apply the ones that fit the task; "
    "bullet ids are for reference only."
)

_NEWER = "Newer lessons, in the order they were learned (a section may appear again):"

_SETTLE_FIRST = 16


def settling_mark(next_id: int) -> int:
    """The id number below which bullets are grouped by section: the highest ladder step (16, then +25 % each,
    rounded down) not above ``next_id``; ``next_id`` itself (everything grouped) while it is below 16, since a
    playbook that small gains nothing from appending. Monotone in ``next_id``."""
    mark, step = next_id, _SETTLE_FIRST
    while step <= next_id:
        mark, step = step, step + step // 4
    return mark


def _header() -> str:
    # Neither the namespace nor the version is part of the header: a replay into another namespace must
    # render exactly the same prompts (so that cached answers, and so the learned playbook, are reproduced),
    # and the version changes with every window, so it goes last, where it does not break the cached prefix.
    return f"# {_TITLE}\n{_INTRO}"


def _footer(version: int) -> str:
    return f"(Playbook version {version}.)"


def _section_heading(section: str) -> str:
    return f"## {section.replace('_', ' ')}"


def bullet_line(b: Bullet, lesson: Callable[[str], str] = one_line_lesson) -> str:
    # one line whatever the store holds (combee.guard put every learned text on one line; an older snapshot,
    # or a tampered one, may not have been): a bullet cannot start a heading or a forged bullet of its own
    return f"- [{b.id}] {lesson(b.content)}"


def render_prompt(
    playbook: Playbook,
    *,
    note: str | None = None,
    grouped: bool = False,
    lesson: Callable[[str], str] = one_line_lesson,
) -> str:
    """The playbook as system-prompt text. Deterministic, and laid out for prefix caching (see above): the
    header, the settled bullets grouped by section, the newer ones in id order, ``note`` (if any), and last the
    version. ``grouped`` puts every bullet under its section's one heading (for views whose bullets are
    chosen by score, which have no stable prefix to keep). ``lesson`` writes a bullet's text (default: on one
    line; the learner's own prompts write it as escaped data, :func:`combee.prompts.render.lesson_data`)."""
    bullets = sorted(playbook.bullets, key=lambda b: _id_number(b.id))
    mark = playbook.next_id + 1 if grouped else settling_mark(playbook.next_id)
    settled = [b for b in bullets if _id_number(b.id) < mark]
    newer = [b for b in bullets if _id_number(b.id) >= mark]
    lines = [_header()]
    by_section: dict[str, list[Bullet]] = {}
    for b in settled:
        by_section.setdefault(b.section, []).append(b)
    for section, members in by_section.items():
        lines.append("")
        lines.append(_section_heading(section))
        lines.extend(bullet_line(b, lesson) for b in members)
    if newer and settled:
        lines += ["", _NEWER]
    previous = None
    for b in newer:
        if b.section != previous:
            lines += ["", _section_heading(b.section)]
            previous = b.section
        lines.append(bullet_line(b, lesson))
    if note:
        lines += ["", note]
    lines += ["", _footer(playbook.version)]
    return "\n".join(lines) + "\n"


def playbook_tokens(playbook: Playbook) -> int:
    return estimate_tokens(render_prompt(playbook))
