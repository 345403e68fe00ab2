"""``combee bench``: the command line of the benchmark.

Wire it into ``combee``'s parser with ``add_bench_command(subparsers)``; ``python -m combee.bench`` runs the
same command on its own. With ``--out DIR`` and nothing else it runs issue #3's acceptance configuration
(500 traces, seeds 1–3, the sweep, ``auto``); ``--scale 2000`` and ``--ablations`` add the runs beyond the
paper; ``--quick`` is a smoke test for CI.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from combee.cli.base import given_options

__all__ = ["add_bench_command", "build_config", "main"]


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _methods(text: str) -> tuple[str, ...]:
    values = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = set(values) - {"naive", "combee"}
    if not values or unknown:
        raise argparse.ArgumentTypeError(f"methods are naive and/or combee, got {text!r}")
    return values


def _factors(text: str) -> tuple[float | None, ...]:
    from combee.bench.spec import parse_factor

    try:
        values = tuple(parse_factor(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not values or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct factors like 1,2,4,unlimited, got {text!r}")
    return values


def _grids(text: str) -> tuple[tuple[int, ...], ...]:
    try:
        grids = tuple(tuple(int(b) for b in part.split("/")) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected grids like 32/64/128,8/24/72, got {text!r}") from None
    if not grids or any(len(g) < 2 or min(g) < 1 for g in grids):
        raise argparse.ArgumentTypeError(f"each grid needs two or more positive sizes, got {text!r}")
    return grids


def _shapes(text: str) -> tuple[str, ...]:
    from combee.plan import SHUFFLE_KEYS

    values = tuple(part.strip() for part in text.split(",") if part.strip())
    if not values or set(values) - set(SHUFFLE_KEYS) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"shapes are among {', '.join(SHUFFLE_KEYS)}, got {text!r}")
    return values


def _shape(text: str) -> str:
    from combee.plan import SHUFFLE_KEYS

    value = text.strip()
    if value not in SHUFFLE_KEYS:
        raise argparse.ArgumentTypeError(f"one reduce shape among {', '.join(SHUFFLE_KEYS)}, got {text!r}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def configure_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the bench options to ``p``."""
    from combee.bench.spec import BenchConfig

    d = BenchConfig(out=Path("."))
    p.add_argument("--out", type=Path, required=True, help="output directory (results.json, results.md, PNGs)")
    p.add_argument("--quick", action="store_true", help="smoke test: 100 traces, 1 seed, batch 1 and 25, no auto")
    st = p.add_argument_group("streaming mode: latency of the Kafka + Faust + Redis pipeline at a steady rate")
    st.add_argument("--streaming", action="store_true", help="measure the streaming pipeline instead")
    st.add_argument("--rate", type=_non_negative, default=20.0, help="traces per second (default 20)")
    st.add_argument("--duration", type=_non_negative, default=60.0, help="seconds of publishing (default 60)")
    st.add_argument("--namespaces", type=int, default=2, help="namespaces sharing the rate (default 2)")
    g = p.add_argument_group("what to run (defaults: the acceptance configuration of issue #3)")
    g.add_argument("--traces", type=int, help=f"traces per seed (default {d.n_traces})")
    g.add_argument("--seeds", type=_ints, help=f"comma-separated trace-set seeds (default {_csv(d.seeds)})")
    g.add_argument(
        "--batch-sizes", type=_ints, help=f"fixed batch sizes (default {_csv(d.batch_sizes)}; 1 = sequential)"
    )
    g.add_argument("--methods", type=_methods, help="naive,combee (default both)")
    g.add_argument("--no-auto", action="store_true", help="skip Combee with the batch-size controller")
    g.add_argument("--no-sweep", action="store_true", help="skip the sweep (run only --ablations / --scale)")
    g.add_argument("--ablations", action="store_true", help="add p ∈ {1,2,3} and k ∈ {√n/2, √n, 2√n} at batch 100")
    g.add_argument(
        "--scale", type=int, metavar="N", help="add one Combee window over N traces (and sequential on them)"
    )
    g.add_argument("--scale-seeds", type=_ints, help="seeds of the --scale runs (default 1)")
    g.add_argument("--scale-time-scale", type=_non_negative, help="time scale of the --scale runs (own simulator)")
    s = p.add_argument_group("simulator and machine")
    from combee.sim.serving import PROFILE_NAMES

    s.add_argument(
        "--profile",
        choices=PROFILE_NAMES,
        help=f"serving profile of the simulator, recorded in results.json (default {d.profile}; docs/simulator.md)",
    )
    s.add_argument(
        "--auto-grids",
        type=_grids,
        help="the controller's profiling grids, one auto run each, e.g. 32/64/128,8/24/72 (default 32/64/128)",
    )
    s.add_argument("--rpm", type=int, dest="rpm", help="requests per minute of the api profile (default 5,000)")
    s.add_argument("--tpm", type=int, dest="tpm", help="tokens per minute of the api profile (default 2,000,000)")
    s.add_argument(
        "--shapes",
        type=_shapes,
        help="reduce shapes of the Combee runs: none (the paper's), section (keyed shuffle by section, merges "
        "within a section), section-union (keyed, no merge call); default none",
    )
    s.add_argument(
        "--ps",
        type=_ints,
        help="duplication factors p of the Combee runs at fixed batch sizes, e.g. 1,2 (default: each reduce "
        "shape's own, combee.plan.DEFAULT_P: 2 for none and section, 1 for section-union)",
    )
    s.add_argument(
        "--auto-shape",
        type=_shape,
        help=f"reduce shape of the controller's (auto) runs (default {d.auto_shape}, as in combee learn and the "
        "workers)",
    )
    s.add_argument(
        "--labels",
        help=f"how the simulated reflector labels a lesson's section: consistent (its own section), random:N (one "
        f"of N sections per trace) or free (a label per trace); recorded in results.json (default {d.labels}; "
        "docs/simulator.md)",
    )
    s.add_argument(
        "--merge-factors",
        type=_factors,
        help="merge capacity factors to compare, e.g. 1,2,4,unlimited (default 1: a merge overloads like a "
        "curator call); Combee runs once per factor, sequential and naive once",
    )
    g.add_argument(
        "--corroborate",
        type=int,
        help="distinct traces every run's lessons need before they go live (combee/corroborate.py; default 1: off)",
    )
    g.add_argument("--trace-cap", type=int, help="new bullets one trace may source per window (default: no cap)")
    g.add_argument(
        "--harmful-tags",
        type=int,
        help="reflections of one window that must tag an established bullet harmful before it counts (default 2)",
    )
    s.add_argument("--time-scale", type=_non_negative, help=f"simulator delay multiplier (default {d.time_scale})")
    s.add_argument("--base-url", help="use a running Combee simulator (its time_scale is read from it)")
    s.add_argument("--world", help=f"simulated world (default {d.world})")
    s.add_argument("--test-n", type=int, help=f"held-out tasks per seed (default {d.test_n})")
    s.add_argument("--sim-seed", type=int, help=f"simulator seed (default {d.sim_seed})")
    s.add_argument("--workers", type=int, help="worker processes of the shared phase (default: up to 8)")
    s.add_argument(
        "--shared-max-width", type=int, help=f"widest run allowed to share the machine (default {d.shared_max_width})"
    )
    return p


