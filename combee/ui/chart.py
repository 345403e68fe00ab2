"""The success-rate-by-version chart of ``combee ui``: counts in, an inline SVG string out. Pure, no JavaScript.

Drawn with SVG presentation attributes only (``fill``, ``stroke``, ...), never a ``style`` attribute, so the
page's Content-Security-Policy (one hashed ``<style>`` element, nothing else) needs no change. One bar per
version, oldest left: its height is the success rate among traces that reported success or failure, its
whisker the 95 % Wilson interval, with n above it. Versions past the newest :data:`CHART_VERSIONS` are summed as
``older``; traces naming a version above the live one as ``unknown``.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Final

from combee.outcomes import OutcomeCounts, fold_versions, version_order

__all__ = ["CHART_VERSIONS", "success_rate_chart"]

CHART_VERSIONS: Final = 20
_W, _H = 40, 180  # one bar's slot width, the plot's height (pixels)
_LEFT, _TOP, _BOTTOM = 40, 24, 36


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _y(rate: float) -> float:
    return _TOP + (1.0 - rate) * _H


def _bar(i: int, key: str, counts: OutcomeCounts) -> str:
    x = _LEFT + i * _W
    label = f"v{key}" if key.isdigit() else key
    parts = [f'<text x="{x + _W / 2:.1f}" y="{_TOP + _H + 16}" text-anchor="middle" font-size="11">{_e(label)}</text>']
    rate, interval = counts.success_rate, counts.interval()
    if rate is None or interval is None:
        parts.append(
            f'<text x="{x + _W / 2:.1f}" y="{_TOP + _H - 4}" text-anchor="middle" font-size="10" fill="#778">'
            f"n={counts.n}</text>"
        )
        return f'<g class="no-rate" data-version="{_e(key)}">' + "".join(parts) + "</g>"
    lo, hi = interval
    top = _y(rate)
    fill = "#f2b705" if key.isdigit() else "#b8bcc6"  # a version's own bar; grey for older / unknown
    parts += [
        f'<rect x="{x + 8}" y="{top:.1f}" width="{_W - 16}" height="{_TOP + _H - top:.1f}" fill="{fill}">'
        f"<title>{_e(label)}: {rate:.0%} of {counts.decided} (95% Wilson {lo:.0%} to {hi:.0%}), n={counts.n}</title>"
        "</rect>",
        f'<line x1="{x + _W / 2:.1f}" x2="{x + _W / 2:.1f}" y1="{_y(hi):.1f}" y2="{_y(lo):.1f}" stroke="#1d2330"/>',
        f'<line x1="{x + _W / 2 - 5:.1f}" x2="{x + _W / 2 + 5:.1f}" y1="{_y(hi):.1f}" y2="{_y(hi):.1f}" '
        'stroke="#1d2330"/>',
        f'<line x1="{x + _W / 2 - 5:.1f}" x2="{x + _W / 2 + 5:.1f}" y1="{_y(lo):.1f}" y2="{_y(lo):.1f}" '
        'stroke="#1d2330"/>',
        f'<text x="{x + _W / 2:.1f}" y="{_y(hi) - 4:.1f}" text-anchor="middle" font-size="10">n={counts.n}</text>',
    ]
    return (
        f'<g class="rate-bar" data-version="{_e(key)}" data-rate="{rate:.4f}" data-low="{lo:.4f}" '
        f'data-high="{hi:.4f}" data-n="{counts.n}">' + "".join(parts) + "</g>"
    )


def success_rate_chart(counts: Mapping[str, OutcomeCounts], live: int | None) -> str:
    """The chart as an ``<svg>`` element (``id="success-rate-chart"``), or a one-line note when nothing is
    counted. ``live``: the namespace's live version (the newest :data:`CHART_VERSIONS` up to it get a bar)."""
    if not counts:
        return (
            '<p class="muted" id="success-rate-chart">No outcomes yet: no trace named the version it ran with '
            "(a trace's <code>playbook_version</code> and <code>feedback.success</code>).</p>"
        )
    folded = fold_versions(counts, live, CHART_VERSIONS)
    keys = sorted(folded, key=version_order)
    keys = [k for k in keys if k.isdigit()][::-1] + [k for k in keys if not k.isdigit()]  # oldest first, left
    width = _LEFT + _W * len(keys) + 10
    grid = "".join(
        f'<line x1="{_LEFT}" x2="{width - 10}" y1="{_y(r):.1f}" y2="{_y(r):.1f}" stroke="#e1e3e8"/>'
        f'<text x="{_LEFT - 6}" y="{_y(r) + 4:.1f}" text-anchor="end" font-size="10">{r:.0%}</text>'
        for r in (0.0, 0.5, 1.0)
    )
    bars = "".join(_bar(i, k, folded[k]) for i, k in enumerate(keys))
    return (
        f'<svg id="success-rate-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{_TOP + _H + _BOTTOM}" role="img" aria-label="success rate by version">'
        "<title>Success rate by version (bars), 95% Wilson interval (whiskers), n = traces counted</title>"
        f"{grid}{bars}</svg>"
    )
