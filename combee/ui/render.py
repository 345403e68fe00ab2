"""The pages of ``combee ui`` as HTML: data in (:mod:`streams.overview`), a string out. Pure, no JavaScript.

Every value that comes from Redis — namespaces, bullet text, section names, window and trace ids, the
controller's explanation — is learned or user-supplied text and is escaped where it is written
(:func:`html.escape`, quotes included); nothing is ever marked safe. Elements carry ``class``/``id`` names the
tests read (``namespace``, ``bullet``, ``bullet-text``, ``change``, ``window``, ``current-version``).
"""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from combee.models import Bullet
from combee.promotion_text import decision_why, serving_summary
from combee.promptdiff import BulletChange, PromptDiff, Quote, WindowProvenance
from combee.serving import Serving
from combee.ui.chart import success_rate_chart
from streams.overview import (
    NamespaceOverview,
    NamespaceSummary,
    VersionDetail,
    WindowRow,
    WorkerHealth,
    WorkerReport,
    as_float,
    as_int,
)

__all__ = [
    "PAGE_STYLE",
    "diff_page",
    "error_page",
    "health_section",
    "index_page",
    "namespace_page",
    "promotion_section",
    "version_page",
]

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1180px; padding: 12px 20px; color: #1d2330; }
header { border-bottom: 2px solid #f2b705; margin-bottom: 12px; padding-bottom: 6px; }
header a.home { font-weight: 700; color: #1d2330; text-decoration: none; font-size: 18px; }
nav.crumbs { color: #667; margin-left: 8px; display: inline; }
h1 { font-size: 20px; margin: 8px 0; } h2 { font-size: 16px; margin: 18px 0 6px; }
table { border-collapse: collapse; width: 100%; } th, td { text-align: left; padding: 3px 8px; vertical-align: top; }
th { background: #f3f4f7; font-weight: 600; } tr:nth-child(even) td { background: #fafafc; }
code, pre, .id { font-family: ui-monospace, monospace; font-size: 12.5px; }
pre { background: #f6f7f9; border: 1px solid #e1e3e8; padding: 8px; white-space: pre-wrap; overflow-wrap: anywhere; }
ul.bullets { padding-left: 18px; }
details.traces, span.op { display: inline; } q.lesson { font-style: italic; } div.why { margin-left: 12px; }
details.traces { display: inline; } details.traces summary { cursor: pointer; } li.bullet, li.change { margin: 3px 0; }
.muted { color: #778; } .note { background: #fff8e1; border-left: 3px solid #f2b705; padding: 4px 8px; }
.added { border-left: 4px solid #2e9a4b; padding-left: 6px; list-style: none; }
.changed { border-left: 4px solid #d68a00; padding-left: 6px; list-style: none; }
.removed { border-left: 4px solid #c2362f; padding-left: 6px; list-style: none; }
.kind { font-weight: 700; text-transform: uppercase; font-size: 11px; margin-right: 6px; }
.decision { font-family: ui-monospace, monospace; font-size: 12.5px; }
.outage { background: #fdecea; border: 1px solid #c2362f; border-left: 6px solid #c2362f; padding: 6px 10px;
          margin: 8px 0; }
.outage b { color: #a1221b; } .healthy { color: #2e7d32; } .stale { color: #a15c00; }
"""

PAGE_STYLE = _STYLE
"""The text of every page's one ``<style>`` element (the server's Content-Security-Policy allows it by hash)."""

_LATENCY_NOTE = (
    "Per-window latencies are not stored in Redis: a version records its windows' ids and trace ids and when it "
    "was published, not when each window closed, was mapped or applied. The worker's report (Controller, above) gives "
    "close-to-applied quantiles over its recent windows; per-window figures are the workers' Prometheus "
    "histogram combee_window_latency_seconds (docs/operations.md)."
)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _or_dash(value: object) -> str:
    return "-" if value is None else _e(value)


def _traces(ids: Sequence[str] | None, what: str = "traces") -> str:
    """Trace ids: the count and the first few, all of them when opened (``<details>``, no script)."""
    if ids is None:
        return '<span class="muted">traces not recorded</span>'
    if not ids:
        return "no traces"
    first = ", ".join(_e(t) for t in ids[:3]) + (f" +{len(ids) - 3} more" if len(ids) > 3 else "")
    every = ", ".join(_e(t) for t in ids)
    return (
        f'<details class="traces"><summary>{len(ids)} {_e(what)}: <span class="id">{first}</span></summary>'
        f'<span class="id trace-ids">{every}</span></details>'
    )


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _ns_url(namespace: str) -> str:
    return f"/ns/{quote(namespace, safe='')}"


def _version_url(namespace: str, version: int) -> str:
    return f"{_ns_url(namespace)}/v/{int(version)}"


def _diff_url(namespace: str, from_version: int | None, to_version: int | None) -> str:
    query = "&".join(f"{k}={int(v)}" for k, v in (("from", from_version), ("to", to_version)) if v is not None)
    return f"{_ns_url(namespace)}/diff" + (f"?{query}" if query else "")


def _link(url: str, text: object, css: str = "") -> str:
    cls = f' class="{_e(css)}"' if css else ""
    return f'<a href="{_e(url)}"{cls}>{_e(text)}</a>'


def _page(title: str, crumbs: Sequence[tuple[str | None, str]], body: str) -> str:
    trail = " / ".join(_link(url, text) if url else _e(text) for url, text in crumbs)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)} · Combee</title>"
        f"<style>{_STYLE}</style></head>\n<body>\n"
        f'<header><a class="home" href="/">Combee</a><nav class="crumbs">{trail}</nav></header>\n'
        f"<main>\n{body}\n</main>\n</body></html>\n"
    )


def _table(head: Iterable[str], rows: Iterable[str], css: str = "") -> str:
    cls = f' class="{_e(css)}"' if css else ""
    cells = "".join(f"<th>{_e(h)}</th>" for h in head)
    return f"<table{cls}><thead><tr>{cells}</tr></thead><tbody>\n" + "\n".join(rows) + "\n</tbody></table>"


def _report(report: WorkerReport | None) -> str:
    if report is None:
        return (
            '<p class="muted" id="controller">No report from a worker '
            "(is one running? a report expires 5 minutes after the last one).</p>"
        )
    state = "profiling candidate sizes" if report.profiling else "decided"
    chosen = "not chosen yet" if report.batch_size is None else report.batch_size
    trial = f", next trial {_e(report.next_trial)}" if report.next_trial is not None else ""
    return (
        '<table class="report" id="controller"><tbody>\n'
        f'<tr><th>Controller</th><td>batch size <b class="batch-size">{_e(chosen)}</b> '
        f"({state}{trial})</td></tr>\n"
        f'<tr><th>Why</th><td class="decision">{_e(report.decision)}</td></tr>\n'
        f"<tr><th>Close to applied</th><td>p50 {_seconds(report.latency_p50_s)}, p95 "
        f"{_seconds(report.latency_p95_s)} over {report.latency_windows} recent windows</td></tr>\n"
        f"<tr><th>Traces seen</th><td>{_or_dash(report.traces_seen)} (buffered {_or_dash(report.buffered)}, "
        f"windows in flight {_or_dash(report.windows_in_flight)})</td></tr>\n"
        f"<tr><th>Worker</th><td><code>{_or_dash(report.worker)}</code>, reported {_when(report.updated_at)}"
        "</td></tr>\n</tbody></table>"
    )


def health_section(workers: Sequence[WorkerHealth]) -> str:
    """The workers' dependencies: a red box for each outage (what is down, since when, why, what it holds up),
    one line for a worker whose dependencies are all up, and a warning for a report that stopped coming."""
    if not workers:
        return (
            '<section id="health"><p class="muted">No worker has reported its health (is one running?).</p></section>'
        )
    parts = []
    for w in workers:
        age = "report time unknown" if w.age_s is None else f"reported {w.age_s:.0f} s ago"
        who = f"worker <code>{_e(w.worker)}</code> ({age})"
        if w.stale:
            parts.append(f'<p class="stale">{who}: this report is stale: is the worker still running?</p>')
        for line in w.down:
            parts.append(
                f'<div class="outage"><b>Outage</b> seen by {who}: <span class="outage-text">{_e(line)}</span></div>'
            )
        if not w.down:
            ok = ", ".join(_e(n) for n in w.up) or "nothing checked yet"
            parts.append(f'<p class="healthy">{who}: all dependencies up ({ok})</p>')
    return '<section id="health">' + "\n".join(parts) + "</section>"


def index_page(namespaces: Sequence[NamespaceSummary], health: Sequence[WorkerHealth] = ()) -> str:
    """The workers' health, then the namespaces, each with its current version and the controller's choice."""
    banner = health_section(health)
    if not namespaces:
        body = f'{banner}\n<h1>Namespaces</h1>\n<p class="empty">No namespace has traces or a published prompt yet.</p>'
        return _page("Namespaces", [], body)
    rows = [
        f"<tr><td>{_link(_ns_url(s.namespace), s.namespace, 'namespace')}</td>"
        f'<td class="version">{_or_dash(s.version)}</td><td>{_when(s.published_at)}</td>'
        f"<td>{_or_dash(s.report.batch_size if s.report else None)}</td>"
        f'<td class="decision">{_e(s.report.decision) if s.report else "no report from a worker"}</td></tr>'
        for s in namespaces
    ]
    table = _table(["Namespace", "Version", "Published", "Batch size", "Controller"], rows, "namespaces")
    return _page("Namespaces", [], f"{banner}\n<h1>Namespaces</h1>\n{table}")


def _window_cells(w: WindowRow, namespace: str) -> str:
    traces = _traces(w.trace_ids)
    published = _link(_version_url(namespace, w.published_in), f"v{w.published_in}")
    return (
        f'<tr class="window"><td>{_link(_version_url(namespace, w.version), f"v{w.version}")}</td>'
        f'<td class="id window-id">{_or_dash(w.window_id)}</td><td class="size">{_or_dash(w.size)}</td>'
        f"<td>{traces}</td><td>{published} at {_when(w.published_at)}</td></tr>"
    )


def promotion_section(promotion: Mapping[str, Any], head: int | None, namespace: str) -> str:
    """What agents are served (the policy, the live version, a pending candidate) and the newest decisions,
    newest first, each with its evidence in brief (docs/promotion.md)."""
    if not promotion:
        return '<p class="empty">No promotion state recorded (policy direct).</p>'
    names = {f.name for f in dataclasses.fields(Serving)}
    try:
        state = serving_summary(Serving(**{k: v for k, v in promotion.items() if k in names}), head)
    except (TypeError, ValueError) as exc:  # not what streams.redis_promotion reads: say so, render the rest
        state = f"unreadable serving state ({exc})"
    summary = f'<p id="promotion-summary">{_e(state)}</p>'
    decisions = [d for d in promotion.get("decisions") or () if isinstance(d, Mapping)]
    if not decisions:
        return f'{summary}\n<p class="empty">No decision recorded yet.</p>'
    rows = []
    for d in reversed(decisions):
        version, serve = as_int(d.get("version")), as_int(d.get("serve"))
        acted = _link(_version_url(namespace, version), f"v{version}") if version is not None else "—"
        served = _link(_version_url(namespace, serve), f"v{serve}") if serve is not None else "unchanged"
        rows.append(
            f'<tr class="decision-row"><td>{_when(as_float(d.get("at")))}</td><td>{_e(d.get("action"))}</td>'
            f"<td>{acted}</td><td>{_e(d.get('decided_by'))}</td><td>{served}</td>"
            f'<td class="decision">{_e(decision_why(d))}</td></tr>'
        )
    table = _table(["When", "Decision", "Version", "By", "Serves", "Why"], rows, "decisions")
    return f"{summary}\n{table}"


def namespace_page(view: NamespaceOverview, health: Sequence[WorkerHealth] = ()) -> str:
    """The workers' outages, then a namespace: its current version, its versions, its recent windows and its
    worker's report."""
    ns = view.namespace
    crumbs = [(None, ns)]
    banner = health_section([w for w in health if w.down or w.stale])
    if not view.versions:
        body = (
            f"{banner}\n<h1>{_e(ns)}</h1>\n"
            '<p class="empty">No version of this namespace is published yet.</p>\n'
            f"<h2>Controller</h2>\n{_report(view.report)}"
        )
        return _page(ns, crumbs, body)
    head = (
        f"{banner}\n<h1>{_e(ns)}: version "
        f'<span id="current-version">{_or_dash(view.current)}</span></h1>\n'
        f"<p>{_link(_version_url(ns, view.current), 'current prompt') if view.current else ''} · "
        f"{_link(_diff_url(ns, None, None), 'what the last version changed')}</p>"
    )
    rows = []
    for i, h in enumerate(view.versions):
        older = view.versions[i + 1].version if i + 1 < len(view.versions) else None
        diff = _link(_diff_url(ns, older, h.version), "diff") if older is not None else ""
        note = h.meta.get("note")
        rows.append(
            f'<tr class="version-row"><td>{_link(_version_url(ns, h.version), f"v{h.version}")}</td>'
            f"<td>{_when(h.published_at)}</td><td>{_or_dash(h.bullets)}</td><td>{_or_dash(h.tokens)}</td>"
            f'<td class="id">{_or_dash(h.window_id)}</td><td>{_or_dash(h.meta.get("traces"))}</td>'
            f"<td>{_e(note) if note else ''}</td><td>{diff}</td></tr>"
        )
    versions = _table(["Version", "Published", "Bullets", "Tokens", "Window", "Traces", "Note", ""], rows)
    windows = _table(
        ["Version", "Window", "Size (traces)", "Trace ids", "Published in"],
        [_window_cells(w, ns) for w in view.windows],
        "windows",
    )
    chart = success_rate_chart(view.outcomes, view.current)
    promotion = promotion_section(view.promotion, view.current, ns)
    body = (
        f"{head}\n<h2>Promotion</h2>\n{promotion}\n<h2>Controller</h2>\n{_report(view.report)}\n"
        f"<h2>Success rate by version</h2>\n{chart}\n"
        f'<h2>Recent windows</h2>\n<p class="note">{_e(_LATENCY_NOTE)}</p>\n{windows}\n'
        f"<h2>Versions</h2>\n{versions}"
    )
    return _page(ns, crumbs, body)


def _bullet(b: Bullet, namespace: str) -> str:
    return (
        f'<li class="bullet" data-bullet-id="{_e(b.id)}"><span class="id">[{_e(b.id)}]</span> '
        f'<span class="bullet-text">{_e(b.content)}</span> '
        f'<span class="muted">helpful {b.helpful}, harmful {b.harmful}; created by '
        f"{_link(_version_url(namespace, b.created.version), f'v{b.created.version}')}"
        + (
            f", changed by {_link(_version_url(namespace, b.updated.version), f'v{b.updated.version}')}"
            if b.updated != b.created
            else ""
        )
        + "</span></li>"
    )


def _provenance(p: WindowProvenance) -> str:
    window = f"<code>{_or_dash(p.window_id)}</code>"
    return f'<li class="window">v{p.version} · window {window} · {_traces(p.trace_ids)}</li>'


def version_page(view: VersionDetail) -> str:
    """One version: its bullets by section, the prompt agents read, and the windows it covers."""
    ns = view.namespace
    sections: dict[str, list[Bullet]] = {}
    for b in view.playbook.bullets:
        sections.setdefault(b.section, []).append(b)
    if sections:
        bullets = "\n".join(
            f'<h3 class="section">{_e(section)}</h3>\n<ul class="bullets">\n'
            + "\n".join(_bullet(b, ns) for b in items)
            + "\n</ul>"
            for section, items in sections.items()
        )
    else:
        bullets = '<p class="empty">This version has no bullets.</p>'
    current = " (current)" if view.current == view.version else ""
    diff = (
        _link(_diff_url(ns, view.previous, view.version), f"diff from v{view.previous}")
        if view.previous is not None
        else _link(_diff_url(ns, 0, view.version), "diff from the empty playbook")
    )
    windows = "\n".join(_provenance(p) for p in view.windows) or '<li class="muted">not recorded</li>'
    body = (
        f'<h1>{_e(ns)}: version <span id="version">{view.version}</span>{current}</h1>\n'
        f"<p>published {_when(view.published_at)} · window <code>{_or_dash(view.window_id)}</code> · "
        f"{len(view.playbook.bullets)} bullets · {diff}</p>\n"
        f"<h2>Bullets</h2>\n{bullets}\n"
        f'<h2>Windows this version covers</h2>\n<ul class="windows">\n{windows}\n</ul>\n'
        f'<h2>Prompt</h2>\n<pre id="prompt">{_e(view.prompt)}</pre>'
    )
    return _page(f"{ns} v{view.version}", [(_ns_url(ns), ns), (None, f"v{view.version}")], body)


def _lessons(c: BulletChange) -> str:
    """The lessons the teaching traces stated: the newest shown, every one when opened."""
    quotes = [q for t in reversed(c.why) for q in t.lessons]
    if not quotes:
        return ""

    def one(q: Quote) -> str:
        return f'<q class="lesson">{_e(q.text)}</q> <span class="id muted">({_e(q.trace_id)})</span>'

    if len(quotes) == 1:
        return f'<div class="lessons">{one(quotes[0])}</div>'
    rest = "".join(f"<div>{one(q)}</div>" for q in quotes[1:])
    return f'<details class="lessons"><summary>{one(quotes[0])} +{len(quotes) - 1} more</summary>{rest}</details>'


def _why(c: BulletChange, namespace: str) -> str:
    """Why the bullet changed: the curator's operations, the traces that taught it and their lessons; without
    recorded evidence, the window and the bullet's own traces (or the window's)."""
    p = c.taught_by
    verb = "removed by" if c.kind == "removed" else "taught by"
    window = (
        f"{verb} window <code>{_or_dash(p.window_id)}</code> "
        f"({_link(_version_url(namespace, p.version), f'v{p.version}')})"
    )
    if not c.from_evidence:
        traces = _traces(p.trace_ids, "traces in the window") if c.traces is None else _traces(c.traces)
        return f'<div class="muted why">{window}; {traces}</div>'
    if not c.why:
        return f'<div class="muted why">{window}: no operation named it (evicted, or merged into a duplicate)</div>'
    ops = ", ".join(dict.fromkeys(f"{t.op}→{t.outcome} v{t.version}" for t in c.why))
    return (
        f'<div class="why"><span class="op">{_e(ops)}</span> · {_traces(c.traces, "traces taught it")} '
        f'<span class="muted">· {window}</span>{_lessons(c)}</div>'
    )


def _change(c: BulletChange, namespace: str) -> str:
    text = c.after if c.kind == "added" else c.before
    now = f'<div>now: <span class="bullet-after">{_e(c.after)}</span></div>' if c.kind == "changed" else ""
    return (
        f'<li class="change {_e(c.kind)}" data-bullet-id="{_e(c.bullet_id)}"><span class="kind">{_e(c.kind)}</span>'
        f'<span class="id">[{_e(c.bullet_id)}]</span> <span class="muted">({_e(c.section)})</span> '
        f'<span class="bullet-text">{_e(text)}</span>{now}{_why(c, namespace)}</li>'
    )


def diff_page(diff: PromptDiff) -> str:
    """What changed from one version to another, each change with the window and traces that taught it."""
    ns = diff.namespace
    counts = ", ".join(
        f'<span class="count-{k}">{len(diff.of_kind(k))}</span> {k}' for k in ("added", "changed", "removed")
    )
    changes = "\n".join(_change(c, ns) for c in diff.changes) or '<li class="muted">No bullet changed.</li>'
    form = (
        f'<form method="get" action="{_e(_diff_url(ns, None, None))}">from '
        f'<input name="from" type="number" min="0" value="{diff.from_version}"> to '
        f'<input name="to" type="number" min="1" value="{diff.to_version}"> <button>compare</button></form>'
    )
    body = (
        f'<h1>{_e(ns)}: v<span id="from-version">{diff.from_version}</span> → '
        f'v<span id="to-version">{diff.to_version}</span></h1>\n'
        f"<p>{counts}</p>\n{form}\n"
        f'<ul class="changes">\n{changes}\n</ul>'
    )
    crumbs = [(_ns_url(ns), ns), (None, f"diff v{diff.from_version} → v{diff.to_version}")]
    return _page(f"{ns} v{diff.from_version}→v{diff.to_version}", crumbs, body)


def error_page(status: int, message: str) -> str:
    """A page for a failure (unknown version, bad request, Redis unreachable): the status and one line."""
    return _page(f"{status}", [(None, str(status))], f'<h1>{status}</h1>\n<p class="error">{_e(message)}</p>')
