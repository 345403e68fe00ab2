"""``combee task --overload``'s report: ``overload.json``, ``overload.md`` and ``overload.png`` (pure but for the
PNG). Every figure comes from an :class:`~combee.tasks.overload.OverloadResult`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from combee.tasks.overload import OverloadResult, Recorded, refusals

__all__ = ["document", "markdown", "write_plot"]


def _variant_row(v: Any) -> dict[str, Any]:
    meter = v.meter
    usage = meter.usage
    return {
        "variant": v.variant.name,
        "family": v.variant.family,
        "method": v.variant.config.method.value,
        "batch": v.variant.batch,
        "shape": v.variant.config.shuffle_key if v.variant.family == "combee" else None,
        "p": v.variant.config.p if v.variant.family == "combee" else None,
        **v.size.as_dict(),
        "windows": v.windows,
        "calls": meter.calls,
        "calls_by_role": {role: s.calls for role, s in sorted(meter.roles.items())},
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "tokens": usage.prompt_tokens + usage.completion_tokens,
        "wall_s": round(v.wall_s, 3),
        "critical_path_s": None if v.critical_path_s is None else round(v.critical_path_s, 3),
        "parse_failures": {role: s.parse_failures for role, s in sorted(meter.roles.items())},
        "skipped_groups": meter.skipped_groups,
        "merge_fallbacks": meter.merge_fallbacks,
        "redundant_combines": meter.redundant_combines,
        "refused_ops": refusals(meter),
        "held": dict(sorted(meter.held.items())),  # what corroboration held back (pending until k teachers)
        "copies_folded": meter.folded_copies,
        "near_duplicates_folded": meter.folded_ops + meter.folded_proposals,
        "sections_mapped": meter.sections_mapped,
        "sections": list(v.playbook.sections),
        "routing_classes": list(v.routing_classes),
        "phase": v.phase.as_dict(),
    }


def document(result: OverloadResult, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The ``overload.json`` document: ``meta`` (endpoint, model, options) plus every figure."""
    recorded = result.config.recorded
    return {
        **meta,
        "mode": "overload: one set of reflections (empty playbook), reduced by every variant",
        "n_train": len(result.config.train),
        "train_ids": [q.id for q in result.config.train],
        **(_recorded(recorded) if recorded is not None else _reflected(result)),
        "variants": [_variant_row(v) for v in result.variants],
        "wall_s": round(result.wall_s, 3),
    }


def _reflected(result: OverloadResult) -> dict[str, Any]:
    """The figures of this run's traces and its one reflection pass."""
    parsed = [r for r in result.reflections if r is not None]
    labels = Counter(i.section for r in parsed for i in r.insights)
    rm = result.reflect_meter
    return {
        "traces": result.phases["traces"].as_dict(),
        "reflections": {
            **result.phases["reflect"].as_dict(),
            "parsed": len(parsed),
            "unparsed": len(result.reflections) - len(parsed),
            "with_insights": sum(1 for r in parsed if r.insights),
            "insights": sum(len(r.insights) for r in parsed),
            "refused_insights": refusals(rm),
            "trimmed_sentences": {reason: rm.trimmed.get(reason, 0) for reason in refusals(rm)},
            "parse_failures": rm.role(_reflector()).parse_failures,
            "labels_as_written": dict(labels.most_common()),
        },
    }


def _recorded(recorded: Recorded) -> dict[str, Any]:
    """The figures of the run that recorded the traces and reflections, as it wrote them, and where they came from."""
    return {
        "recorded_in": recorded.source,
        "traces": dict(recorded.traces_figures),
        "reflections": dict(recorded.reflections_figures),
    }


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _load(phase: Mapping[str, Any]) -> str:
    load = phase.get("loadavg_at_end")
    return f"{load[0]:.1f}" if load else "–"


def _recorded_in(doc: Mapping[str, Any]) -> str:
    source = doc.get("recorded_in")
    return f" by an earlier run (recorded in `{source}`; this run reflected nothing)" if source else ""


def _corroboration(doc: Mapping[str, Any]) -> str:
    c = (doc.get("method_config") or {}).get("corroboration") or {}
    k = c.get("min_traces", 1)
    if k <= 1:
        return ""
    return (
        f" Corroboration on: a lesson goes live only when {k} distinct traces taught it (*held*: operations left "
        "pending at the end, each counted once per window it was held in)."
    )


def _reflector() -> Any:
    from combee.llm import Role

    return Role.REFLECTOR


