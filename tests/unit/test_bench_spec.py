"""The benchmark's run plan, its command-line options and the plan checks of a run (no HTTP)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from combee.bench.spec import UNBOUNDED_GROUP, BenchConfig, RunSpec, is_shared, plan_runs
from combee.bench.worker import plan_checks
from combee.cli.bench import build_config, configure_parser
from combee.learner import IterationRecord, LearnResult
from combee.models import Playbook


def parse(*argv: str) -> argparse.Namespace:
    return configure_parser(argparse.ArgumentParser()).parse_args(["--out", "x", *argv])


def test_default_plan_is_the_acceptance_sweep() -> None:
    runs = plan_runs(BenchConfig(out=Path("x")))
    assert len(runs) == 3 * (1 + 5 + 5 + 1)
    seed1 = [r for r in runs if r.seed == 1]
    assert [(r.method, r.batch_size) for r in seed1] == [
        ("sequential", 1),
        *[("naive", b) for b in (5, 10, 20, 50, 100)],
        *[("combee", b) for b in (5, 10, 20, 50, 100)],
        ("combee", "auto"),
    ]
    assert all(r.n_traces == 500 and r.kind == "sweep" for r in runs)
    assert len({r.key for r in runs}) == len(runs)


def test_narrow_runs_share_the_machine_and_wide_runs_run_alone() -> None:
    config = BenchConfig(out=Path("x"))
    shared = {(r.method, r.batch_size) for r in plan_runs(config) if is_shared(r, config)}
    assert shared == {("sequential", 1), *((m, b) for m in ("naive", "combee") for b in (5, 10, 20))}
    assert RunSpec("combee", "auto", 1, 500).width == 256


def test_ablations_and_scale_runs() -> None:
    config = BenchConfig(out=Path("x"), sweep=False, ablations=True, seeds=(1,), scale_traces=2000, scale_seeds=(2,))
    runs = plan_runs(config)
    ablations = [r for r in runs if r.kind == "ablation"]
    assert {(r.method, r.p, r.group_factor) for r in ablations} == {
        ("sequential", 2, 1.0), ("combee", 2, 1.0), ("combee", 1, 1.0), ("combee", 3, 1.0),
        ("combee", 2, 0.5), ("combee", 2, 2.0),
    }  # fmt: skip
    assert all(r.max_group_items == UNBOUNDED_GROUP for r in ablations if r.group_factor != 1.0)
    scale = [r for r in runs if r.kind == "scale"]
    assert [(r.method, r.batch_size, r.seed, r.n_traces) for r in scale] == [
        ("sequential", 1, 2, 2000),
        ("combee", 2000, 2, 2000),
    ]


def test_cli_defaults_quick_and_overrides() -> None:
    assert build_config(parse()) == BenchConfig(out=Path("x"))
    quick = build_config(parse("--quick"))
    assert quick.quick and quick.n_traces == 100 and quick.seeds == (1,) and quick.batch_sizes == (1, 25)
    assert build_config(parse("--quick", "--traces", "60")).n_traces == 60
    config = build_config(parse("--seeds", "4,5", "--batch-sizes", "1,50", "--no-auto", "--ablations", "--scale",
                                "2000", "--scale-time-scale", "0.02", "--methods", "combee"))  # fmt: skip
    assert config.seeds == (4, 5) and config.batch_sizes == (1, 50) and not config.auto and config.ablations
    assert config.scale_traces == 2000 and config.scale_time_scale == 0.02 and config.methods == ("combee",)


def test_the_controller_runs_with_the_shipped_reduce_shape_whatever_the_order_of_shapes() -> None:
    shapes = ("none", "section-union")
    auto = [r for r in plan_runs(BenchConfig(out=Path("x"), shuffle_keys=shapes)) if r.batch_size == "auto"]
    assert auto and {r.shuffle_key for r in auto} == {"section-union"}  # the workers' default, not shapes[0]
    config = build_config(parse("--shapes", "section-union,none", "--auto-shape", "none"))
    assert {r.shuffle_key for r in plan_runs(config) if r.batch_size == "auto"} == {"none"}


def test_the_reflectors_labelling_is_an_option_that_reaches_every_runs_simulator() -> None:
    from combee.bench.run import run_sim_config

    assert BenchConfig(out=Path("x")).labels == "consistent"
    config = build_config(parse("--labels", "random:6", "--quick"))
    assert config.labels == "random:6"
    assert {run_sim_config(r, config).labels for r in plan_runs(config)} == {"random:6"}
    with pytest.raises(ValueError, match="labels"):
        build_config(parse("--labels", "sometimes"))


@pytest.mark.parametrize(
    "bad",
    [["--seeds", "0"], ["--methods", "gepa"], ["--time-scale", "-1"], ["--auto-shape", "none,section"]],
)
def test_cli_rejects_bad_values(bad: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse(*bad)


def _record(reflections: int, window_id: str, group_calls: int, merge_calls: int) -> IterationRecord:
    return IterationRecord(window_id=window_id, epoch=0, batch_size=reflections, reflections=reflections, wall_s=1.0,
                           critical_path_s=1.0, llm_calls=0, group_calls=group_calls, merge_calls=merge_calls, ops=0,
                           playbook_version=1, playbook_entries=0)  # fmt: skip


def test_plan_checks_recompute_the_tree_of_a_large_window() -> None:
    spec = RunSpec("combee", 2000, 1, 2000, kind="scale")
    result = LearnResult(Playbook(namespace="bench"), [_record(2000, "bench/file:e0/0-1999", 167, 17)], None, 1.0)  # type: ignore[arg-type]
    checks = plan_checks(spec, result)
    assert checks["max_group_items_seen"] <= 24 and checks["max_fan_in_seen"] <= 12
    assert checks["planned_group_calls"] == 167  # ⌈2·2000 / 24⌉ groups instead of ⌊√2000⌋ = 44
    assert checks["max_tree_depth"] == 4 and checks["planned_merge_calls"] == 14 + 2 + 1
    assert checks["calls_cover_plan"] is True


def test_plan_checks_of_the_paper_scheme() -> None:
    spec = RunSpec("combee", 100, 1, 500)
    result = LearnResult(Playbook(namespace="bench"), [_record(100, "bench/file:e0/0-99", 10, 1)], None, 1.0)  # type: ignore[arg-type]
    checks = plan_checks(spec, result)
    assert checks["max_level1_groups"] == 10 and checks["max_tree_depth"] == 2 and checks["max_fan_in_seen"] == 10
    assert checks["max_group_items_seen"] == 20


def test_sent_checks_read_the_reduce_shape_from_the_requests_sent() -> None:
    from combee.bench.worker import SentCall, sent_checks
    from combee.llm import Role

    R, C, M = Role.REFLECTOR, Role.CURATOR, Role.MERGER
    calls = [
        # window 1: map, 3 curator calls at once, 1 merge level
        SentCall(R, 0, 0.0, 1.0),
        SentCall(R, 0, 0.0, 1.0),
        SentCall(C, 10, 1.0, 2.0),
        SentCall(C, 10, 1.0, 2.5),
        SentCall(C, 8, 1.1, 2.2),
        SentCall(M, 9, 2.5, 3.0),
        # window 2: two merge levels
        SentCall(R, 0, 3.0, 4.0),
        SentCall(C, 12, 4.0, 5.0),
        SentCall(C, 12, 4.0, 5.0),
        SentCall(M, 6, 5.0, 6.0),
        SentCall(M, 7, 5.0, 6.0),
        SentCall(M, 4, 6.0, 7.0),
    ]
    checks = sent_checks(calls)
    assert checks["max_items_per_curator_call"] == 12 and checks["max_proposals_per_merge_call"] == 9
    assert checks["curator_calls_sent"] == 5 and checks["merge_calls_sent"] == 4
    assert checks["max_depth_sent"] == 3
    sequential = [SentCall(role, 1 if role is C else 0, float(i), i + 0.5) for i, role in enumerate([R, C] * 5)]
    assert sent_checks(sequential)["max_depth_sent"] == 1
