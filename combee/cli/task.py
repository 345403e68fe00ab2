"""``combee task formula|finer``: the paper's finance tasks with any OpenAI-compatible model (``combee task
redteam``, the red-team suite, is :mod:`combee.cli.task_redteam`).

The agent (generator role) answers the training questions with the empty playbook; the graded answers become
traces; sequential, naive (one batch) and Combee (one batch, or ``--batch-size``) learn those same traces
offline; the empty playbook and every learned one answer the same held-out test questions. Writes
``results.json``, ``results.md``, ``accuracy.png``, ``traces.jsonl`` (what ``combee learn`` reads),
``playbooks/`` and ``answers/`` (every raw answer, graded) into ``--out``.

The default endpoint is the local model of ``python -m deploy.llm up`` (``http://127.0.0.1:8090/v1``, model
``local``) unless ``--base-url``/``--model`` or ``OPENAI_BASE_URL``/``COMBEE_MODEL`` say otherwise. ``--sim``
runs the same command against the Combee simulator in this process (SIMULATED answers; for CI).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from combee.cli.base import CliError, Progress, positive_int
from combee.cli.task_setup import (
    LOCAL_BASE_URL,
    LOCAL_MODEL,
    display_url,
    is_simulator,
    open_endpoint,
    probe_models,
    timing_journal,
)
from combee.tasks.data import DATA_ENV, default_data_dir
from combee.wiring import build_near_duplicates, method_config

__all__ = ["add_task_command", "configure_parser", "display_url", "probe_models"]

FULL = (60, 100)  # the acceptance size: >= 60 training traces, >= 100 test questions
QUICK = (4, 5)  # 569 s measured on the local 1.5B model on 2 cores, alone (docs/benchmarks-history.md)
METHODS = ("sequential", "naive", "combee")
NO_LEARNING = "none"  # --methods none: only the empty playbook is evaluated


def _variant(name: str) -> tuple[str, str | None, int | None]:
    """``combee:SHAPE[:pN]`` -> ("combee", SHAPE, N); a plain method -> (method, None, None). Raises ValueError."""
    from combee.plan import SHUFFLE_KEYS

    method, *rest = name.split(":")
    if method not in METHODS or (rest and method != "combee") or len(rest) > 2:
        raise ValueError(name)
    shape = rest[0] if rest else None
    if shape is not None and shape not in SHUFFLE_KEYS:
        raise ValueError(name)
    p = None
    if len(rest) == 2:
        if not (rest[1].startswith("p") and rest[1][1:].isdigit() and int(rest[1][1:]) >= 1):
            raise ValueError(name)
        p = int(rest[1][1:])
    return method, shape, p


def _methods(text: str) -> tuple[str, ...]:
    values = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if values == (NO_LEARNING,):
        return ()
    try:
        for v in values:
            _variant(v)
    except ValueError:
        values = ()
    if not values:
        raise argparse.ArgumentTypeError(
            f"methods are {', '.join(METHODS)}, combee:SHAPE[:pN] (SHAPE: none, section, section-union), or "
            f"{NO_LEARNING!r} alone; got {text!r}"
        )
    return values


def _batches(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"batch sizes are positive integers, comma-separated; got {text!r}")
    return values


def configure_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument(
        "task",
        choices=["formula", "finer", "redteam", "gate"],
        help="a finance task, redteam (the red-team suite), or gate (the validation gate on two playbooks)",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument(
        "--quick", action="store_true", help=f"{QUICK[0]} training / {QUICK[1]} test questions (explicit sizes win)"
    )
    p.add_argument("--n-train", type=positive_int, help=f"training questions → traces (default {FULL[0]})")
    p.add_argument("--n-test", type=positive_int, help=f"held-out test questions (default {FULL[1]})")
    p.add_argument("--batch-size", type=positive_int, help="batch of naive and Combee (default: all traces)")
    p.add_argument(
        "--methods",
        type=_methods,
        default=METHODS,
        help="what learns, in order: sequential, naive, combee (the configured shape), combee:SHAPE[:pN] "
        "(another reduce shape or duplication factor), or 'none' (evaluate only the empty playbook); "
        "default sequential,naive,combee",
    )
    p.add_argument(
        "--overload",
        action="store_true",
        help="the context-overload experiment instead: reflect the training traces once, reduce the same "
        "reflections with naive batching at --naive-batches, Combee's shapes and sequential (overload.json)",
    )
    p.add_argument(
        "--naive-batches",
        type=_batches,
        default=(8, 16, 32, 64),
        help="with --overload: naive batch sizes (default 8,16,32,64; the number of traces is added)",
    )
    p.add_argument(
        "--skip",
        type=lambda text: tuple(n.strip() for n in text.split(",") if n.strip()),
        default=(),
        metavar="VARIANTS",
        help="with --overload: variants left out, by name (e.g. sequential, combee-section-b64); recorded in "
        "overload.json's options",
    )
    p.add_argument(
        "--reflections-from",
        type=Path,
        metavar="DIR",
        help="with --overload: reduce the traces and reflections an earlier --overload run wrote into DIR (same "
        "--n-train and --seed) instead of answering and reflecting anew",
    )
    p.add_argument(
        "--n-genuine", type=positive_int, help="with redteam: genuine Formula traces mixed with the attacks (24)"
    )
    p.add_argument("--traces", type=Path, help="with redteam: the genuine traces (default: the committed 64)")
    p.add_argument(
        "--producers", type=positive_int, metavar="N",
        help="with redteam: the genuine traces come from N producers and every attack from one, 'attacker' (a "
        "namespace that requires signed traces, the attacker holding one key); default: no trace names a producer",
    )  # fmt: skip
    g = p.add_argument_group("gate (combee task gate)")
    g.add_argument("--candidate", type=Path, help="the candidate playbook (JSON, as playbooks/ or prompt show --json)")
    g.add_argument("--live", type=Path, help="the live playbook it must not be worse than")
    g.add_argument("--validation", type=Path, help="validation tasks, JSON lines (docs/promotion.md)")
    g.add_argument("--n-val", type=positive_int, default=40, help="without --validation: Formula validation questions")
    g.add_argument(
        "--grader",
        help="the grader of validation lines naming none (exact), or of the --n-val questions (the Formula rule)",
    )
    g.add_argument("--margin", type=float, help="the paired test's margin (default COMBEE_PROMOTION_GATE_MARGIN)")
    g.add_argument("--min-pairs", type=positive_int, help="fewest tasks (default COMBEE_PROMOTION_GATE_MIN_PAIRS)")
    p.add_argument("--seed", type=int, default=0, help="which rows are drawn, and the bootstrap's seed")
    p.add_argument(
        "--data-dir",
        type=Path,
        help=f"the finance data, the folder finance/data of github.com/ace-agent/ace (default ${DATA_ENV} or "
        "../shared/data/ace-agent-ace/finance/data)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    g = p.add_argument_group("LLM endpoint")
    g.add_argument("--base-url", help=f"OpenAI-compatible base URL (default $OPENAI_BASE_URL or {LOCAL_BASE_URL})")
    g.add_argument("--model", help=f"model for every role (default $COMBEE_MODEL or {LOCAL_MODEL!r})")
    g.add_argument("--llm-concurrency", type=positive_int, default=None, help="requests in flight (default 4)")
    g.add_argument("--llm-timeout", type=float, help="seconds per request (default 600: a CPU model queues)")
    g.add_argument("--cache-dir", type=Path, help="response cache root (default OUT/cache; one subdir per phase)")
    g.add_argument("--no-cache", action="store_true", help="no response cache")
    g.add_argument("--sim", action="store_true", help="use the Combee simulator in this process (SIMULATED)")
    g.add_argument("--sim-time-scale", type=float, default=0.01, help="simulated delay multiplier (with --sim)")
    return p


def add_task_command(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``task`` on ``combee``'s subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "task",
        help="the finance tasks (Formula, FiNER) with a real or simulated model: accuracy per method",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure_parser(p)
    p.set_defaults(func=cmd_task)
    return p


def _learn_configs(settings: Any, methods: Sequence[str], batch: int) -> dict[str, Any]:
    from dataclasses import replace

    from combee.learner import LearnConfig

    configs = {}
    for name in methods:
        method, shape, p = _variant(name)
        config = method_config(settings, method)
        if shape is not None:  # at the shape's own p unless COMBEE_P sets one
            config = replace(config, shuffle_key=shape, p=settings.p or 0)
        if p is not None:
            config = replace(config, p=p)
        configs[name] = LearnConfig(method=config, batch_size=1 if method == "sequential" else batch)
    return configs


def _write_outputs(out: Path, result: Any, doc: Mapping[str, Any]) -> None:
    from combee.playbook import render_prompt
    from combee.tasks.report import markdown, write_plot

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "results.md").write_text(markdown(doc))
    with (out / "traces.jsonl").open("w") as fh:
        for trace in result.traces:
            fh.write(trace.model_dump_json(exclude_none=True) + "\n")
    (out / "playbooks").mkdir(exist_ok=True)
    for name, playbook in result.playbooks.items():
        (out / "playbooks" / f"{name}.json").write_text(playbook.model_dump_json(indent=2) + "\n")
        (out / "playbooks" / f"{name}.md").write_text(render_prompt(playbook))
    (out / "answers").mkdir(exist_ok=True)
    for name, attempts in [("traces", result.train_attempts), *result.evals.items()]:
        with (out / "answers" / f"{name}.jsonl").open("w") as fh:
            for a in attempts:
                fh.write(json.dumps(a.record(), ensure_ascii=False) + "\n")
    try:
        write_plot(doc, out / "accuracy.png")
    except ImportError:
        sys.stderr.write("combee task: matplotlib is not installed (pip install -e '.[bench]'): no accuracy.png\n")


async def _run(args: argparse.Namespace, err: TextIO) -> dict[str, Any]:
    from combee.llm import Role
    from combee.quality import bloat
    from combee.tasks.data import TASKS, load_questions, pick
    from combee.tasks.overload import same_rule
    from combee.tasks.report import document
    from combee.tasks.run import HarnessConfig, run_harness

    if args.reflections_from and not args.overload:
        raise CliError("--reflections-from is an option of --overload")
    spec = TASKS[args.task]
    data_dir = args.data_dir or default_data_dir()
    n_train = args.n_train or (QUICK[0] if args.quick else FULL[0])
    n_test = args.n_test or (QUICK[1] if args.quick else FULL[1])
    train = pick(load_questions(data_dir / spec.train_file), n_train, args.seed, "train")
    test = pick(load_questions(data_dir / spec.test_file), n_test, args.seed, "test")
    batch = args.batch_size or n_train
    recorded = _recorded(args.reflections_from, train) if args.reflections_from else None  # before any model starts

    async with contextlib.AsyncExitStack() as stack:
        settings, cards, llm_for, cache_root = await open_endpoint(args, stack, err)
        endpoint = display_url(settings.openai_base_url)
        # the de-duplicator `combee learn` and the workers use (COMBEE_EMBEDDINGS), so the harness measures them
        dedup = build_near_duplicates(settings, log=None if args.quiet else lambda m: err.write(f"combee task: {m}\n"))
        if args.overload:
            return await _run_overload(args, spec, train, recorded, settings, cards, llm_for, dedup, err)
        config = HarnessConfig(
            task=spec.name,
            train=train,
            test=test,
            methods=_learn_configs(settings, args.methods, batch),
            concurrency=settings.llm_max_concurrency,
            dedup=dedup,
        )
        load_start = os.getloadavg()
        timed, steps, on_phase, on_step = timing_journal(args.out, enabled=cache_root is not None)
        result = await run_harness(
            config, llm_for, progress=lambda label: Progress(label, err, quiet=args.quiet), timed=timed,
            on_phase=on_phase, steps=steps, on_step=on_step,
        )  # fmt: skip
        load_end = os.getloadavg()
        sizes = {name: bloat(pb, await same_rule(dedup, pb)).as_dict() for name, pb in result.playbooks.items()}

    answers = sum(s.calls for s in result.phases.values())
    simulated_answers = sum(s.simulated for s in result.phases.values())
    combee = method_config(settings, "combee")  # the p and corroboration the settings resolve to
    meta = {
        "task": spec.name,
        "simulated": is_simulator(cards) or (answers > 0 and simulated_answers == answers),
        "model": settings.model_for(Role.GENERATOR),
        "models": {role.value: model for role, model in settings.models().items()},
        "endpoint": endpoint,
        "endpoint_models": [{"id": c.get("id"), "owned_by": c.get("owned_by")} for c in cards],
        "seed": args.seed,
        "batch_size": batch,
        "data": {"dir": str(data_dir), "train_file": spec.train_file, "test_file": spec.test_file, "note": spec.note},
        "grading": _grading(spec.name),
        "method_config": {
            "p": combee.p,
            "max_group_items": settings.max_group_items,
            "max_fan_in": settings.max_fan_in,
            "reduce_shape": settings.reduce_shape,
            "token_budget": settings.token_budget,
            "dedup": {"embedder": dedup.embedder.name, "threshold": dedup.threshold} if dedup else None,
            "corroboration": dataclasses.asdict(combee.corroboration),
        },
        "llm": {
            "concurrency": settings.llm_max_concurrency,
            "timeout_s": settings.llm_timeout_s,
            "structured_output": settings.structured_output,
            "cache": str(cache_root) if cache_root else None,
        },
        "machine": {"cores": os.cpu_count(), "loadavg_start": load_start, "loadavg_end": load_end},
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in sorted(vars(args).items()) if k != "func"},
        "lessons_rule": f"{dedup.embedder.name} at cosine {dedup.threshold}" if dedup else "exact normalised text",
    }
    doc = document(result, meta, seed=args.seed, sizes=sizes)
    _write_outputs(args.out, result, doc)
    return doc


def _recorded(folder: Path, train: Sequence[Any]) -> Any:
    """The traces and reflections an earlier --overload run wrote into ``folder``, checked against ``train``."""
    from combee.tasks.overload import check_recorded, load_recorded

    try:
        recorded = load_recorded(folder)
        check_recorded(recorded, train)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return recorded


async def _run_overload(
    args: argparse.Namespace,
    spec: Any,
    train: Sequence[Any],
    recorded: Any,
    settings: Any,
    cards: Sequence[Mapping[str, Any]],
    llm_for: Any,
    dedup: Any,
    err: TextIO,
) -> dict[str, Any]:
    from combee.llm import Role
    from combee.tasks.overload import OverloadConfig, default_variants, run_overload, without
    from combee.tasks.overload_report import document

    base = method_config(settings, "combee")
    try:
        variants = without(default_variants(base, len(train), args.naive_batches), args.skip)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    config = OverloadConfig(
        task=spec.name,
        train=train,
        variants=variants,
        reflect_config=base,
        concurrency=settings.llm_max_concurrency,
        dedup=dedup,
        recorded=recorded,
    )
    load_start = os.getloadavg()
    timed, _, on_phase, _ = timing_journal(args.out, enabled=not args.no_cache)
    result = await run_overload(
        config, llm_for, progress=lambda label: Progress(label, err, quiet=args.quiet), timed=timed,
        on_phase=on_phase,
    )  # fmt: skip
    answers = sum(s.calls for s in result.phases.values())
    simulated_answers = sum(s.simulated for s in result.phases.values())
    meta = {
        "task": spec.name,
        "simulated": is_simulator(cards) or (answers > 0 and simulated_answers == answers),
        "model": settings.model_for(Role.CURATOR),
        "endpoint": display_url(settings.openai_base_url),
        "seed": args.seed,
        "method_config": {
            "p": base.p,
            "max_group_items": base.max_group_items,
            "max_fan_in": base.max_fan_in,
            "sections": list(base.sections),
            "section_threshold": base.section_threshold,
            "screen": base.screen,
            "corroboration": dataclasses.asdict(base.corroboration),
        },
        "dedup": f"{dedup.embedder.name} at cosine {dedup.threshold}" if dedup else None,
        "machine": {"cores": os.cpu_count(), "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in sorted(vars(args).items()) if k != "func"},
    }
    doc = document(result, meta)
    _write_overload(args.out, result, doc)
    return doc


def _write_overload(out: Path, result: Any, doc: Mapping[str, Any]) -> None:
    from combee.playbook import render_prompt
    from combee.tasks.overload_report import markdown, write_plot

    out.mkdir(parents=True, exist_ok=True)
    (out / "overload.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "overload.md").write_text(markdown(doc))
    with (out / "traces.jsonl").open("w") as fh:
        for trace in result.traces:
            fh.write(trace.model_dump_json(exclude_none=True) + "\n")
    with (out / "reflections.jsonl").open("w") as fh:
        for trace, reflection in zip(result.traces, result.reflections, strict=True):
            body = reflection.model_dump(mode="json") if reflection is not None else None
            fh.write(json.dumps({"trace_id": trace.trace_id, "reflection": body}, ensure_ascii=False) + "\n")
    (out / "playbooks").mkdir(exist_ok=True)
    for v in result.variants:
        name = f"overload-{v.variant.name}"
        (out / "playbooks" / f"{name}.json").write_text(v.playbook.model_dump_json(indent=2) + "\n")
        (out / "playbooks" / f"{name}.md").write_text(render_prompt(v.playbook))
    try:
        write_plot(doc, out / "overload.png")
    except ImportError:
        sys.stderr.write("combee task: matplotlib is not installed (pip install -e '.[bench]'): no overload.png\n")


def _grading(task: str) -> dict[str, str]:
    if task == "formula":
        return {
            "accuracy": "remove , $ % and whitespace; '(x)' is -x; round both to 2 decimals (half up); equal; "
            "non-numbers: equal strings",
            "upstream_accuracy": "remove ','; float(pred) == float(target); non-numbers: equal strings",
            "success": "accuracy rule",
        }
    return {
        "accuracy": "label-level: split on ',', lower/strip, position by position (numbers as numbers), "
        "short answers padded, long ones truncated",
        "upstream_accuracy": "the same (upstream reports label-level accuracy)",
        "success": "all 4 labels right (sample-level)",
    }


def cmd_task(args: argparse.Namespace) -> int:
    if args.task == "redteam":
        from combee.cli.task_redteam import cmd_redteam

        return cmd_redteam(args)
    if args.task == "gate":
        from combee.cli.task_gate import cmd_gate

        return cmd_gate(args)
    started = time.monotonic()
    doc = asyncio.run(_run(args, sys.stderr))
    if args.overload:
        sys.stdout.write((args.out / "overload.md").read_text())
        sys.stdout.write(
            f"wrote {args.out / 'overload.json'}, overload.md, overload.png, traces.jsonl, reflections.jsonl, "
            f"playbooks/ ({time.monotonic() - started:.0f} s)" + (" — SIMULATED model\n" if doc["simulated"] else "\n")
        )
        return 0
    sys.stdout.write((args.out / "results.md").read_text())
    sys.stdout.write(
        f"wrote {args.out / 'results.json'}, results.md, accuracy.png, traces.jsonl, playbooks/, answers/ "
        f"({time.monotonic() - started:.0f} s)" + (" — SIMULATED model\n" if doc["simulated"] else "\n")
    )
    return 0
