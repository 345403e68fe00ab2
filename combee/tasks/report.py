"""The finance harness's report: ``results.json`` document, Markdown table and plot (pure but for the PNG).

``python -m combee.tasks.report DIR`` writes ``DIR/results.md`` and ``DIR/accuracy.png`` again from
``DIR/results.json`` with this module's code (after a change to how they are rendered; no figure changes).

Accuracy intervals are percentile bootstrap intervals over test questions: ``resamples`` draws (default
2,000) of n question indices with replacement, from a RNG seeded by the run's seed. The *same* draws are used
for every playbook, so the interval of a difference to the empty playbook (``delta_vs_none``) is paired.
"""

from __future__ import annotations

import json
import math
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from combee.playbook import playbook_tokens
from combee.tasks.run import BASELINE, HarnessResult

__all__ = ["bootstrap_indices", "document", "interval", "markdown", "write_plot"]

LEVEL = 0.95


def bootstrap_indices(n: int, resamples: int, seed: int) -> list[list[int]]:
    """``resamples`` lists of ``n`` indices in ``range(n)``, drawn with replacement from ``Random(seed)``."""
    rng = random.Random(seed)
    return [[rng.randrange(n) for _ in range(n)] for _ in range(resamples)] if n else []


def interval(values: Sequence[float], draws: Sequence[Sequence[int]], level: float = LEVEL) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``values`` over ``draws`` (from :func:`bootstrap_indices`)."""
    if not values or not draws:
        return (math.nan, math.nan)
    means = sorted(sum(values[i] for i in draw) / len(draw) for draw in draws)
    alpha = (1.0 - level) / 2.0
    lo = means[math.floor(alpha * len(means))]
    hi = means[max(0, math.ceil((1.0 - alpha) * len(means)) - 1)]
    return (lo, hi)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _r(value: float, digits: int = 4) -> float | None:
    return None if math.isnan(value) else round(value, digits)


def _found_by(attempts: Sequence[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for a in attempts:
        counts[a.extracted.how] = counts.get(a.extracted.how, 0) + 1
    return dict(sorted(counts.items()))


def _paired(a: Sequence[float], b: Sequence[float], draws: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Mean of ``a − b`` per question and its paired bootstrap interval (the same resamples for both)."""
    deltas = [x - y for x, y in zip(a, b, strict=True)]
    return {"delta": _r(_mean(deltas)), "ci95": [_r(x) for x in interval(deltas, draws)]}