def _csv(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


def build_config(args: argparse.Namespace) -> Any:
    """The :class:`~combee.bench.spec.BenchConfig` the parsed options describe (explicit options win over --quick)."""
    from combee.bench.spec import BenchConfig, quick_config

    config = BenchConfig(out=args.out)
    if args.quick:
        config = quick_config(config)
    mapping = {
        "traces": "n_traces",
        "seeds": "seeds",
        "batch_sizes": "batch_sizes",
        "methods": "methods",
        "scale": "scale_traces",
        "scale_seeds": "scale_seeds",
        "scale_time_scale": "scale_time_scale",
        "time_scale": "time_scale",
        "profile": "profile",
        "merge_factors": "merge_factors",
        "shapes": "shuffle_keys",
        "ps": "ps",
        "auto_shape": "auto_shape",
        "auto_grids": "auto_grids",
        "labels": "labels",
        "corroborate": "corroborate",
        "trace_cap": "trace_cap",
        "harmful_tags": "harmful_tags",
        "rpm": "requests_per_minute",
        "tpm": "tokens_per_minute",
        "base_url": "base_url",
        "world": "world",
        "test_n": "test_n",
        "sim_seed": "sim_seed",
        "workers": "workers",
        "shared_max_width": "shared_max_width",
    }
    overrides: dict[str, Any] = given_options(args, mapping)
    if args.no_auto:
        overrides["auto"] = False
    if args.no_sweep:
        overrides["sweep"] = False
    if args.ablations:
        overrides["ablations"] = True
    return replace(config, **overrides)


def cmd_streaming(args: argparse.Namespace) -> int:
    from combee.bench.streaming import StreamingConfig, run_streaming_bench

    config = StreamingConfig(
        rate=args.rate,
        duration_s=args.duration,
        namespaces=args.namespaces,
        time_scale=args.time_scale if args.time_scale is not None else StreamingConfig.time_scale,
        out=args.out,
    )
    result = run_streaming_bench(config)
    print((args.out / "streaming.md").read_text())
    return 0 if result["target_p95_overhead_le_1s"] else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from combee.bench.run import run_bench
    from combee.sim.world import WORLDS

    if args.streaming:
        return cmd_streaming(args)
    try:
        config = build_config(args)
    except ValueError as exc:
        sys.stderr.write(f"combee bench: error: {exc}\n")
        return 2
    if config.world not in WORLDS:
        sys.stderr.write(f"combee bench: error: unknown world {config.world!r} ({', '.join(sorted(WORLDS))})\n")
        return 2
    try:
        result = run_bench(config)
    except ValueError as exc:
        sys.stderr.write(f"combee bench: error: {exc}\n")
        return 2
    doc = result.document
    print((result.out / "results.md").read_text())
    failed = [r["key"] for r in doc["runs"] if r.get("error")]
    return 1 if failed else 0


def add_bench_command(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``bench`` on ``combee``'s subparsers (``sub = parser.add_subparsers(...)``)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="benchmark methods side by side on a SIMULATED trace set (results.json, table, plots)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure_parser(p)
    p.set_defaults(func=cmd_bench)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m combee.bench``: the same command without the rest of ``combee``."""
    parser = argparse.ArgumentParser(
        prog="python -m combee.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    configure_parser(parser)
    args = parser.parse_args(argv)
    return cmd_bench(args)
