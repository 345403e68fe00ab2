"""The Markdown report of a benchmark: the results, merge-factor and controller tables, and the whole page
(pure: dicts in, text out)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from combee.bench.report import (
    RETENTION,
    Run,
    aggregate,
    calibration,
    median,
    paired_values,
    ratio_of,
    sequential_runs,
    successful_runs,
)
from combee.bench.spec import factor_label

__all__ = ["controller_table", "factor_table", "markdown", "results_table"]


def _fmt(value: Any, spec: str = "{:.1f}") -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and value.is_integer() and spec == "{:g}":
        return str(int(value))
    return spec.format(value)


def _label(row: Mapping[str, Any]) -> str:
    if row["method"] == "sequential":
        return "sequential"
    extra = []
    if row["p"] != 2:
        extra.append(f"p={row['p']}")
    if row["group_factor"] != 1.0:
        extra.append(f"k={row['group_factor']:g}·√n")
    if row["max_group_items"] not in (24, None) and row["group_factor"] == 1.0:
        extra.append("no group bound")
    if row["method"] == "combee" and row.get("shuffle_key", "none") != "none":
        extra.append(f"shape {row['shuffle_key']}")
    if row["method"] == "combee" and row.get("merge_factor", 1.0) != 1.0:
        factor = row.get("merge_factor")
        extra.append(f"merge factor {'unlimited' if factor is None else f'{factor:g}'}")
    return row["method"] + (f" ({', '.join(extra)})" if extra else "")


def _speedups(runs: Sequence[Run]) -> dict[str, tuple[float | None, float | None]]:
    """Median per-seed speed-up over sequential (wall, critical path) of every configuration."""
    out: dict[str, tuple[float | None, float | None]] = {}
    by_config: dict[str, dict[int, Run]] = {}
    for r in runs:
        by_config.setdefault(r["config_key"], {})[r["seed"]] = r
    for key, members in by_config.items():
        n = next(iter(members.values()))["n_traces"]
        seq = sequential_runs(runs, n)
        out[key] = (
            median(paired_values(seq, members, ratio_of("wall_s"))),
            median(paired_values(seq, members, ratio_of("critical_path_s"))),
        )
    return out


def results_table(runs: Iterable[Run], kinds: tuple[str, ...] = ("sweep",)) -> str:
    """The main Markdown table: one row per configuration, medians over seeds."""
    ok_runs = successful_runs(runs)
    speed = _speedups(ok_runs)
    rows = [row for row in aggregate(ok_runs) if row["kind"] in kinds]
    head = (
        "| method | batch | n | seeds | wall s | crit. path s | wall/cp | speed-up (wall) | speed-up (cp) "
        "| LLM calls | tokens | entries | lessons | bullets/lesson | playbook tokens | retention "
        "| retention at seq. size | retention at 2,000 tokens | sim accuracy |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for row in rows:
        sw, sc = speed.get(row["config_key"], (None, None))
        lines.append(
            f"| {_label(row)} | {row['batch_size']} | {row['n_traces']} | {len(row['seeds'])} "
            f"| {_fmt(row['wall_s'])} | {_fmt(row['critical_path_s'])} | {_fmt(row['overhead_ratio'], '{:.3f}')} "
            f"| {_fmt(sw, '{:.1f}×')} | {_fmt(sc, '{:.1f}×')} | {_fmt(row['llm_calls'], '{:g}')} "
            f"| {_fmt(row['total_tokens'] / 1e6 if row['total_tokens'] else None, '{:.2f} M')} "
            f"| {_fmt(row['playbook_entries'], '{:g}')} | {_size_cells(row)} | {_retention_cells(row)} "
            f"| {_fmt(row['sim_accuracy'] * 100 if row['sim_accuracy'] is not None else None, '{:.1f} %')} |"
        )
    return head + "\n".join(lines) + "\n"


def _size_cells(row: Mapping[str, Any]) -> str:
    """Distinct lessons, bullets per lesson and playbook tokens (three cells)."""
    return (
        f"{_fmt(row.get('distinct_lessons'), '{:g}')} | {_fmt(row.get('bullets_per_lesson'), '{:.2f}')} "
        f"| {_fmt(row.get('playbook_tokens'), '{:,.0f}')}"
    )


def _retention_cells(row: Mapping[str, Any]) -> str:
    """Retention plain, at sequential's prompt size and at 2,000 tokens (three cells)."""
    return (
        f"{_fmt(row.get('insight_retention'), '{:.3f}')} | {_fmt(row.get(RETENTION), '{:.3f}')} "
        f"| {_fmt(row.get('retention_at_2000'), '{:.3f}')}"
    )


