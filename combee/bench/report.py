"""Aggregation and acceptance checks of a benchmark (pure: dicts in, dicts out).

Input is the list of run records of ``results.json`` (one per run and seed). :func:`aggregate` folds seeds into
medians per configuration; :func:`acceptance` checks issue #3's criteria, each with the measured number,
the threshold and ``pass`` / ``miss`` / ``not run`` (:mod:`combee.bench.tables` renders them). Paired criteria
(ratios to sequential) are computed per seed on the same trace set, then the median is taken.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from combee.bench.spec import PAPER_FORMULA_NAIVE
from combee.plan import DEFAULT_SHUFFLE_KEY, default_p

__all__ = [
    "CALIBRATION_TOLERANCE",
    "RETENTION",
    "Check",
    "Run",
    "acceptance",
    "aggregate",
    "calibration",
    "median",
    "paired_values",
    "ratio_of",
    "sequential_runs",
    "successful_runs",
]

Run = Mapping[str, Any]

CALIBRATION_TOLERANCE = 0.30
RETENTION = "retention_at_seq_size"
"""The retention the criteria judge: every playbook cut to sequential's prompt size on the same traces by the
project's budget rule (combee.bench.size), so duplicates and length are charged for."""
SUMMARY_FIELDS = (
    "wall_s",
    "critical_path_s",
    "overhead_ratio",
    "llm_calls",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "playbook_entries",
    "playbook_tokens",
    "insight_retention",
    "retention_at_seq_size",
    "retention_at_2000",
    "distinct_lessons",
    "bullets_per_lesson",
    "sim_accuracy",
    "iterations",
    "client_cpu_s",
    "cached_share",
)
SPEC_FIELDS = (
    "kind",
    "method",
    "batch_size",
    "n_traces",
    "p",
    "group_factor",
    "max_group_items",
    "max_fan_in",
    "merge_factor",
    "shuffle_key",
)


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that are not None (None when there are none)."""
    present = [float(v) for v in values if v is not None]
    return statistics.median(present) if present else None


def _derived(run: Run) -> dict[str, Any]:
    out = dict(run)
    if "total_tokens" not in out and "prompt_tokens" in out:
        out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    cp = out.get("critical_path_s")
    if "overhead_ratio" not in out and cp:
        out["overhead_ratio"] = out["wall_s"] / cp
    return out


def successful_runs(runs: Iterable[Run]) -> list[dict[str, Any]]:
    return [_derived(r) for r in runs if not r.get("error")]


def aggregate(runs: Iterable[Run]) -> list[dict[str, Any]]:
    """One row per configuration (``config_key``): spec fields, seeds, and median/min/max of each metric."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in successful_runs(runs):
        groups.setdefault(run["config_key"], []).append(run)
    rows = []
    for key, members in groups.items():
        row: dict[str, Any] = {"config_key": key, **{f: members[0].get(f) for f in SPEC_FIELDS}}
        row["seeds"] = sorted(m["seed"] for m in members)
        for f in SUMMARY_FIELDS:
            values = [float(m[f]) for m in members if m.get(f) is not None]
            row[f] = median(values)
            if values:
                row[f + "_min"], row[f + "_max"] = min(values), max(values)
        rows.append(row)
    rows.sort(key=_row_order)
    return rows


_KIND_ORDER = {"sweep": 0, "ablation": 1, "scale": 2}
_METHOD_ORDER = {"sequential": 0, "naive": 1, "combee": 2}


def _row_order(row: Mapping[str, Any]) -> tuple[Any, ...]:
    b = row["batch_size"]
    return (
        _KIND_ORDER.get(row["kind"], 9),
        row["n_traces"],
        _METHOD_ORDER.get(row["method"], 9),
        b == "auto",
        b if isinstance(b, int) else 0,
        row["p"],
        row["group_factor"],
        row["max_group_items"],
        math.inf if row.get("merge_factor", 1.0) is None else row.get("merge_factor", 1.0),
    )


# --- selection helpers ----------------------------------------------------------------------------------


def _select(runs: Sequence[Run], **where: Any) -> list[Run]:
    return [r for r in runs if all(r.get(k) == v for k, v in where.items())]


