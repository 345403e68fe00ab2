"""What a benchmark runs: its configuration and the plan of runs (pure; no I/O).

A *run* is one method at one batch size on one seed's trace set: :class:`RunSpec`. :func:`plan_runs` expands
a :class:`BenchConfig` into the runs of the sweep (sequential, naive and Combee at each batch size, Combee with
the controller), the optional ablations (duplication factor p; number of level-1 groups) and the optional
scale runs (one window over a large trace set, and sequential on the same traces).

Runs are split into two phases by how many calls they put in flight at once (their *width*): narrow runs
(width ≤ ``shared_max_width``, e.g. sequential with one call in flight) share the machine with each other; wide
runs (a map stage of 50+ concurrent calls) run alone, so that their wall time measures the framework and not
its neighbours. ``docs/benchmarks-history.md`` gives the measured effect of sharing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from combee.controller import DEFAULT_BS_MAX, DEFAULT_TRIAL_SIZES
from combee.corroborate import DEFAULT_HARMFUL_TAGS
from combee.plan import DEFAULT_SHUFFLE_KEY, default_p

__all__ = [
    "PAPER_FORMULA_NAIVE",
    "QUICK",
    "BenchConfig",
    "RunKind",
    "RunSpec",
    "factor_label",
    "parse_factor",
    "plan_runs",
]

RunKind = Literal["sweep", "ablation", "scale"]

PAPER_FORMULA_NAIVE: dict[int, int] = {1: 264, 5: 199, 10: 121, 20: 97, 50: 47, 100: 21}
"""Playbook entries after naive batching of 500 Formula traces, by batch size (paper, Figure 2)."""

UNBOUNDED_GROUP = 1_000_000
"""``max_group_items`` that never binds: the paper's k = factor·√n exactly (group-count ablation)."""


def factor_label(factor: float | None) -> str:
    """``1``, ``2``, ``0.5`` or ``unlimited``: a merge capacity factor as keys and tables spell it."""
    return "unlimited" if factor is None else f"{factor:g}"


def parse_factor(text: str) -> float | None:
    """A merge capacity factor from its spelling (``unlimited``/``none``/``inf`` = None). Raises ValueError."""
    text = text.strip().lower()
    if text in ("unlimited", "none", "inf"):
        return None
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise ValueError(f"a merge capacity factor must be > 0 (or 'unlimited'), got {text!r}")
    return value


@dataclass(frozen=True)
class RunSpec:
    """One training run. ``batch_size`` is a number or ``"auto"`` (the controller); sequential uses 1."""

    method: Literal["sequential", "naive", "combee"]
    batch_size: int | Literal["auto"]
    seed: int
    n_traces: int
    kind: RunKind = "sweep"
    p: int = 2
    group_factor: float = 1.0
    max_group_items: int = 24
    max_fan_in: int = 12
    auto_max: int = DEFAULT_BS_MAX
    auto_grid: tuple[int, ...] = DEFAULT_TRIAL_SIZES
    time_scale: float | None = None  # None: the bench's main time scale
    # The simulator's merge law for this run (a merge of m proposals keeps ≤ factor·K(m); None: unlimited).
    # Only Combee sends merge calls, so sequential and naive runs are planned once, at the first factor.
    merge_factor: float | None = 1.0
    shuffle_key: str = "none"  # the reduce's shape (combee.engine.SHUFFLE_KEYS): "none" is the paper's
    # corroboration (combee.corroborate): distinct traces a lesson needs, and new bullets per trace per window
    corroborate: int = 1
    trace_cap: int | None = None
    harmful_tags: int = DEFAULT_HARMFUL_TAGS  # reflections that must agree before a proven bullet counts as harmful

    @property
    def key(self) -> str:
        """A unique, file-name-safe label, e.g. ``combee-b100-p2-g1-s1-n500``."""
        parts = [self.method, f"b{self.batch_size}"]
        if self.method == "combee":
            parts += [f"p{self.p}", f"g{self.group_factor:g}"]
            if self.batch_size == "auto" and self.auto_grid != DEFAULT_TRIAL_SIZES:
                parts.append("t" + ".".join(str(b) for b in self.auto_grid))
            if self.max_group_items != 24:
                parts.append(f"m{self.max_group_items}")
            if self.max_fan_in != 12:
                parts.append(f"f{self.max_fan_in}")
            if self.shuffle_key != "none":
                parts.append(f"k{self.shuffle_key}")
            if self.merge_factor != 1.0:
                parts.append(f"mf{factor_label(self.merge_factor)}")
        if self.corroborate > 1:
            parts.append(f"c{self.corroborate}")
        if self.trace_cap is not None:
            parts.append(f"tc{self.trace_cap}")
        if self.harmful_tags != DEFAULT_HARMFUL_TAGS:
            parts.append(f"ht{self.harmful_tags}")
        parts += [f"s{self.seed}", f"n{self.n_traces}"]
        return "-".join(parts)

    @property
    def config_key(self) -> str:
        """The run's configuration without its seed: runs with the same config_key are aggregated."""
        return self.key.replace(f"-s{self.seed}-", "-")

    @property
    def width(self) -> int:
        """How many calls this run can put in flight at once (its widest map stage)."""
        if self.method == "sequential":
            return 1
        size = self.auto_max if self.batch_size == "auto" else self.batch_size
        return min(size, self.n_traces)

    @property
    def cost(self) -> float:
        """A rough relative duration (stages on the critical path), to start long runs first."""
        if self.method == "sequential":
            return 2.0 * self.n_traces
        size = 64 if self.batch_size == "auto" else self.batch_size
        iterations = math.ceil(self.n_traces / size)
        return iterations * (2.0 if self.method == "naive" else 3.0)


