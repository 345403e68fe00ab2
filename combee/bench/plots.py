"""The benchmark's PNG figures (matplotlib, headless). Every figure is titled SIMULATED.

* ``quality_vs_time.png`` — the paper's Figure 1 shape: each method and batch size a point, training wall
  time (log scale) against simulated test accuracy, against insight retention (plain: hollow markers; at
  sequential's prompt size: filled) and against retention at 2,000 prompt tokens.
* ``entries_vs_batch.png`` — the paper's Figure 2 shape: playbook entries against batch size for naive
  batching and Combee, with the paper's Formula curve for naive batching and its ±30 % band.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from combee.bench.report import aggregate
from combee.bench.spec import PAPER_FORMULA_NAIVE

__all__ = ["write_plots"]

_STYLE: dict[str, dict[str, Any]] = {
    "sequential": {"color": "#555555", "marker": "s"},
    "naive": {"color": "#d62728", "marker": "v"},
    "combee": {"color": "#1f77b4", "marker": "o"},
}


def _sweep_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [row for row in aggregate(doc["runs"]) if row["kind"] == "sweep"]


def write_plots(doc: Mapping[str, Any], out: Path) -> list[Path]:
    """Write the figures of ``doc`` (a ``results.json`` document) into ``out``; returns their paths (none without
    a sweep).

    Raises ImportError when matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    rows = _sweep_rows(doc)
    if not rows:  # --no-sweep: the ablation and scale tables are in results.md
        return []
    return [
        _quality_vs_time(rows, doc, out / "quality_vs_time.png"),
        _entries_vs_batch(rows, doc, out / "entries_vs_batch.png"),
    ]


def _label(row: Mapping[str, Any]) -> str:
    return "seq" if row["method"] == "sequential" else str(row["batch_size"])


def _quality_vs_time(rows: Sequence[Mapping[str, Any]], doc: Mapping[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    panels: tuple[tuple[Any, tuple[str, ...], str], ...] = (
        (axes[0], ("sim_accuracy",), "simulated test accuracy (%)"),
        (
            axes[1],
            ("insight_retention", "retention_at_seq_size"),
            "insight retention: plain (hollow), at seq. size (filled)",
        ),
        (axes[2], ("retention_at_2000",), "insight retention at 2,000 prompt tokens"),
    )
    for ax, fields, title in panels:
        for field in fields:
            _scatter(ax, rows, field, hollow=len(fields) > 1 and field == "insight_retention")
        ax.set_xscale("log")
        ax.set_xlabel("training wall time (s, log scale)")
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(
        f"SIMULATED — quality vs training time ({doc['n_traces']} traces, medians of {len(doc.get('seeds', []))} "
        f"seeds, time_scale {doc['time_scale']}; labels: batch size)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _scatter(ax: Any, rows: Sequence[Mapping[str, Any]], field: str, hollow: bool) -> None:
    for method, style in _STYLE.items():
        points = [r for r in rows if r["method"] == method and r.get(field) is not None and r.get("wall_s")]
        if not points:
            continue
        xs = [r["wall_s"] for r in points]
        scale = 100.0 if field == "sim_accuracy" else 1.0
        ys = [r[field] * scale for r in points]
        look = {**style, "facecolors": "none", "edgecolors": style["color"]} if hollow else style
        if hollow:
            look.pop("color")
        ax.scatter(xs, ys, label=None if hollow else method, s=46, **look)
        for r, x, y in zip(points, xs, ys, strict=True):
            ax.annotate(_label(r), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)


def _entries_vs_batch(rows: Sequence[Mapping[str, Any]], doc: Mapping[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.8))
    seq = [r for r in rows if r["method"] == "sequential"]
    for method in ("naive", "combee"):
        points = sorted(
            (r["batch_size"], r["playbook_entries"])
            for r in rows
            if r["method"] == method and isinstance(r["batch_size"], int) and r.get("playbook_entries") is not None
        )
        if seq:
            points = [(1, seq[0]["playbook_entries"]), *points]  # batch 1 is sequential for both
        if points:
            ax.plot(*zip(*points, strict=True), label=f"{method} (simulated)", **_STYLE[method])
    if doc["n_traces"] == 500:
        xs = sorted(PAPER_FORMULA_NAIVE)
        ys = [PAPER_FORMULA_NAIVE[x] for x in xs]
        ax.plot(xs, ys, "k--", label="naive, paper (Formula, 500 traces)")
        ax.fill_between(xs, [0.7 * y for y in ys], [1.3 * y for y in ys], color="k", alpha=0.08, label="±30 %")
    ax.set_xscale("log")
    ax.set_xlabel("batch size (log scale)")
    ax.set_ylabel("playbook entries")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"SIMULATED — playbook entries vs batch size ({doc['n_traces']} traces)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