def _default_knobs(run: Run, shape: str = "none") -> bool:
    # issue 3's checks are judged under the honest merge law (factor 1: a merge overloads like a curator call)
    knobs = run.get("p") == default_p(shape) and run.get("group_factor") == 1.0 and run.get("max_group_items") == 24
    return knobs and run.get("merge_factor", 1.0) == 1.0 and run.get("shuffle_key", "none") == shape


def sequential_runs(runs: Sequence[Run], n: int) -> dict[int, Run]:
    return {r["seed"]: r for r in runs if r["method"] == "sequential" and r["n_traces"] == n}


def _combee(runs: Sequence[Run], batch: int | str, n: int, shape: str = "none") -> dict[int, Run]:
    return {
        r["seed"]: r
        for r in runs
        if r["method"] == "combee" and r["batch_size"] == batch and r["n_traces"] == n and _default_knobs(r, shape)
    }


def _naive(runs: Sequence[Run], batch: int, n: int) -> dict[int, Run]:
    return {r["seed"]: r for r in runs if r["method"] == "naive" and r["batch_size"] == batch and r["n_traces"] == n}


def paired_values(a: Mapping[int, Run], b: Mapping[int, Run], f: Callable[[Run, Run], float | None]) -> list[float]:
    """``f(a[seed], b[seed])`` for every seed both sides ran (None results dropped)."""
    values = [f(a[s], b[s]) for s in sorted(set(a) & set(b))]
    return [v for v in values if v is not None]


def ratio_of(field: str) -> Callable[[Run, Run], float | None]:
    def f(x: Run, y: Run) -> float | None:
        num, den = x.get(field), y.get(field)
        if num is None or not den:
            return None
        return float(num) / float(den)

    return f


# --- acceptance -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One acceptance criterion: what was measured against what, and the verdict."""

    name: str
    criterion: str
    measured: str
    status: str  # "pass" | "miss" | "not run"
    value: float | None = None
    threshold: float | None = None
    per_seed: tuple[float, ...] = ()


def _check(
    name: str,
    criterion: str,
    values: Sequence[float],
    threshold: float,
    ok: Callable[[float], bool],
    fmt: str = "{:.3f}",
) -> Check:
    if not values:
        return Check(name, criterion, "not measured", "not run", threshold=threshold)
    value = statistics.median(values)
    seeds = ", ".join(fmt.format(v) for v in values)
    measured = f"median {fmt.format(value)} (per seed: {seeds})"
    return Check(name, criterion, measured, "pass" if ok(value) else "miss", value, threshold, tuple(values))


def calibration(runs: Iterable[Run], n: int = 500) -> list[dict[str, Any]]:
    """Naive entries (median over seeds; batch 1 is sequential) against the paper's Formula curve.

    Empty unless ``n`` is 500: the paper's curve was measured on 500 traces.
    """
    if n != 500:
        return []
    ok_runs = successful_runs(runs)
    rows = []
    for batch, paper in PAPER_FORMULA_NAIVE.items():
        members = list(sequential_runs(ok_runs, n).values()) if batch == 1 else list(_naive(ok_runs, batch, n).values())
        entries = [m["playbook_entries"] for m in members]
        value = median(entries)
        ratio = None if value is None else value / paper
        rows.append(
            {
                "batch_size": batch,
                "paper_entries": paper,
                "entries": value,
                "entries_per_seed": entries,
                "ratio": ratio,
                "within_tolerance": None if ratio is None else abs(ratio - 1.0) <= CALIBRATION_TOLERANCE,
            }
        )
    return rows


