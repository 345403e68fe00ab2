"""``combee sim serve|traces``: the SIMULATED OpenAI-compatible model, and SIMULATED trace sets."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from combee.cli.base import CliError, Parser, positive_int
from combee.models import validate_namespace
from combee.sim.traceset import test_path, truth_path, write_trace_set

__all__ = ["add_sim_command", "cmd_sim_serve", "cmd_sim_traces"]


def add_sim_command(sub: Any) -> None:
    """Register ``sim`` (with ``serve`` and ``traces``) on ``combee``'s subparsers."""
    sim = sub.add_parser("sim", help="the SIMULATED OpenAI-compatible model (no real LLM)")
    simsub = sim.add_subparsers(dest="sim_command", required=True, parser_class=Parser)
    s = simsub.add_parser("serve", help="serve the simulator over HTTP (OpenAI-compatible)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--world", default="combee", help="behaviour model: 'combee' (default) or 'none' (generic only)")
    s.add_argument("--time-scale", type=float, default=1.0, help="multiply every simulated delay (e.g. 0.05)")
    s.add_argument("--max-concurrency", type=positive_int, help="server-side slots (default: the profile's, 256)")
    s.add_argument(
        "--profile",
        choices=("unlimited", "gpu", "api", "cpu"),
        help="serving profile (default unlimited; docs/simulator.md)",
    )
    s.add_argument(
        "--merge-capacity-factor",
        help="a merge of m proposals keeps at most factor x K(m), K the curator's law (default 1; 'unlimited')",
    )
    for name, help_ in (
        ("--fault-500-rate", "share of requests answered with HTTP 500"),
        ("--fault-429-rate", "share of requests answered with HTTP 429 + Retry-After"),
        ("--fault-timeout-rate", "share of requests that hang until the client times out"),
        ("--fault-malformed-rate", "share of answers with broken or schema-violating JSON"),
    ):
        s.add_argument(name, type=float, default=0.0, help=help_)
    s.set_defaults(func=cmd_sim_serve)
    t = simsub.add_parser("traces", help="write a SIMULATED trace set, held-out tasks and ground truth")
    t.add_argument("--n", type=positive_int, required=True)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument(
        "--out",
        type=Path,
        help="the trace file (default: var/sim/NAMESPACE-WORLD-nN-sSEED.jsonl, under the current directory's var/, "
        "which git ignores); FILE.test.jsonl and FILE.truth.json are written beside it",
    )
    t.add_argument("--namespace", default="demo")
    t.add_argument("--world", default="formula")
    t.add_argument("--test-n", type=int, default=400, help="held-out tasks to write next to the traces")
    t.set_defaults(func=cmd_sim_traces)


def cmd_sim_traces(args: argparse.Namespace) -> int:
    from combee.sim.world import WORLDS, generate_traces

    validate_namespace(args.namespace)
    if args.world not in WORLDS:
        raise CliError(f"unknown world {args.world!r}; choose one of {', '.join(sorted(WORLDS))}")
    traces, tests, truth = generate_traces(args.n, args.seed, namespace=args.namespace, world=args.world,
                                           test_n=args.test_n)  # fmt: skip
    if args.out is None:  # three files: not into the current directory (a repository root) unasked
        args.out = Path("var") / "sim" / f"{args.namespace}-{args.world}-n{args.n}-s{args.seed}.jsonl"
    write_trace_set(args.out, traces, tests, truth)
    print(
        f"wrote {len(traces)} SIMULATED traces to {args.out}, {len(tests)} held-out tasks to "
        f"{test_path(args.out)} and the ground truth to {truth_path(args.out)}"
    )
    return 0


def cmd_sim_serve(args: argparse.Namespace) -> int:
    from combee.sim import runner

    argv = ["--host", args.host, "--port", str(args.port), "--seed", str(args.seed), "--world", args.world]
    argv += ["--time-scale", str(args.time_scale)]
    if args.max_concurrency is not None:
        argv += ["--max-concurrency", str(args.max_concurrency)]
    if args.profile is not None:
        argv += ["--profile", args.profile]
    if args.merge_capacity_factor is not None:
        argv += ["--merge-capacity-factor", args.merge_capacity_factor]
    for name in ("fault_500_rate", "fault_429_rate", "fault_timeout_rate", "fault_malformed_rate"):
        value = getattr(args, name)
        if value:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return runner.main(argv)