def factor_table(runs: Iterable[Run]) -> list[dict[str, Any]]:
    """Combee at each fixed batch size and merge capacity factor against sequential on the same seeds.

    Per seed: speed-up in wall time and in critical path, retention and its ratio to sequential's, total tokens
    and their ratio, the share of prompt tokens the server had cached, and wall time over critical path; then
    medians. Sequential and naive send no merge call, so one sequential run per seed serves every factor.
    """
    ok = successful_runs(runs)
    rows: list[dict[str, Any]] = []
    configs = sorted(
        {
            (r.get("merge_factor", 1.0), r.get("shuffle_key", "none"), r["batch_size"], r["n_traces"])
            for r in ok
            if r["method"] == "combee" and isinstance(r["batch_size"], int) and r["kind"] == "sweep"
        },
        key=lambda c: (math.inf if c[0] is None else c[0], c[1], c[2], c[3]),
    )
    for factor, shape, batch, n in configs:
        seq = sequential_runs(ok, n)
        comb: dict[int, Run] = {
            r["seed"]: r
            for r in ok
            if r["method"] == "combee"
            and r["batch_size"] == batch
            and r["n_traces"] == n
            and r.get("merge_factor", 1.0) == factor
            and r.get("shuffle_key", "none") == shape
            and r["kind"] == "sweep"
        }
        if not comb:
            continue

        def paired(
            f: Callable[[Run, Run], float | None], comb: Mapping[int, Run] = comb, seq: Mapping[int, Run] = seq
        ) -> Any:
            return median(paired_values(comb, seq, f))

        def own(field: str, comb: Mapping[int, Run] = comb) -> Any:
            return median(r.get(field) for r in comb.values())

        rows.append(
            {
                "merge_factor": factor,
                "shape": shape,
                "batch_size": batch,
                "n_traces": n,
                "seeds": sorted(comb),
                "speedup_wall": paired(lambda c, s: ratio_of("wall_s")(s, c)),
                "speedup_critical_path": paired(lambda c, s: ratio_of("critical_path_s")(s, c)),
                "retention": own("insight_retention"),
                "sequential_retention": median(r.get("insight_retention") for r in seq.values()),
                "retention_vs_sequential": paired(ratio_of("insight_retention")),
                "retention_at_seq_size": own(RETENTION),
                "sequential_retention_at_seq_size": median(r.get(RETENTION) for r in seq.values()),
                "retention_at_seq_size_vs_sequential": paired(ratio_of(RETENTION)),
                "retention_at_2000": own("retention_at_2000"),
                "distinct_lessons": own("distinct_lessons"),
                "bullets_per_lesson": own("bullets_per_lesson"),
                "playbook_tokens": own("playbook_tokens"),
                "sequential_playbook_tokens": median(r.get("playbook_tokens") for r in seq.values()),
                "sim_accuracy": own("sim_accuracy"),
                "total_tokens": own("total_tokens"),
                "tokens_vs_sequential": paired(ratio_of("total_tokens")),
                "cached_share": own("cached_share"),
                "sequential_cached_share": median(r.get("cached_share") for r in seq.values()),
                "wall_over_critical_path": own("overhead_ratio"),
                "sequential_wall_over_critical_path": median(r.get("overhead_ratio") for r in seq.values()),
                "wall_s": own("wall_s"),
                "critical_path_s": own("critical_path_s"),
                "sequential_wall_s": median(r.get("wall_s") for r in seq.values()),
                "max_proposals_per_merge_call": max(
                    (int((r.get("plan") or {}).get("max_proposals_per_merge_call", 0)) for r in comb.values()),
                    default=0,
                ),
            }
        )
    return rows