def markdown(doc: Mapping[str, Any]) -> str:
    label = "SIMULATED (Combee simulator; not a real model)" if doc["simulated"] else "real model"
    r = doc["reflections"]
    refused = ", ".join(f"{k} {v}" for k, v in r["refused_insights"].items() if v) or "none"
    trimmed = ", ".join(f"{k} {v}" for k, v in r["trimmed_sentences"].items() if v) or "none"
    lines = [
        f"# {doc['task']}: context overload — {label}",
        "",
        f"Model `{doc['model']}` at `{doc['endpoint']}` ({label}). {doc['n_train']} training questions → traces "
        f"(empty playbook) → {r['parsed']} reflections ({r['unparsed']} unparsed; {r['with_insights']} with "
        f"insights, {r['insights']} insights kept; lessons refused by the screen: {refused}; sentences trimmed "
        f"from kept lessons: {trimmed}), reflected once in "
        f"{r['wall_s']:.1f} s{_recorded_in(doc)} and reduced by every variant below from the empty playbook."
        f"{_corroboration(doc)}",
        "",
        "| variant | batch | windows | entries | distinct lessons | bullets / lesson | playbook tokens | calls "
        "| tokens | wall s | critical path s | load at end | copies folded | ops refused | held | routing classes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in doc["variants"]:
        refused_ops = sum(v["refused_ops"].values())
        classes = len(v["routing_classes"]) if v["routing_classes"] else "–"
        lines.append(
            f"| {v['variant']} | {v['batch']} | {v['windows']} | {v['entries']} | {v['distinct_lessons']} "
            f"| {v['bullets_per_lesson']:.2f} | {v['playbook_tokens']} | {v['calls']} | {v['tokens']} "
            f"| {v['wall_s']:.1f} | {_seconds(v['critical_path_s'])} | {_load(v['phase'])} | {v['copies_folded']} "
            f"| {refused_ops} | {sum((v.get('held') or {}).values())} | {classes} |"
        )
    written = ", ".join(f"{k} ({n})" for k, n in r["labels_as_written"].items())
    skipped = (doc.get("options") or {}).get("skip") or ()
    lines += [
        *(["", f"Variants left out of this run (`--skip`): {', '.join(skipped)}."] if skipped else []),
        "",
        f"Section labels as the reflector wrote them (slugged): {written or '–'}.",
        "",
        "Distinct lessons: bullets clustered single-link by the de-duplicator's rule "
        f"({doc.get('dedup') or 'exact normalised text'}). Critical path: per window, the slowest chain of calls "
        "(curator, then merges), summed over windows; the one reflection pass is not included (every variant "
        "shares it). Wall times are each variant's own, run one after another on the same server; *load at end* "
        "is the machine's 1-minute load average when the variant's phase ended (2 cores: above 2, other work "
        "shared the CPU and the wall time is longer than the variant alone would take).",
        "",
    ]
    return "\n".join(lines)


def write_plot(doc: Mapping[str, Any], path: Path) -> Path:
    """``overload.png``: entries and distinct lessons against batch size (the paper's Figure 2), naive as a
    line, Combee's shapes and sequential as points. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["variants"]
    naive = sorted((v for v in rows if v["family"] == "naive"), key=lambda v: v["batch"])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    ax.plot([v["batch"] for v in naive], [v["entries"] for v in naive], "o-", color="#d62728", label="naive: entries")
    ax.plot(
        [v["batch"] for v in naive],
        [v["distinct_lessons"] for v in naive],
        "o--",
        color="#d62728",
        alpha=0.6,
        label="naive: distinct lessons",
    )
    markers = iter("s^Dvp<>")
    for v in rows:
        if v["family"] == "naive":
            continue
        m = next(markers, "o")
        color = "#555555" if v["family"] == "sequential" else "#1f77b4"
        ax.scatter([v["batch"]], [v["entries"]], marker=m, color=color, label=f"{v['variant']}: entries")
        ax.scatter([v["batch"]], [v["distinct_lessons"]], marker=m, facecolors="none", edgecolors=color,
                   label=f"{v['variant']}: distinct")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (reflections per curator window)")
    ax.set_ylabel("playbook bullets")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6.5, ncol=2)
    label = "SIMULATED model" if doc["simulated"] else f"model {doc['model']}"
    ax.set_title(f"{doc['task']} — context overload — {label} — {doc['reflections']['parsed']} reflections", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
