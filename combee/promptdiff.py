"""What changed in a namespace's prompt between two published versions, and which window and traces taught it.

Pure: the caller reads the published versions (:class:`VersionRecord`: the playbook and the provenance the
publisher stored with it) and :func:`diff_versions` compares two of them bullet by bullet. A bullet is
*added* when its id is new, *changed* when its content or section differs (its helpful/harmful counters move
every window and do not count), *removed* when its id is gone. Ids are never reused, so ids are identity.

Provenance: every bullet records the window (and version) that created it and that last changed it
(:class:`~combee.models.Provenance`); each published version records, for every window applied since the
previous published version, the window id and the ids of the traces it learned from
(:class:`WindowProvenance`, stored by the publisher under ``meta["provenance"]``). An added bullet is taught by
its ``created`` window, a changed one by its ``updated`` window, a removed one by the first published version
in which it is gone. Trace ids are None when they were not recorded (a version published before provenance
was stored, or a window whose version is no longer retained).

Why: a version also stores, per operation its window applied, the traces whose reflections taught it and
their lessons (:class:`combee.evidence.Explanation`, ``meta["evidence"]``). Each change lists the
operations on its bullet in the versions compared (:class:`Teaching`: ADD/UPDATE/REMOVE, what came of it, the
cited traces, the lessons) and ``traces``, the traces that taught it — not the whole window. Versions
published before evidence was stored fall back to the bullet's own record (``Bullet.sources``, its most recent
cited traces). :func:`render_diff` is short by default (two lines a bullet, a few trace ids and "+N more");
``full=True`` lists everything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from combee.errors import CombeeError, ConfigError
from combee.evidence import Explanation
from combee.models import Bullet, Playbook, one_line

__all__ = [
    "MAX_DIFF_VERSIONS",
    "PROVENANCE_KEY",
    "BulletChange",
    "DiffTooWide",
    "PromptDiff",
    "Quote",
    "Teaching",
    "UnknownVersion",
    "VersionRecord",
    "WindowProvenance",
    "bound_span",
    "diff_span",
    "diff_versions",
    "parse_provenance",
    "provenance_entry",
    "render_diff",
]

MAX_DIFF_VERSIONS = 50
"""The default most published versions (full playbooks) one diff request of ``combee ui`` reads."""

PROVENANCE_KEY = "provenance"
"""The key of a published version's ``meta`` that lists the windows it covers (see :func:`provenance_entry`)."""


class UnknownVersion(CombeeError):
    """A version asked for is not among the published versions still retained; the message lists what is."""


class DiffTooWide(ConfigError):
    """A diff would read more published versions than its reader allows; the message says how to narrow it."""


@dataclass(frozen=True)
class WindowProvenance:
    """The window that produced playbook version ``version`` and the traces it learned from (None: unknown)."""

    version: int
    window_id: str | None
    trace_ids: tuple[str, ...] | None = None


@dataclass(frozen=True)
class VersionRecord:
    """One published version: its playbook, the window of its publish, and the windows it covers."""

    version: int
    playbook: Playbook
    window_id: str | None = None
    provenance: tuple[WindowProvenance, ...] = ()
    evidence: tuple[Explanation, ...] = ()


@dataclass(frozen=True)
class Quote:
    """A lesson as the reflector of trace ``trace_id`` stated it (cut short when it was long)."""

    trace_id: str
    text: str


@dataclass(frozen=True)
class Teaching:
    """One operation of version ``version``'s window on a bullet: the curator's ``op`` (ADD, UPDATE, REMOVE),
    its ``outcome`` (:data:`combee.evidence.Outcome`), the traces it cites and some of their lessons."""

    version: int
    op: str
    outcome: str
    sources: tuple[str, ...]
    lessons: tuple[Quote, ...] = ()