def acceptance(runs: Iterable[Run], meta: Mapping[str, Any]) -> list[Check]:
    """Issue #3's acceptance criteria on these runs. ``meta``: ``n_traces``, ``bench_wall_s``, ``default``."""
    all_runs = successful_runs(runs)
    n = int(meta.get("n_traces", 500))
    main = [r for r in all_runs if r["kind"] in ("sweep", "ablation")]
    seq = sequential_runs(main, n)
    c100 = _combee(main, 100, n)
    n100 = _naive(main, 100, n)
    checks: list[Check] = []

    cal = calibration(main, n)
    measured_cal = [row for row in cal if row["ratio"] is not None]
    if cal and len(measured_cal) == len(cal):
        worst = max(abs(row["ratio"] - 1.0) for row in cal)
        text = ", ".join(
            f"b{row['batch_size']}: {row['entries']:g}/{row['paper_entries']} = {row['ratio']:.2f}" for row in cal
        )
        status = "pass" if all(row["within_tolerance"] for row in cal) else "miss"
        checks.append(
            Check(
                "calibration",
                "naive entries within ±30 % of 264/199/121/97/47/21 (b = 1…100)",
                text,
                status,
                worst,
                CALIBRATION_TOLERANCE,
            )
        )
    else:
        checks.append(
            Check("calibration", "naive entries within ±30 % of the paper's curve", "not measured", "not run")
        )

    checks.append(
        _check(
            "combee100_retention",
            "Combee b100 retention at sequential's prompt size ≥ 0.85 × sequential's",
            paired_values(c100, seq, ratio_of(RETENTION)),
            0.85,
            lambda v: v >= 0.85,
        )
    )
    checks.append(
        _check(
            "default100_retention",
            f"Combee b100 with the shipped reduce shape ({DEFAULT_SHUFFLE_KEY}) retention at sequential's prompt "
            "size ≥ 0.85 × sequential's",
            paired_values(_combee(main, 100, n, DEFAULT_SHUFFLE_KEY), seq, ratio_of(RETENTION)),
            0.85,
            lambda v: v >= 0.85,
        )
    )

    def acc_gap(c: Run, s: Run) -> float | None:
        if c.get("sim_accuracy") is None or s.get("sim_accuracy") is None:
            return None
        return 100.0 * (float(c["sim_accuracy"]) - float(s["sim_accuracy"]))

    checks.append(
        _check(
            "combee100_accuracy",
            "Combee b100 sim_accuracy within 2 points of sequential's",
            paired_values(c100, seq, acc_gap),
            2.0,
            lambda v: abs(v) <= 2.0 + 1e-9,  # accuracies are multiples of 1/test_n: compare up to float noise
            "{:+.2f}",
        )
    )
    checks.append(
        _check(
            "naive100_collapse",
            "naive b100 retention at sequential's prompt size ≤ 0.3 × sequential's",
            paired_values(n100, seq, ratio_of(RETENTION)),
            0.3,
            lambda v: v <= 0.3,
        )
    )
    checks.append(
        _check(
            "speedup_wall",
            "sequential wall_s / Combee b100 wall_s ≥ 25",
            paired_values(seq, c100, ratio_of("wall_s")),
            25.0,
            lambda v: v >= 25.0,
            "{:.1f}",
        )
    )
    checks.append(
        _check(
            "tokens",
            "Combee b100 tokens ≤ 1.1 × sequential's",
            paired_values(c100, seq, ratio_of("total_tokens")),
            1.1,
            lambda v: v <= 1.1,
        )
    )

    # Overhead: every Combee configuration at the main time scale, on its median over seeds.
    combee_rows = [
        row for row in aggregate(main) if row["method"] == "combee" and row.get("overhead_ratio") is not None
    ]
    if combee_rows:
        worst_row = max(combee_rows, key=lambda row: row["overhead_ratio"])
        worst_run = max((r for r in main if r["method"] == "combee"), key=lambda r: r["overhead_ratio"])
        value = worst_row["overhead_ratio"]
        measured = (
            f"worst configuration {worst_row['config_key']}: median {value:.3f}; worst single run "
            f"{worst_run['key']}: {worst_run['overhead_ratio']:.3f}; configurations: "
            + ", ".join(
                f"b{row['batch_size']}"
                + (
                    ""
                    if _default_knobs(row)
                    else f"/{row.get('shuffle_key') or 'none'}/p{row['p']}/g{row['group_factor']:g}"
                )
                + f" {row['overhead_ratio']:.3f}"
                for row in combee_rows
            )
        )
        checks.append(
            Check(
                "overhead",
                "Combee runs: wall_s ≤ 1.15 × critical_path_s",
                measured,
                "pass" if value <= 1.15 else "miss",
                value,
                1.15,
            )
        )
    else:
        checks.append(Check("overhead", "Combee runs: wall_s ≤ 1.15 × critical_path_s", "not measured", "not run"))

    checks.append(_controller_check(main, n))
    checks.append(_scale_check(all_runs))

    wall = meta.get("bench_wall_s")
    if meta.get("default") and wall is not None:
        checks.append(
            Check(
                "duration",
                "default `combee bench` finishes in < 15 min",
                f"{wall / 60:.1f} min",
                "pass" if wall < 900 else "miss",
                wall,
                900.0,
            )
        )
    else:
        checks.append(
            Check("duration", "default `combee bench` finishes in < 15 min", "not the default configuration", "not run")
        )
    return checks