@dataclass(frozen=True)
class BenchConfig:
    """Everything ``combee bench`` runs. Defaults are the acceptance configuration of issue #3."""

    out: Path
    n_traces: int = 500
    seeds: tuple[int, ...] = (1, 2, 3)
    batch_sizes: tuple[int, ...] = (1, 5, 10, 20, 50, 100)
    methods: tuple[str, ...] = ("naive", "combee")
    auto: bool = True
    # the controller's profiling grids (one auto run each); by default the controller's own trial sizes
    auto_grids: tuple[tuple[int, ...], ...] = (DEFAULT_TRIAL_SIZES,)
    sweep: bool = True
    ablations: bool = False
    ablation_batch: int = 100
    scale_traces: int | None = None
    scale_seeds: tuple[int, ...] = (1,)
    scale_time_scale: float | None = None
    time_scale: float = 0.15
    # The serving profile of the simulator (combee.sim.serving.PROFILES) and the merge laws to compare; each
    # training run gets a simulator of its own with that profile and factor, so runs never share a server.
    profile: str = "gpu"
    merge_factors: tuple[float | None, ...] = (1.0,)
    shuffle_keys: tuple[str, ...] = ("none",)  # reduce shapes of the Combee runs at fixed batch sizes
    ps: tuple[int, ...] = ()  # their duplication factors; empty: each shape's own (combee.plan.DEFAULT_P)
    # the reduce shape of the controller's runs: by default the one combee learn and the workers use
    auto_shape: str = DEFAULT_SHUFFLE_KEY
    # How the simulated reflector labels sections (combee.sim.world.Behaviour.labels): consistent | random:N | free
    labels: str = "consistent"
    # corroboration of every run (combee.corroborate; 1 and None: off, the default)
    corroborate: int = 1
    trace_cap: int | None = None
    harmful_tags: int = DEFAULT_HARMFUL_TAGS
    requests_per_minute: int | None = None  # overrides of the profile's rate limits (None: the profile's)
    tokens_per_minute: int | None = None
    base_url: str | None = None
    world: str = "formula"
    test_n: int = 400
    sim_seed: int = 0
    workers: int = 0  # 0: enough for every narrow run at once (capped)
    shared_max_width: int = 20
    client_concurrency: int = 256
    sim_max_concurrency: int = 256
    eval_concurrency: int = 64
    quick: bool = False
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.n_traces < 1:
            raise ValueError("n_traces must be >= 1")
        if not self.seeds:
            raise ValueError("at least one seed is needed")
        if any(b < 1 for b in self.batch_sizes):
            raise ValueError("batch sizes must be positive")
        unknown = set(self.methods) - {"naive", "combee"}
        if unknown:
            raise ValueError(f"unknown methods {sorted(unknown)}; choose among naive, combee")
        if self.time_scale < 0 or (self.scale_time_scale is not None and self.scale_time_scale < 0):
            raise ValueError("time scales must be >= 0")
        if self.scale_traces is not None and self.scale_traces < 2:
            raise ValueError("the scale run needs at least 2 traces")
        from combee.sim.serving import PROFILES

        if self.profile not in PROFILES:
            raise ValueError(f"unknown serving profile {self.profile!r} (choose among {', '.join(PROFILES)})")
        if not self.merge_factors or len(set(self.merge_factors)) != len(self.merge_factors):
            raise ValueError("merge factors must be distinct, and at least one")
        from combee.plan import SHUFFLE_KEYS

        if not self.shuffle_keys or set(self.shuffle_keys) - set(SHUFFLE_KEYS):
            raise ValueError(f"reduce shapes are among {', '.join(SHUFFLE_KEYS)}, got {self.shuffle_keys}")
        from combee.sim.world import Behaviour

        Behaviour(labels=self.labels)  # raises ValueError for an unknown spelling
        if any(p < 1 for p in self.ps) or len(set(self.ps)) != len(self.ps):
            raise ValueError(f"duplication factors are distinct and at least 1, got {self.ps}")
        if self.auto_shape not in SHUFFLE_KEYS:
            raise ValueError(
                f"the controller's reduce shape is one of {', '.join(SHUFFLE_KEYS)}, got {self.auto_shape}"
            )

    def ps_of(self, shape: str) -> tuple[int, ...]:
        """The duplication factors of the Combee runs of reduce shape ``shape`` at fixed batch sizes."""
        return self.ps or (default_p(shape),)