@dataclass(frozen=True)
class BulletChange:
    """One bullet added, changed or removed; ``why`` the operations on it (empty when no evidence was
    recorded) and ``traces`` the traces that taught the change: the operations' sources, else the bullet's own
    most recent ones (``from_evidence`` False), None when neither is known. ``support`` counts every trace that
    ever taught the bullet; ``producers`` are the verified producers whose signed traces taught it
    (``Bullet.verified_producers``, combee.identity: never a name a trace merely claims); ``feedback_by`` the
    producers whose trusted feedback graded those traces (``Bullet.feedback_producers``, combee.feedback)."""

    kind: Literal["added", "changed", "removed"]
    bullet_id: str
    section: str
    before: str | None
    after: str | None
    taught_by: WindowProvenance
    why: tuple[Teaching, ...] = ()
    traces: tuple[str, ...] | None = None
    from_evidence: bool = False
    support: int = 0
    producers: tuple[str, ...] = ()
    feedback_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class PromptDiff:
    namespace: str
    from_version: int
    to_version: int
    changes: tuple[BulletChange, ...]

    def of_kind(self, kind: str) -> tuple[BulletChange, ...]:
        return tuple(c for c in self.changes if c.kind == kind)


def provenance_entry(version: int, window_id: str | None, trace_ids: Sequence[str]) -> dict[str, Any]:
    """One window's entry of ``meta["provenance"]`` (JSON-ready)."""
    return {"version": version, "window_id": window_id, "trace_ids": list(trace_ids)}


def parse_provenance(meta: Mapping[str, Any] | None) -> tuple[WindowProvenance, ...]:
    """The windows a published version's ``meta`` lists; malformed entries are skipped (never an error)."""
    raw = (meta or {}).get(PROVENANCE_KEY)
    if not isinstance(raw, list):
        return ()
    out = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("version"), int):
            continue
        window = item.get("window_id")
        ids = item.get("trace_ids")
        out.append(
            WindowProvenance(
                version=item["version"],
                window_id=one_line(window) if isinstance(window, str) else None,
                trace_ids=tuple(one_line(str(t)) for t in ids) if isinstance(ids, list) else None,
            )
        )
    return tuple(out)


def diff_span(
    published: Sequence[int], from_version: int | None = None, to_version: int | None = None
) -> tuple[int, int, tuple[int, ...]]:
    """Which versions a diff compares and reads: ``(from, to, the published versions from..to)``.

    ``published`` are the versions still retained. ``to_version`` defaults to the newest, ``from_version`` to the
    published version before ``to`` (a version a newer one superseded was never published), or 0 — the empty
    playbook before the first version, which is never among the versions to read. Raises UnknownVersion when
    nothing is published or a version is not retained (the message lists what is), ConfigError when ``from`` is
    newer than ``to``.
    """
    held = sorted(set(published))
    if not held:
        raise UnknownVersion("no version is published yet")
    to_v = held[-1] if to_version is None else to_version
    from_v = max((v for v in held if v < to_v), default=0) if from_version is None else from_version
    if from_v > to_v:
        raise ConfigError(f"--from {from_v} is newer than --to {to_v}")
    for v in (to_v, from_v):
        if v not in held and v != 0:
            raise UnknownVersion(
                f"version {v} is not published or no longer retained (there are versions {held[0]}..{held[-1]})"
            )
    return from_v, to_v, tuple(v for v in held if from_v <= v <= to_v)


def bound_span(from_version: int, to_version: int, wanted: Sequence[int], limit: int) -> None:
    """Raise DiffTooWide when ``wanted`` (the versions a diff from ``from_version`` to ``to_version`` reads, from
    :func:`diff_span`) holds more than ``limit`` versions; the message names the nearest ``from`` within it."""
    if len(wanted) <= limit:
        return
    nearest = sorted(wanted)[-limit]
    raise DiffTooWide(
        f"a diff from v{from_version} to v{to_version} reads {len(wanted)} published versions; at most {limit} "
        f"are read per request: compare from v{nearest} or later, or use `combee prompt diff`"
    )