def document(
    result: HarnessResult,
    meta: Mapping[str, Any],
    *,
    resamples: int = 2000,
    seed: int = 0,
    sizes: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict:
    """The ``results.json`` document: ``meta`` (endpoint, model, simulated, data, options) plus every figure.
    ``sizes`` gives each playbook's size figures (:class:`combee.quality.Bloat`; distinct lessons need the
    embedder, which the caller has)."""
    draws = bootstrap_indices(len(result.config.test), resamples, seed)
    base_scores = [a.grade.score for a in result.evals[BASELINE]]
    methods: list[dict[str, Any]] = []
    for name, attempts in result.evals.items():
        scores = [a.grade.score for a in attempts]
        upstream = [a.grade.upstream for a in attempts]
        success = [float(a.grade.success) for a in attempts]
        deltas = [s - b for s, b in zip(scores, base_scores, strict=True)]
        playbook = result.playbooks[name]
        row: dict[str, Any] = {
            "method": name,
            "accuracy": _r(_mean(scores)),
            "ci95": [_r(x) for x in interval(scores, draws)],
            "upstream_accuracy": _r(_mean(upstream)),
            "upstream_ci95": [_r(x) for x in interval(upstream, draws)],
            "all_correct": _r(_mean(success)),
            "no_answer": sum(a.extracted.answer is None for a in attempts),
            "answers_found_by": _found_by(attempts),
            "playbook_entries": len(playbook.bullets),
            "playbook_tokens": playbook_tokens(playbook),
            **({"size": dict(sizes[name])} if sizes and name in sizes else {}),
            "eval": result.phases[f"eval-{name}"].as_dict(),
            "learn": None,
        }
        if name != BASELINE:
            row["delta_vs_none"] = {"mean": _r(_mean(deltas)), "ci95": [_r(x) for x in interval(deltas, draws)]}
            learned = result.learned[name]
            meter = learned.meter
            row["learn"] = {
                **result.phases[f"learn-{name}"].as_dict(),
                "iterations": len(learned.iterations),
                "batch_sizes": learned.batch_sizes,
                "calls_by_role": {role: s.calls for role, s in sorted(meter.roles.items())},
                "parse_failures": {role: s.parse_failures for role, s in sorted(meter.roles.items())},
                "skipped_traces": meter.skipped_traces,
                "skipped_groups": meter.skipped_groups,
                "merge_fallbacks": meter.merge_fallbacks,
                "redundant_combines": meter.redundant_combines,
                "dedup": meter.dedup_counts(),
            }
        methods.append(row)
    for name, why in result.failed.items():
        methods.append({"method": name, "error": why, "learn": {**result.phases[f"learn-{name}"].as_dict()}})
    scores_of = {name: [a.grade.score for a in attempts] for name, attempts in result.evals.items()}
    pairs = [
        {"a": a, "b": b, **_paired(scores_of[a], scores_of[b], draws)}
        for i, a in enumerate(scores_of)
        for b in list(scores_of)[i + 1 :]
    ]
    learn_wall = {m["method"]: m["learn"]["wall_s"] for m in methods if m["learn"] and "error" not in m}
    ratio: dict[str, Any] = {}
    if learn_wall.get("sequential") and "combee" in learn_wall:
        ratio = {
            "combee_learn_wall_s": learn_wall["combee"],
            "sequential_learn_wall_s": learn_wall["sequential"],
            "ratio": round(learn_wall["combee"] / learn_wall["sequential"], 4),
            "speedup": round(learn_wall["sequential"] / learn_wall["combee"], 3) if learn_wall["combee"] else None,
        }
    train = result.train_attempts
    cached = sum(s.cached for s in result.phases.values())
    return {
        **meta,
        "mode": "offline: one set of training traces (empty playbook), learned by every method",
        "n_train": len(result.config.train),
        "n_test": len(result.config.test),
        "train_ids": [q.id for q in result.config.train],
        "test_ids": [q.id for q in result.config.test],
        "traces": {
            **result.phases["traces"].as_dict(),
            "success_rate": _r(_mean([float(a.grade.success) for a in train])),
            "answers_found_by": _found_by(train),
        },
        "methods": methods,
        "pairs": pairs,
        "combee_vs_sequential_learning": ratio,
        "bootstrap": {"resamples": resamples, "seed": seed, "level": LEVEL, "unit": "test question"},
        "served_models": sorted({m for s in result.phases.values() for m in s.models}),
        "context_tokens": result.context_tokens,
        "cached_calls": cached,
        "timed_in_earlier_runs": {
            n: s.timed_at for n, s in sorted(result.phases.items()) if s.timed_at and s.resumed_after is None
        },
        "resumed_phases": {
            n: {"after_step": s.resumed_after, "first_steps_timed_at": s.timed_at}
            for n, s in sorted(result.phases.items())
            if s.resumed_after is not None
        },
        "wall_s": round(result.wall_s, 3),
    }


# --- Markdown -------------------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def _ci(ci: Sequence[float | None]) -> str:
    lo, hi = ci
    return "–" if lo is None or hi is None else f"[{100 * lo:.1f}, {100 * hi:.1f}]"


def _tokens(n: int) -> str:
    return f"{n / 1000:.1f} k" if n >= 1000 else str(n)


def _wall(stats: Mapping[str, Any]) -> str:
    """A phase's wall time as a table cell, saying what the clock measured: the model's answers, or in part or in
    whole the response cache's (then the figure is not a model timing)."""
    calls, cached = stats["calls"], stats["cached_calls"]
    if not cached:
        return f"{stats['wall_s']:.1f}"
    if cached == calls:
        return "replayed"
    return f"{stats['wall_s']:.1f} ({cached} of {calls} cached)"


def _model_wall(stats: Mapping[str, Any]) -> float:
    """A phase's wall time if the model answered every call of it, else 0 (the plot draws no bar)."""
    return 0.0 if stats["cached_calls"] else float(stats["wall_s"])


def _learn_cached(doc: Mapping[str, Any]) -> bool:
    return any(m["learn"]["cached_calls"] for m in doc["methods"] if m["method"] in ("sequential", "combee"))


def _evaluated(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [m for m in doc["methods"] if "error" not in m]


def markdown(doc: Mapping[str, Any]) -> str:
    """``results.md``: provenance lines, the accuracy and cost table, and the learning-time ratio."""
    label = "SIMULATED (Combee simulator; not a real model)" if doc["simulated"] else "real model"
    headline = "label-level accuracy" if doc["task"] == "finer" else "accuracy (2-decimal rule)"
    upstream = "upstream rule" if doc["task"] == "formula" else "all 4 labels"
    lines = [
        f"# {doc['task']}: accuracy before and after learning — {label}",
        "",
        f"Model `{doc['model']}` at `{doc['endpoint']}` ({label}); {doc['n_train']} training questions → traces "
        f"(empty playbook), {doc['n_test']} test questions, seed {doc['seed']}; batch size "
        f"{doc['batch_size']} for naive and Combee; {doc['mode']}.",
        "",
        f"| playbook | entries | distinct lessons | playbook tokens | {headline} % | 95 % CI | {upstream} % "
        "| Δ vs none (95 % CI) | no answer | learn wall s | learn calls | learn tokens | eval wall s | eval calls "
        "| eval tokens | eval tokens / question |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in doc["methods"]:
        learn = m["learn"]
        if "error" in m:
            lines.append(f"| {m['method']} | failed: {m['error']} |" + " |" * 14)
            continue
        second = m["upstream_accuracy"] if doc["task"] == "formula" else m["all_correct"]
        delta = m.get("delta_vs_none")
        delta_text = "–" if delta is None else f"{100 * delta['mean']:+.1f} {_ci(delta['ci95'])}"
        learn_cols = ["–", "–", "–"] if learn is None else [_wall(learn), str(learn["calls"]), _tokens(learn["tokens"])]
        ev = m["eval"]
        distinct = m.get("size", {}).get("distinct_lessons", "–")
        per_question = f"{ev['tokens'] / ev['calls']:.0f}" if ev["calls"] else "–"
        lines.append(
            f"| {m['method']} | {m['playbook_entries']} | {distinct} | {m['playbook_tokens']} | {_pct(m['accuracy'])} "
            f"| {_ci(m['ci95'])} | {_pct(second)} | {delta_text} | {m['no_answer']} | {' | '.join(learn_cols)} "
            f"| {_wall(ev)} | {ev['calls']} | {_tokens(ev['tokens'])} | {per_question} |"
        )
    if doc.get("pairs"):
        lines += ["", "Paired differences in accuracy (points; A − B, 95 % paired bootstrap interval):", ""]
        lines += ["| A | B | Δ | 95 % CI |", "|---|---|---|---|"]
        for pair in doc["pairs"]:
            delta = pair["delta"]
            text = "–" if delta is None else f"{100 * delta:+.1f}"
            lines.append(f"| {pair['a']} | {pair['b']} | {text} | {_ci(pair['ci95'])} |")
    tr = doc["traces"]
    lines += [
        "",
        f"Trace collection: {tr['calls']} generator calls, {_wall(tr)}{'' if tr['cached_calls'] else ' s'}, "
        f"{_tokens(tr['tokens'])} tokens; "
        f"{_pct(tr['success_rate'])} % of training answers were right (the traces' success flag).",
    ]
    ratio = doc.get("combee_vs_sequential_learning") or {}
    if ratio:
        speedup = f" ({ratio['speedup']:.2f}× as fast)" if ratio["speedup"] else ""
        cached = " — from cached answers, not a timing" if _learn_cached(doc) else ""
        lines.append(
            f"Learning wall time, Combee vs sequential: {ratio['combee_learn_wall_s']:.1f} s vs "
            f"{ratio['sequential_learn_wall_s']:.1f} s = {ratio['ratio']:.2f}× of sequential{speedup}{cached}."
        )
    if doc["cached_calls"]:
        lines.append(
            f"{doc['cached_calls']} answers came from the response cache: their wall times are not model timings "
            "(a wall time marked 'replayed' or '(n of m cached)' measured the cache in whole or in part)."
        )
    earlier = doc.get("timed_in_earlier_runs") or {}
    if earlier:
        lines.append(
            "Timed in an earlier run of this command, whose answers this run replayed from the response cache "
            "(the figures shown are that run's): " + ", ".join(f"{phase} ({at})" for phase, at in earlier.items()) + "."
        )
    for phase, how in (doc.get("resumed_phases") or {}).items():
        lines.append(
            f"{phase} was resumed: its first {how['after_step']} steps were timed in an earlier run of this command "
            f"({how['first_steps_timed_at']}), which this run replayed from the response cache; the steps after "
            "them were timed in this run. Its wall time is the sum."
        )
    resumed = " (this run only)" if earlier or doc.get("resumed_phases") else ""
    lines += [
        f"Intervals: percentile bootstrap over test questions ({doc['bootstrap']['resamples']} resamples, seed "
        f"{doc['bootstrap']['seed']}); Δ is paired (same resamples). Total wall time{resumed} {doc['wall_s']:.0f} s.",
        "",
    ]
    return "\n".join(lines)


# --- plot -----------------------------------------------------------------------------------------------

_COLORS = {BASELINE: "#999999", "sequential": "#555555", "naive": "#d62728", "combee": "#1f77b4"}


def write_plot(doc: Mapping[str, Any], path: Path) -> Path:
    """``accuracy.png``: accuracy with its 95 % interval per playbook, and learning/evaluation wall time.

    Raises ImportError when matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _evaluated(doc)
    names = [m["method"] for m in rows]
    colors = [_COLORS.get(n, "#2ca02c") for n in names]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4))
    acc = [100 * (m["accuracy"] or 0.0) for m in rows]
    lo = [a - 100 * (m["ci95"][0] if m["ci95"][0] is not None else 0.0) for a, m in zip(acc, rows, strict=True)]
    hi = [100 * (m["ci95"][1] if m["ci95"][1] is not None else 0.0) - a for a, m in zip(acc, rows, strict=True)]
    labels = ["\n".join(n.split(":")) for n in names]  # combee:section-union:p1 on three lines, not over its neighbour
    ticks = [f"{label}\n{m['playbook_entries']} entries" for label, m in zip(labels, rows, strict=True)]
    ax1.bar(ticks, acc, color=colors, yerr=[lo, hi], capsize=5)
    ax1.set_ylabel("test accuracy (%) with 95 % bootstrap interval")
    ax1.set_ylim(0, 100)
    ax1.grid(True, axis="y", alpha=0.3)
    # a phase answered in whole or in part from the response cache has no model timing: no bar
    learn = [_model_wall(m["learn"]) if m["learn"] else 0.0 for m in rows]
    evals = [_model_wall(m["eval"]) for m in rows]
    xs = range(len(rows))
    ax2.bar([x - 0.2 for x in xs], learn, width=0.4, label="learning", color="#1f77b4")
    ax2.bar([x + 0.2 for x in xs], evals, width=0.4, label="evaluation", color="#ff7f0e")
    ax2.set_xticks(list(xs), labels)
    ax2.set_ylabel("wall time (s)")
    if any(m["eval"]["cached_calls"] or (m["learn"] and m["learn"]["cached_calls"]) for m in rows):
        ax2.set_title("no bar: answered in whole or in part from the response cache (no model timing)", fontsize=8)
    ax2.grid(True, axis="y", alpha=0.3)
    ax2.legend(fontsize=8)
    label = "SIMULATED model" if doc["simulated"] else f"model {doc['model']}"
    fig.suptitle(
        f"{doc['task']} — {label} — {doc['n_train']} training traces, {doc['n_test']} test questions, "
        f"batch {doc['batch_size']}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0].startswith("-"):
        sys.stderr.write("usage: python -m combee.tasks.report DIR  (DIR holds the results.json of combee task)\n")
        return 2
    out = Path(args[0])
    try:
        doc = json.loads((out / "results.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        sys.stderr.write(f"combee.tasks.report: cannot read {out / 'results.json'}: {exc}\n")
        return 1
    (out / "results.md").write_text(markdown(doc))
    try:
        write_plot(doc, out / "accuracy.png")
    except ImportError:
        sys.stderr.write(
            "combee.tasks.report: matplotlib is not installed (pip install -e '.[bench]'): no accuracy.png\n"
        )
    sys.stdout.write(f"wrote {out / 'results.md'}, {out / 'accuracy.png'}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