QUICK = {"n_traces": 100, "seeds": (1,), "batch_sizes": (1, 25), "auto": False, "time_scale": 0.02, "test_n": 100}
"""Overrides of ``--quick``: a smoke test of the whole command in well under a minute."""


def quick_config(config: BenchConfig) -> BenchConfig:
    """``config`` with the :data:`QUICK` overrides applied."""
    return replace(config, quick=True, **QUICK)  # type: ignore[arg-type]


def plan_runs(config: BenchConfig) -> list[RunSpec]:
    """Every run of ``config``, in a stable order (sweep, ablations, scale; by seed within each)."""
    runs: list[RunSpec] = []
    n = config.n_traces
    first = config.merge_factors[0]
    if config.sweep:
        for seed in config.seeds:
            runs.append(RunSpec("sequential", 1, seed, n, merge_factor=first))
            for method in config.methods:
                for b in config.batch_sizes:
                    if b <= 1:
                        continue
                    if method != "combee":  # naive: no duplication factor to vary
                        runs.append(RunSpec(method, b, seed, n, merge_factor=first))  # type: ignore[arg-type]
                        continue
                    for p in config.ps_of("none"):
                        runs.append(RunSpec("combee", b, seed, n, merge_factor=first, p=p))
            if config.auto and "combee" in config.methods:
                for grid in config.auto_grids:
                    shape = config.auto_shape
                    runs.append(
                        RunSpec("combee", "auto", seed, n, merge_factor=first, shuffle_key=shape, auto_grid=grid,
                                p=default_p(shape))
                    )  # fmt: skip
            # the other merge laws and reduce shapes: only Combee's runs depend on them
            for factor in config.merge_factors:
                for shape in config.shuffle_keys:
                    if "combee" not in config.methods or (factor == first and shape == "none"):
                        continue
                    for b in (b for b in config.batch_sizes if b > 1):
                        for p in config.ps_of(shape):
                            runs.append(RunSpec("combee", b, seed, n, merge_factor=factor, shuffle_key=shape, p=p))
    if config.ablations:
        b = config.ablation_batch
        for seed in config.seeds:
            if not config.sweep or "combee" not in config.methods or b not in config.batch_sizes:
                runs.append(RunSpec("combee", b, seed, n, kind="ablation"))
            if not config.sweep:
                runs.append(RunSpec("sequential", 1, seed, n, kind="ablation"))
            for p in (1, 3):
                runs.append(RunSpec("combee", b, seed, n, kind="ablation", p=p))
            # The group-count ablation lifts the group-size bound, so that k = factor·√n is what runs (at
            # factor 1 the bound does not bind for n ≤ 144, so the baseline above is that point).
            for factor in (0.5, 2.0):
                runs.append(
                    RunSpec("combee", b, seed, n, kind="ablation", group_factor=factor, max_group_items=UNBOUNDED_GROUP)
                )
    if config.scale_traces is not None:
        big = config.scale_traces
        for seed in config.scale_seeds:
            runs.append(RunSpec("sequential", 1, seed, big, kind="scale", time_scale=config.scale_time_scale))
            runs.append(RunSpec("combee", big, seed, big, kind="scale", time_scale=config.scale_time_scale))
    runs = [r if r.kind == "sweep" else replace(r, merge_factor=first) for r in runs]
    runs = [
        replace(r, corroborate=config.corroborate, trace_cap=config.trace_cap, harmful_tags=config.harmful_tags)
        for r in runs
    ]
    keys = [r.key for r in runs]
    if len(keys) != len(set(keys)):  # pragma: no cover - a planning bug
        raise AssertionError("duplicate runs planned")
    return runs


def is_shared(run: RunSpec, config: BenchConfig) -> bool:
    """True when ``run`` is narrow enough to share the machine with other narrow runs."""
    return run.width <= config.shared_max_width
