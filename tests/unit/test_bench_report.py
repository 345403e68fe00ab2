"""The benchmark's aggregation, acceptance checks and Markdown, on hand-made run records (no HTTP)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

from combee.bench.report import acceptance, aggregate, calibration, median
from combee.bench.spec import PAPER_FORMULA_NAIVE, RunSpec
from combee.bench.tables import markdown


def record(
    method: str,
    batch: int | str,
    seed: int,
    *,
    wall: float,
    cp: float | None = None,
    entries: int = 100,
    retention: float = 0.9,
    at_size: float | None = None,
    accuracy: float = 0.9,
    tokens: int = 1_000_000,
    n: int = 500,
    kind: str = "sweep",
    **knobs: Any,
) -> dict[str, Any]:
    spec = RunSpec(method, batch, seed, n, kind=kind, **knobs)  # type: ignore[arg-type]
    return {
        "key": spec.key,
        "config_key": spec.config_key,
        **asdict(spec),
        "wall_s": wall,
        "critical_path_s": cp if cp is not None else wall / 1.05,
        "llm_calls": 500,
        "prompt_tokens": tokens - tokens // 10,
        "completion_tokens": tokens // 10,
        "playbook_entries": entries,
        "insight_retention": retention,
        # at sequential's prompt size: the same as plain retention unless a test says otherwise
        "retention_at_seq_size": retention if at_size is None else at_size,
        "retention_at_2000": 0.123,
        "distinct_lessons": 80,
        "bullets_per_lesson": entries / 80,
        "playbook_tokens": 4321,
        "sim_accuracy": accuracy,
        "plan": {"max_group_items_seen": 24, "max_fan_in_seen": 10, "max_tree_depth": 2, "max_level1_groups": 10},
        "controller": {"chosen": 96} if batch == "auto" else None,
    }


def sweep(speed: float = 30.0, combee_retention: float = 0.88) -> list[dict[str, Any]]:
    """Three seeds of a sweep that meets every criterion (Combee b100 ``speed``× faster than sequential)."""
    runs = []
    for seed in (1, 2, 3):
        seq_wall = 300.0 + seed
        runs.append(record("sequential", 1, seed, wall=seq_wall, entries=PAPER_FORMULA_NAIVE[1] + seed,
                           retention=0.95, accuracy=0.91, tokens=4_000_000))  # fmt: skip
        for b in (5, 10, 20, 50, 100):
            runs.append(record("naive", b, seed, wall=seq_wall / b, entries=PAPER_FORMULA_NAIVE[b],
                               retention=0.95 if b < 50 else 0.15, tokens=1_000_000))  # fmt: skip
            runs.append(record("combee", b, seed, wall=seq_wall / (speed * b / 100), retention=combee_retention,
                               accuracy=0.90, tokens=1_200_000))  # fmt: skip
        runs.append(record("combee", "auto", seed, wall=seq_wall / speed * 1.1, retention=0.85, accuracy=0.90))
    return runs


def by_name(checks: list[Any]) -> dict[str, Any]:
    return {c.name: c for c in checks}


def test_median_ignores_missing_values() -> None:
    assert median([3.0, None, 1.0, 2.0]) == 2.0
    assert median([None]) is None


def test_aggregate_folds_seeds_into_medians_per_configuration() -> None:
    runs = [record("combee", 100, s, wall=w, entries=e) for s, w, e in ((1, 10.0, 120), (2, 14.0, 110), (3, 12.0, 130))]
    runs.append(record("combee", 100, 1, wall=99.0, p=3))  # another configuration
    rows = {row["config_key"]: row for row in aggregate(runs)}
    assert set(rows) == {"combee-b100-p2-g1-n500", "combee-b100-p3-g1-n500"}
    row = rows["combee-b100-p2-g1-n500"]
    assert row["seeds"] == [1, 2, 3]
    assert row["wall_s"] == 12.0 and row["wall_s_min"] == 10.0 and row["wall_s_max"] == 14.0
    assert row["playbook_entries"] == 120
    assert row["overhead_ratio"] == pytest.approx(1.05)
    assert row["total_tokens"] == 1_000_000


def test_failed_runs_are_left_out_of_aggregates() -> None:
    runs = [record("naive", 10, 1, wall=5.0), {**record("naive", 10, 2, wall=1.0), "error": "LLMUnavailable: down"}]
    (row,) = aggregate(runs)
    assert row["seeds"] == [1] and row["wall_s"] == 5.0


def test_calibration_compares_naive_medians_with_the_paper_curve() -> None:
    rows = {row["batch_size"]: row for row in calibration(sweep())}
    assert rows[1]["entries"] == PAPER_FORMULA_NAIVE[1] + 2  # sequential's median stands for batch 1
    assert rows[100]["ratio"] == pytest.approx(1.0)
    assert all(row["within_tolerance"] for row in rows.values())
    assert calibration(sweep(), n=100) == []  # the paper's curve is for 500 traces


def test_acceptance_passes_on_a_sweep_that_meets_every_criterion() -> None:
    checks = by_name(acceptance(sweep(), {"n_traces": 500, "bench_wall_s": 600.0, "default": True}))
    for name in ("calibration", "combee100_retention", "combee100_accuracy", "naive100_collapse", "speedup_wall",
                 "tokens", "overhead", "controller", "duration"):  # fmt: skip
        assert checks[name].status == "pass", (name, checks[name])
    assert checks["speedup_wall"].value == pytest.approx(30.0)
    assert checks["combee100_accuracy"].value == pytest.approx(-1.0)
    assert checks["scale"].status == "not run"


def test_acceptance_reports_misses_with_the_measured_number() -> None:
    checks = by_name(acceptance(sweep(speed=20.0, combee_retention=0.7), {"n_traces": 500}))
    assert checks["speedup_wall"].status == "miss" and checks["speedup_wall"].value == pytest.approx(20.0)
    assert "per seed" in checks["speedup_wall"].measured
    assert checks["combee100_retention"].status == "miss"
    assert checks["combee100_retention"].value == pytest.approx(0.7 / 0.95)
    # no fixed Combee size keeps 0.85 × sequential's retention, so the controller criterion cannot be judged
    assert checks["controller"].status == "not run"
    assert checks["duration"].status == "not run"


def test_retention_criteria_judge_retention_at_sequentials_prompt_size() -> None:
    runs = sweep()
    for r in runs:  # Combee keeps every lesson somewhere, but redundancy crowds lessons out at sequential's size
        if r["method"] == "combee":
            r["retention_at_seq_size"] = 0.5
    checks = by_name(acceptance(runs, {"n_traces": 500}))
    assert checks["combee100_retention"].status == "miss"
    assert checks["combee100_retention"].value == pytest.approx(0.5 / 0.95)
    assert "prompt size" in checks["combee100_retention"].criterion
    assert checks["controller"].status == "not run"  # no fixed size keeps 0.85 × at equal size


def test_the_shipped_shape_is_judged_at_batch_100_when_it_ran() -> None:
    from combee.plan import DEFAULT_SHUFFLE_KEY, default_p

    shipped_p = default_p(DEFAULT_SHUFFLE_KEY)
    runs = sweep()
    assert by_name(acceptance(runs, {"n_traces": 500}))["default100_retention"].status == "not run"
    other_p = [record("combee", 100, seed, wall=10.0, retention=0.95, at_size=0.9, shuffle_key=DEFAULT_SHUFFLE_KEY,
                      p=shipped_p + 1) for seed in (1, 2, 3)]  # fmt: skip
    assert by_name(acceptance(runs + other_p, {"n_traces": 500}))["default100_retention"].status == "not run"
    for seed in (1, 2, 3):
        shipped = record("combee", 100, seed, wall=10.0, retention=0.95, at_size=0.6, shuffle_key=DEFAULT_SHUFFLE_KEY,
                         p=shipped_p)  # fmt: skip
        runs.append(shipped)
    check = by_name(acceptance(runs, {"n_traces": 500}))["default100_retention"]
    assert check.status == "miss" and check.value == pytest.approx(0.6 / 0.95)
    assert DEFAULT_SHUFFLE_KEY in check.criterion
    overhead = by_name(acceptance(runs, {"n_traces": 500}))["overhead"]
    assert f"b100/{DEFAULT_SHUFFLE_KEY}/p{shipped_p}/g1" in overhead.measured  # a shape's row is named by its shape


def test_overhead_uses_the_worst_combee_configuration() -> None:
    runs = sweep()
    for r in runs:
        if r["method"] == "combee" and r["batch_size"] == 50:
            r["critical_path_s"] = r["wall_s"] / 1.2
    check = by_name(acceptance(runs, {"n_traces": 500}))["overhead"]
    assert check.status == "miss" and check.value == pytest.approx(1.2)
    assert "combee-b50-p2-g1-n500" in check.measured


def test_scale_check_needs_bounds_and_retention() -> None:
    runs = [
        record("sequential", 1, 1, wall=1000.0, n=2000, kind="scale", retention=1.0),
        record("combee", 2000, 1, wall=30.0, n=2000, kind="scale", retention=0.9),
    ]
    assert by_name(acceptance(runs, {"n_traces": 500}))["scale"].status == "pass"
    runs[1]["plan"] = {**runs[1]["plan"], "max_fan_in_seen": 13}
    assert by_name(acceptance(runs, {"n_traces": 500}))["scale"].status == "miss"


def test_markdown_is_labelled_simulated_and_has_a_row_per_configuration() -> None:
    runs = sweep()
    doc = {
        "runs": runs,
        "n_traces": 500,
        "seeds": [1, 2, 3],
        "time_scale": 0.15,
        "world": "formula",
        "acceptance": [asdict(c) for c in acceptance(runs, {"n_traces": 500})],
    }
    text = markdown(doc)
    assert "SIMULATED" in text
    assert text.count("| combee |") == 6 and text.count("| naive |") == 5 and "| sequential |" in text
    assert "30.0×" in text  # Combee b100's speed-up over sequential
    assert "| 100 | 21 | 21 |" in text  # calibration row
    # every quality figure comes with the playbook's size, and retention at equal prompt size beside plain
    assert "| 80 | 1.25 | 4,321 | 0.880 | 0.880 | 0.123 |" in text  # Combee: lessons … retention at 2,000
    assert "retention at seq. size" in text


def test_calibration_validation_reports_the_held_out_worlds_error_without_refitting() -> None:
    from combee.bench.calibration import PAPER_FINER, markdown, validate

    doc = validate(seeds=(1,), n=40, test_n=20)
    finer = doc["finer"]
    assert finer["role"].startswith("prediction")
    assert set(finer["entries"]) == {str(b) for b in PAPER_FINER["entries"]}
    for row in [*finer["entries"].values(), *finer["accuracy"].values()]:
        assert row["error"] == row["simulated"] - row["paper"]
    errors = [row["error"] for row in finer["accuracy"].values()]
    assert finer["mean_abs_accuracy_error_points"] == pytest.approx(sum(map(abs, errors)) / len(errors))
    assert "| finer | prediction" in markdown(doc)