def diff_versions(records: Sequence[VersionRecord], from_version: int, to_version: int) -> PromptDiff:
    """The bullets added, changed and removed from ``from_version`` to ``to_version``, each with its provenance.

    ``records`` are the published versions the caller has (any order; those between the two versions are
    used to find where a removed bullet went and the trace ids of each window). Changes come in the order of
    the newer playbook (added, changed), then the removed ones in the order of the older one.
    Raises UnknownVersion when either version is not in ``records``, ConfigError when ``from_version`` is newer
    than ``to_version``.
    """
    by_version = {r.version: r for r in records}
    for v in (from_version, to_version):
        if v not in by_version:
            have = sorted(by_version)
            held = f"versions {have[0]}..{have[-1]} ({len(have)} retained)" if have else "no version"
            raise UnknownVersion(f"version {v} is not published or no longer retained; there are {held}")
    if from_version > to_version:
        raise ConfigError(f"--from {from_version} is newer than --to {to_version}")
    old, new = by_version[from_version].playbook, by_version[to_version].playbook
    windows: dict[int, WindowProvenance] = {}
    for r in sorted(records, key=lambda r: r.version):
        windows.setdefault(r.version, WindowProvenance(r.version, r.window_id))
        for p in r.provenance:
            windows[p.version] = p

    def taught(version: int, window_id: str | None) -> WindowProvenance:
        known = windows.get(version)
        if known is not None and (window_id is None or known.window_id in (None, window_id)):
            return WindowProvenance(version, window_id or known.window_id, known.trace_ids)
        return WindowProvenance(version, window_id)

    between = sorted((r for r in records if from_version < r.version <= to_version), key=lambda r: r.version)
    explained = _explained(between, from_version)
    before = {b.id: b for b in old.bullets}
    after_ids = {b.id for b in new.bullets}
    changes: list[BulletChange] = []
    for b in new.bullets:
        was = before.get(b.id)
        if was is None:
            by = taught(b.created.version, b.created.window_id)
            changes.append(_change("added", b, None, b.content, by, explained, to_version))
        elif (was.content, was.section) != (b.content, b.section):
            by = taught(b.updated.version, b.updated.window_id)
            changes.append(_change("changed", b, was.content, b.content, by, explained, to_version))
    for b in old.bullets:
        if b.id in after_ids:
            continue
        gone_in = next((r for r in between if r.playbook.bullet(b.id) is None), by_version[to_version])
        by = taught(gone_in.version, gone_in.window_id)
        changes.append(_change("removed", b, b.content, None, by, explained, gone_in.version))
    return PromptDiff(old.namespace, from_version, to_version, tuple(changes))


def _explained(between: Sequence[VersionRecord], from_version: int) -> dict[int, Explanation]:
    """The evidence of every window applied after ``from_version`` that the records hold, by version."""
    out: dict[int, Explanation] = {}
    for r in between:
        for e in r.evidence:
            if from_version < e.version <= r.version:
                out.setdefault(e.version, e)
    return out


def _teachings(bullet_id: str, explained: Mapping[int, Explanation], until: int) -> tuple[Teaching, ...]:
    return tuple(
        Teaching(v, e.op, e.outcome, e.sources, tuple(Quote(q.trace_id, q.text) for q in e.lessons))
        for v in sorted(explained)
        if v <= until
        for e in explained[v].for_bullet(bullet_id)
    )


def _change(
    kind: Literal["added", "changed", "removed"],
    b: Bullet,
    before: str | None,
    after: str | None,
    by: WindowProvenance,
    explained: Mapping[int, Explanation],
    until: int,
) -> BulletChange:
    """The change, with the operations on the bullet up to version ``until`` when the evidence of the window
    that taught it (``by``) is recorded, else the bullet's own record of its traces."""
    why = _teachings(b.id, explained, until)
    producers = b.verified_producers if kind != "removed" else ()
    graders = b.feedback_producers if kind != "removed" else ()
    if by.version in explained:
        traces: tuple[str, ...] | None = tuple(dict.fromkeys(s for t in why for s in t.sources))
        return BulletChange(kind, b.id, b.section, before, after, by, why, traces, True, b.support, producers, graders)
    own = b.sources if kind != "removed" and b.sources else None  # who taught it did not remove it
    return BulletChange(kind, b.id, b.section, before, after, by, why, own, False, b.support, producers, graders)


SHORT_TRACES = 3
"""Trace ids a short diff names per bullet ("+N more" for the rest)."""

SHORT_LESSON_CHARS = 100
"""A short diff quotes one lesson per bullet, cut to this many characters."""

_MARK = {"added": "+", "changed": "~", "removed": "-"}


def _ids(ids: Sequence[str], cap: int | None) -> str:
    shown = ids if cap is None else ids[:cap]
    more = f" +{len(ids) - len(shown)} more" if len(ids) > len(shown) else ""
    return (", ".join(shown) or "-") + more