def controller_table(runs: Iterable[Run]) -> list[dict[str, Any]]:
    """Every ``auto`` configuration (reduce shape, merge factor, profiling grid) against the fixed Combee batch
    sizes of the same shape and factor: its choices per seed, its median wall time, and the fastest fixed size
    that keeps ≥ 0.85 × sequential's retention at sequential's prompt size (the issue-12 controller criterion:
    within 1.3× of it)."""
    ok = successful_runs(runs)
    rows: list[dict[str, Any]] = []
    autos: dict[str, list[Run]] = {}
    for r in ok:
        if r["method"] == "combee" and r["batch_size"] == "auto" and r["kind"] == "sweep":
            autos.setdefault(r["config_key"], []).append(r)
    for key, members in sorted(autos.items()):
        first = members[0]
        shape, factor, n = first.get("shuffle_key", "none"), first.get("merge_factor", 1.0), first["n_traces"]
        seq = sequential_runs(ok, n)
        good: list[tuple[float, int, float]] = []
        sizes = sorted(
            {
                r["batch_size"]
                for r in ok
                if r["method"] == "combee"
                and isinstance(r["batch_size"], int)
                and r.get("shuffle_key", "none") == shape
                and r.get("merge_factor", 1.0) == factor
                and r["n_traces"] == n
            }
        )
        for b in sizes:
            fixed = {
                r["seed"]: r
                for r in ok
                if r["method"] == "combee"
                and r["batch_size"] == b
                and r.get("shuffle_key", "none") == shape
                and r.get("merge_factor", 1.0) == factor
                and r["n_traces"] == n
            }
            ratio = median(paired_values(fixed, seq, ratio_of(RETENTION)))
            wall = median(r["wall_s"] for r in fixed.values())
            if ratio is not None and wall is not None and ratio >= 0.85:
                good.append((wall, b, ratio))
        auto_wall = median(r["wall_s"] for r in members)
        auto_ret = median(paired_values({r["seed"]: r for r in members}, seq, ratio_of(RETENTION)))
        best = min(good) if good else None
        rows.append(
            {
                "config_key": key,
                "shape": shape,
                "merge_factor": factor,
                "grid": list(first.get("auto_grid") or []),
                "chosen": [(r.get("controller") or {}).get("chosen") for r in sorted(members, key=lambda r: r["seed"])],
                "auto_wall_s": auto_wall,
                "auto_retention_vs_sequential": auto_ret,
                "best_fixed_batch": best[1] if best else None,
                "best_fixed_wall_s": best[0] if best else None,
                "wall_vs_best_fixed": auto_wall / best[0] if best and auto_wall else None,
                "fixed_sizes": sizes,
            }
        )
    return rows