def _controller_check(main: Sequence[Run], n: int) -> Check:
    criterion = (
        "auto wall_s ≤ 1.3 × that of the fastest fixed Combee batch with retention at sequential's prompt size "
        "≥ 0.85 × sequential's"
    )
    seq = sequential_runs(main, n)
    auto = _combee(main, "auto", n)
    if not auto or not seq:
        return Check("controller", criterion, "not measured", "not run")
    fixed_sizes = sorted(
        {
            r["batch_size"]
            for r in main
            if r["method"] == "combee" and isinstance(r["batch_size"], int) and _default_knobs(r) and r["n_traces"] == n
        }
    )
    good: list[tuple[float, int]] = []
    for b in fixed_sizes:
        runs = _combee(main, b, n)
        ratio = median(paired_values(runs, seq, ratio_of(RETENTION)))
        wall = median(r["wall_s"] for r in runs.values())
        if ratio is not None and wall is not None and ratio >= 0.85:
            good.append((wall, b))
    if not good:
        unmet = "no fixed batch size reaches 0.85 × sequential's retention at its size"
        return Check("controller", criterion, unmet, "not run")
    best_wall, best_b = min(good)
    auto_wall = median(r["wall_s"] for r in auto.values())
    assert auto_wall is not None
    chosen = [(auto[seed].get("controller") or {}).get("chosen") for seed in sorted(auto)]
    value = auto_wall / best_wall
    measured = (
        f"auto median wall {auto_wall:.1f} s (controller chose {chosen}) vs b{best_b} {best_wall:.1f} s → {value:.2f}×"
    )
    return Check("controller", criterion, measured, "pass" if value <= 1.3 else "miss", value, 1.3)


def _scale_check(runs: Sequence[Run]) -> Check:
    criterion = (
        "one window of the scale run: within group-size and fan-in bounds, retention at sequential's prompt size "
        "≥ 0.8 × sequential's"
    )
    scale = [r for r in runs if r["kind"] == "scale"]
    windows = {r["seed"]: r for r in scale if r["method"] == "combee"}
    seq = {r["seed"]: r for r in scale if r["method"] == "sequential"}
    if not windows:
        return Check("scale", criterion, "not run (use --scale 2000)", "not run")
    bounds_ok = all(
        r["plan"]["max_group_items_seen"] <= r["max_group_items"] and r["plan"]["max_fan_in_seen"] <= r["max_fan_in"]
        for r in windows.values()
    )
    ratios = paired_values(windows, seq, ratio_of(RETENTION))
    if not ratios:
        return Check("scale", criterion, "sequential baseline missing", "not run")
    value = statistics.median(ratios)
    r0 = next(iter(windows.values()))
    measured = (
        f"n={r0['n_traces']}: largest group {r0['plan']['max_group_items_seen']} items "
        f"(bound {r0['max_group_items']}), "
        f"largest fan-in {r0['plan']['max_fan_in_seen']} (bound {r0['max_fan_in']}), depth "
        f"{r0['plan']['max_tree_depth']}; retention ratio median {value:.3f} (per seed: "
        + ", ".join(f"{v:.3f}" for v in ratios)
        + ")"
    )
    return Check(
        "scale", criterion, measured, "pass" if bounds_ok and value >= 0.8 else "miss", value, 0.8, tuple(ratios)
    )