def _count(n: int) -> str:
    return f"{n} trace" if n == 1 else f"{n} traces"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _ops(why: Sequence[Teaching]) -> str:
    return ", ".join(dict.fromkeys(f"{t.op}→{t.outcome} v{t.version}" for t in why))


def _short_why(c: BulletChange) -> str:
    p = c.taught_by
    if not c.from_evidence:
        where = f"{'removed' if c.kind == 'removed' else 'taught'} by window {p.window_id or '-'} (v{p.version})"
        if c.traces is None:
            window = "not recorded" if p.trace_ids is None else f"{len(p.trace_ids)} in the window"
            return f"    {where}; traces {window}"
        return f"    {where}; traces {_ids(c.traces, SHORT_TRACES)} (the bullet's latest; {c.support} in all)"
    if not c.why:
        return f"    v{p.version}: no operation named it (evicted by the token budget, or merged into a duplicate)"
    lesson = next((q for t in reversed(c.why) for q in t.lessons), None)
    quote = f' · "{_cut(lesson.text, SHORT_LESSON_CHARS)}" ({lesson.trace_id})' if lesson is not None else ""
    traces = c.traces or ()
    return f"    {_ops(c.why)} · {_count(len(traces))}: {_ids(traces, SHORT_TRACES)}{quote}"


def _full_why(c: BulletChange) -> list[str]:
    p = c.taught_by
    window = "" if p.trace_ids is None else f"; {len(p.trace_ids)} traces in the window"
    lines = [
        f"    {'removed' if c.kind == 'removed' else 'taught'} by window {p.window_id or '-'} (v{p.version}{window})"
    ]
    if not c.from_evidence:
        if c.traces is None and p.trace_ids is not None:  # only the window is known: all of its traces
            return [*lines, f"    traces of the window: {_ids(p.trace_ids, None)}"]
        if c.traces is None:
            return [*lines, "    traces that taught it: not recorded"]
        return [*lines, f"    traces (the bullet's latest {len(c.traces)} of {c.support}): {_ids(c.traces, None)}"]
    if not c.why:
        return [*lines, "    no operation named it (evicted by the token budget, or merged into a duplicate)"]
    for t in c.why:
        lines.append(f"    v{t.version} {t.op} → {t.outcome}, {_count(len(t.sources))}: {_ids(t.sources, None)}")
        lines.extend(f'      {q.trace_id}: "{q.text}"' for q in t.lessons)
    return lines


def _producers(c: BulletChange, cap: int | None) -> str:
    """Who vouched for the bullet: verified producers of its traces, producers of their trusted feedback."""
    parts = [f"verified producers: {_ids(c.producers, cap)}"] if c.producers else []
    parts += [f"trusted feedback: {_ids(c.feedback_by, cap)}"] if c.feedback_by else []
    return " · ".join(parts)


def render_diff(diff: PromptDiff, *, full: bool = False) -> str:
    """The diff as text: a summary line, then per bullet (``+`` added, ``~`` changed, ``-`` removed) one line of
    what it says and one of why — the curator's operations, the traces that taught it (the first
    :data:`SHORT_TRACES`, "+N more") and one lesson as the reflector stated it. ``full``: every operation, every
    trace id, every recorded lesson and the window. A bullet taught by signed traces names its verified producers;
    one whose traces were graded by trusted feedback names the producers of that feedback."""
    counts = ", ".join(f"{len(diff.of_kind(k))} {k}" for k in ("added", "changed", "removed"))
    lines = [f"{diff.namespace}: v{diff.from_version} -> v{diff.to_version}: {counts}"]
    for c in diff.changes:
        text = c.after if c.kind == "added" else c.before
        if c.kind == "changed" and not full:
            text = f"{c.before}  →  {c.after}"
        lines.append(f"{_MARK[c.kind]} [{c.bullet_id}] ({c.section}) {text}")
        if full:
            lines.extend([f"    now: {c.after}"] if c.kind == "changed" else [])
            lines.extend(_full_why(c))
            lines.extend([f"    {_producers(c, None)}"] if c.producers or c.feedback_by else [])
        else:
            vouched = c.producers or c.feedback_by
            lines.append(_short_why(c) + (f" · {_producers(c, SHORT_TRACES)}" if vouched else ""))
    return "\n".join(lines) + "\n"