def _controller_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    out = [
        "| shape | merge factor | profiling grid | chosen (per seed) | auto wall s | auto retention / seq (at seq. "
        "size) | fastest fixed b with ≥ 0.85 × seq retention (at seq. size) | its wall s | auto / it |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        factor = factor_label(row["merge_factor"])
        out.append(
            f"| {row['shape']} | {factor} | {'/'.join(str(b) for b in row['grid'])} | {row['chosen']} "
            f"| {_fmt(row['auto_wall_s'])} | {_fmt(row['auto_retention_vs_sequential'], '{:.2f}')} "
            f"| {row['best_fixed_batch'] or '–'} | {_fmt(row['best_fixed_wall_s'])} "
            f"| {_fmt(row['wall_vs_best_fixed'], '{:.2f}')} |"
        )
    return out


def _factor_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    out = [
        "| merge factor | shape | batch | speed-up (wall) | speed-up (critical path) | retention (seq) "
        "| retention / seq | at seq. size (seq) | at seq. size / seq | at 2,000 tokens | lessons | bullets/lesson "
        "| playbook tokens (seq) | tokens / seq | cached share (seq) | wall / critical path (seq) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        factor = factor_label(row["merge_factor"])
        out.append(
            f"| {factor} | {row.get('shape', 'none')} | {row['batch_size']} | {_fmt(row['speedup_wall'])}× | "
            f"{_fmt(row['speedup_critical_path'])}× | {_fmt(row['retention'], '{:.3f}')} "
            f"({_fmt(row['sequential_retention'], '{:.3f}')}) | {_fmt(row['retention_vs_sequential'], '{:.2f}')} | "
            f"{_fmt(row.get('retention_at_seq_size'), '{:.3f}')} "
            f"({_fmt(row.get('sequential_retention_at_seq_size'), '{:.3f}')}) "
            f"| {_fmt(row.get('retention_at_seq_size_vs_sequential'), '{:.2f}')} "
            f"| {_fmt(row.get('retention_at_2000'), '{:.3f}')} | {_fmt(row.get('distinct_lessons'), '{:g}')} "
            f"| {_fmt(row.get('bullets_per_lesson'), '{:.2f}')} | {_fmt(row.get('playbook_tokens'), '{:,.0f}')} "
            f"({_fmt(row.get('sequential_playbook_tokens'), '{:,.0f}')}) | "
            f"{_fmt(row['tokens_vs_sequential'], '{:.2f}')} | {_fmt(row['cached_share'], '{:.2f}')} "
            f"({_fmt(row['sequential_cached_share'], '{:.2f}')}) | {_fmt(row['wall_over_critical_path'], '{:.2f}')} "
            f"({_fmt(row['sequential_wall_over_critical_path'], '{:.2f}')}) |"
        )
    return out


def markdown(doc: Mapping[str, Any]) -> str:
    """The whole ``results.md``: provenance, main table, calibration, acceptance, ablations and scale."""
    runs = doc["runs"]
    machine = doc.get("machine", {})
    parts = [
        "# Combee benchmark — SIMULATED",
        "",
        "All numbers below come from the Combee **simulator** (a documented behaviour and latency model, "
        "not a real LLM; see docs/simulator.md).",
        "",
        f"- date: {doc.get('finished_at', '?')}; machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} "
        f"cores, Python {machine.get('python', '?')}, openai {machine.get('openai', '?')}",
        f"- serving profile `{doc.get('profile', 'unlimited')}`; merge capacity factors "
        f"{doc.get('merge_capacity_factors', [1.0])}; reflector labels `{doc.get('labels', 'consistent')}`",
        f"- traces: {doc['n_traces']} per seed (world `{doc.get('world', '?')}`), seeds {doc.get('seeds')}, "
        f"time_scale {doc['time_scale']}, bench wall time {_fmt((doc.get('bench_wall_s') or 0) / 60)} min",
        "- values are medians over seeds; speed-ups are per-seed ratios to sequential on the same traces, "
        "then the median",
        "- retention: share of the hidden insights named anywhere in the prompt; *at seq. size* / *at 2,000 tokens*: "
        "the same after cutting the playbook to sequential's prompt tokens (same seed) / to 2,000 tokens by the "
        "project's budget rule, so duplicates crowd lessons out; lessons: distinct insights the playbook names; "
        "playbook tokens: what an agent pays per call. The acceptance criteria judge retention at seq. size.",
        _load_line(doc.get("machine_load") or {}),
        "",
        "## Sweep",
        "",
        results_table(runs, ("sweep",)),
    ]
    cal = doc.get("calibration") or calibration(runs, doc["n_traces"])
    parts += ["## Calibration (naive batching vs the paper's Formula curve)", ""]
    if not cal:
        parts.append("Not applicable: the paper's curve was measured on 500 traces.")
    else:
        parts += ["| batch | paper entries | simulated entries (median) | per seed | ratio |", "|---|---|---|---|---|"]
    for row in cal:
        parts.append(
            f"| {row['batch_size']} | {row['paper_entries']} | {_fmt(row['entries'], '{:g}')} "
            f"| {', '.join(str(e) for e in row['entries_per_seed']) or '–'} | {_fmt(row['ratio'], '{:.2f}')} |"
        )
    factors = doc.get("merge_factors") or factor_table(runs)
    if factors:
        parts += [
            "",
            f"## Merge laws: Combee against sequential (serving profile `{doc.get('profile', '?')}`)",
            "",
            "A merge call shown m proposals keeps at most factor × K(m), K being the curator's overload law "
            "(factor 1: a merge overloads exactly like a curator call). SIMULATED.",
            "",
            *_factor_lines(factors),
        ]
    controllers = doc.get("controllers") or controller_table(runs)
    if controllers:
        parts += [
            "",
            "## The batch-size controller against fixed sizes (SIMULATED)",
            "",
            *_controller_lines(controllers),
        ]
    parts += ["", "## Acceptance", "", "| criterion | measured | verdict |", "|---|---|---|"]
    for c in doc.get("acceptance", []):
        check = c if isinstance(c, Mapping) else asdict(c)
        parts.append(f"| {check['criterion']} | {check['measured']} | **{check['status']}** |")
    if any(r["kind"] == "ablation" for r in runs):
        parts += ["", "## Ablations (Combee, batch 100)", "", _ablation_table(runs)]
    if any(r["kind"] == "scale" for r in runs):
        parts += ["", "## Beyond the paper: one window over the whole trace set", "", results_table(runs, ("scale",))]
        parts.append(_plan_lines(runs))
    failed = [r for r in runs if r.get("error")]
    if failed:
        parts += ["", "## Failed runs", ""] + [f"- {r['key']}: {r['error']}" for r in failed]
    return "\n".join(parts) + "\n"


def _load_line(load: Mapping[str, Any]) -> str:
    share = load.get("foreign_cpu_share")
    if share is None:
        return "- machine load during the run: not measured"
    return (
        f"- machine load during training and evaluation: this bench used {load['bench_cpu_s']:.0f} CPU-s, "
        f"other processes {load['foreign_cpu_s']:.0f} CPU-s ({share:.1%} of {load['cores']} cores over the run)"
    )


def _ablation_table(runs: Sequence[Run]) -> str:
    ok_runs = successful_runs(runs)
    rows = [
        row
        for row in aggregate(ok_runs)
        if row["method"] == "combee" and row["batch_size"] == 100 and row["kind"] in ("sweep", "ablation")
    ]
    seq = {}
    for row in aggregate(ok_runs):
        if row["method"] == "sequential":
            seq[row["n_traces"]] = row
    speed = _speedups(ok_runs)
    level1 = {r["config_key"]: r["plan"].get("max_level1_groups") for r in ok_runs if r.get("plan")}
    lines = [
        "| variant | level-1 groups | wall s | crit. path s | speed-up (wall) | tokens | entries | lessons "
        "| bullets/lesson | playbook tokens | retention | at seq. size | at 2,000 tokens | at seq. size / sequential "
        "| sim accuracy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s = seq.get(row["n_traces"])
        rel = row[RETENTION] / s[RETENTION] if s and s.get(RETENTION) and row.get(RETENTION) is not None else None
        lines.append(
            f"| {_label(row)} | {level1.get(row['config_key'], '–')} | {_fmt(row['wall_s'])} "
            f"| {_fmt(row['critical_path_s'])} | {_fmt(speed[row['config_key']][0], '{:.1f}×')} "
            f"| {_fmt(row['total_tokens'] / 1e6 if row['total_tokens'] else None, '{:.2f} M')} "
            f"| {_fmt(row['playbook_entries'], '{:g}')} | {_size_cells(row)} | {_retention_cells(row)} "
            f"| {_fmt(rel, '{:.3f}')} "
            f"| {_fmt(row['sim_accuracy'] * 100 if row['sim_accuracy'] is not None else None, '{:.1f} %')} |"
        )
    return "\n".join(lines) + "\n"


def _plan_lines(runs: Sequence[Run]) -> str:
    lines = []
    for r in successful_runs(runs):
        if r["kind"] == "scale" and r["method"] == "combee":
            plan = r["plan"]
            lines.append(
                f"- seed {r['seed']}: {plan['planned_group_calls']} group calls, {plan['planned_merge_calls']} merge "
                f"calls, depth {plan['max_tree_depth']}, largest group {plan['max_group_items_seen']} items "
                f"({plan['max_group_reflections_seen']} distinct reflections), largest fan-in "
                f"{plan['max_fan_in_seen']}; merge answers rejected by the parser: "
                f"{r['roles'].get('merger', {}).get('parse_failures', 0)}, merges passed through after failed "
                f"retries: {r['merge_fallbacks']}; time_scale {r.get('time_scale_used')}"
            )
    return "\n".join(lines) + "\n"
