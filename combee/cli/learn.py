"""``combee learn``: learn a playbook offline from a JSON-lines trace file; write playbook, prompt and metrics."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from combee.cli.base import (
    CliError,
    Progress,
    add_llm_options,
    add_method_options,
    batch_size,
    load_trace_file,
    positive_int,
    settings_from_args,
)
from combee.playbook import ApplyStats
from combee.redaction import endpoint_url
from combee.settings import Settings
from combee.wiring import build_llm, build_near_duplicates, method_config

__all__ = ["add_learn_command", "cmd_learn", "metrics_document"]


def add_learn_command(sub: Any) -> None:
    """Register ``learn`` on ``combee``'s subparsers."""
    p = sub.add_parser("learn", help="learn a playbook offline from a JSON-lines trace file")
    p.add_argument("--traces", type=Path, required=True, help="JSON-lines file, one trace per line")
    p.add_argument("--method", choices=["combee", "sequential", "naive"], default="combee")
    p.add_argument("--batch-size", type=batch_size, default=50, help="traces per iteration, or 'auto' (controller)")
    p.add_argument("--epochs", type=positive_int, default=1)
    p.add_argument("--namespace", help="learn into this namespace (default: the traces' own)")
    p.add_argument("--test", type=Path, help="held-out tasks (JSON lines) to evaluate the final playbook on")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_method_options(p)
    add_llm_options(p)
    p.set_defaults(func=cmd_learn)


def metrics_document(result: Any, *, method: str, settings: Settings, extra: dict[str, Any] | None = None) -> dict:
    """``metrics.json``: what ran, how long, how many calls and tokens (total and per role), the playbook."""
    from combee.playbook import playbook_tokens

    meter = result.meter
    roles = {
        role: {
            "calls": s.calls,
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens,
            "cached": s.cached,
            "parse_failures": s.parse_failures,
            "max_prompt_tokens": s.max_prompt_tokens,
            "repairs": s.repairs,
            "repaired": s.repaired,
            "gave_up": s.gave_up,
            "salvaged": s.salvaged,
            "invalid_items": s.invalid_items,
            "failure_kinds": dict(sorted(s.failure_kinds.items())),
        }
        for role, s in sorted(meter.roles.items())
    }
    doc: dict[str, Any] = {
        "method": method,
        "namespace": result.playbook.namespace,
        "batch_sizes": result.batch_sizes,
        "iterations": len(result.iterations),
        "traces": sum(result.batch_sizes),
        "wall_s": round(result.wall_s, 4),
        "critical_path_s": round(result.critical_path_s, 4),
        "llm_calls": meter.calls,
        "prompt_tokens": meter.usage.prompt_tokens,
        "completion_tokens": meter.usage.completion_tokens,
        "roles": roles,
        "playbook_entries": len(result.playbook.bullets),
        "playbook_tokens": playbook_tokens(result.playbook),
        "playbook_version": result.playbook.version,
        "simulated": bool(meter.simulated and not meter.real),
        "skipped_traces": meter.skipped_traces,
        "skipped_groups": meter.skipped_groups,
        "merge_fallbacks": meter.merge_fallbacks,
        "redundant_combines": meter.redundant_combines,
        "dedup": meter.dedup_counts(),
        "endpoint": endpoint_url(settings.openai_base_url),
        "models": {r.value: m for r, m in settings.models().items()},
        "method_config": {
            "p": method_config(settings, "combee").p,
            "max_group_items": settings.max_group_items,
            "max_fan_in": settings.max_fan_in,
            "reduce_shape": settings.reduce_shape,
        },
        "per_iteration": [
            {
                "window_id": it.window_id,
                "batch_size": it.batch_size,
                "reflections": it.reflections,
                "teaching_reflections": it.teaching,
                "llm_calls": it.llm_calls,
                "group_calls": it.group_calls,
                "merge_calls": it.merge_calls,
                "ops": it.ops,
                "wall_s": round(it.wall_s, 4),
                "critical_path_s": round(it.critical_path_s, 4),
                "playbook_entries": it.playbook_entries,
                "applied": _counted(it.applied),
                "trial": it.trial,
            }
            for it in result.iterations
        ],
        "applied": _counted(functools.reduce(ApplyStats.merge, (it.applied for it in result.iterations), ApplyStats())),
    }
    if result.decision is not None:
        doc["controller"] = result.decision.as_dict()
    if extra:
        doc.update(extra)
    return doc


def _counted(stats: ApplyStats) -> dict[str, int]:
    """The non-zero counts of an application (an op the playbook did not keep shows here: deduplicated, evicted)."""
    return {k: v for k, v in dataclasses.asdict(stats).items() if v}


async def _learn_async(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from combee.learner import LearnConfig, learn
    from combee.playbook import render_prompt

    settings = settings_from_args(args)
    traces, skipped_lines = load_trace_file(args.traces, args.namespace, err)
    namespaces = sorted({t.namespace for t in traces})
    if len(namespaces) > 1:
        raise CliError(
            f"{args.traces} holds traces of {len(namespaces)} namespaces ({', '.join(namespaces[:5])}); "
            "choose one with --namespace"
        )
    batch = 1 if args.method == "sequential" else args.batch_size
    controller = None
    if batch == "auto":
        from combee.controller import BatchSizeController

        controller = BatchSizeController(
            candidates=settings.bs_candidates, bs_min=settings.bs_min, bs_max=settings.bs_max
        )
    config = LearnConfig(
        method=method_config(settings, args.method, args.group_factor),
        batch_size=batch,
        epochs=args.epochs,
        controller=controller,
    )
    dedup = build_near_duplicates(settings, log=None if args.quiet else lambda m: err.write(f"combee: {m}\n"))
    progress = Progress(f"learning ({args.method})", err, quiet=args.quiet)
    llm = build_llm(settings)
    try:
        result = await learn(
            traces,
            llm,
            config,
            progress=lambda done, total, pb: progress.update(done, total, f"v{pb.version} {len(pb.bullets)} bullets"),
            dedup=dedup,
        )
        eval_doc: dict[str, Any] = {}
        if args.test is not None:
            eval_doc = await _evaluate_file(args.test, result.playbook, llm, err)
    finally:
        progress.close()
        await llm.aclose()
    if result.decision is not None:
        err.write(f"controller: {result.decision.explain()}\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "playbook.json").write_text(result.playbook.model_dump_json(indent=2) + "\n")
    (args.out / "prompt.md").write_text(render_prompt(result.playbook))
    doc = metrics_document(
        result,
        method=args.method,
        settings=settings,
        extra={"skipped_lines": skipped_lines, "epochs": args.epochs, "cost_usd": llm.stats.cost_usd, **eval_doc},
    )
    (args.out / "metrics.json").write_text(json.dumps(doc, indent=2) + "\n")
    label = " (SIMULATED endpoint)" if doc["simulated"] else ""
    out.write(
        f"learned {doc['playbook_entries']} bullets (version {doc['playbook_version']}) from {doc['traces']} traces "
        f"in {doc['iterations']} iterations, {doc['wall_s']:.1f}s, {doc['llm_calls']} LLM calls, "
        f"{doc['prompt_tokens'] + doc['completion_tokens']} tokens{label}\n"
        f"wrote {args.out / 'playbook.json'}, {args.out / 'prompt.md'}, {args.out / 'metrics.json'}\n"
    )
    return 0


async def _evaluate_file(path: Path, playbook: Any, llm: Any, err: TextIO) -> dict[str, Any]:
    from combee.learner import EvalTask, evaluate

    if not path.exists():
        raise CliError(f"test file not found: {path}")
    tasks = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            tasks.append(EvalTask(str(obj["task_id"]), str(obj["task"]), str(obj["ground_truth"])))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            err.write(f"combee: {path}:{number}: skipped test task: {type(exc).__name__}: {exc}\n")
    result = await evaluate(tasks, playbook, llm)
    return {"eval": {"accuracy": result.accuracy, "correct": result.correct, "total": result.total,
                     "unparsed": result.unparsed}}  # fmt: skip


def cmd_learn(args: argparse.Namespace) -> int:
    return asyncio.run(_learn_async(args, sys.stdout, sys.stderr))
