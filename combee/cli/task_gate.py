"""``combee task gate``: the validation gate's evaluation and decision for one candidate playbook against a live
one, outside the stream (issue 24, item 5).

The same functions the owning worker runs under the ``gate`` policy (docs/promotion.md): the generator role
answers every validation task once with each playbook (:func:`combee.gate.evaluate`), each answer is graded by the
task's grader, and :func:`combee.gate.decide_gate` takes the decision from the paired test, as it would for a
candidate pending over the live version. Use it to try a candidate (or a validation set, or a margin) before
turning the gate on, or to measure the gate with a real model.

The validation tasks are ``--validation FILE`` (JSON lines, the format of docs/promotion.md), or ``--n-val N``
questions of the Formula validation split (``formula_val_subset_300.jsonl``: never a training question of
``combee task formula``), graded by the Formula task's numeric rule (or by ``--grader``: ``judge`` has the
LLM judge grade them). Writes ``gate.json`` (both sides' grades
task by task, the pair counts, the comparison and the decision) and ``gate.md`` into ``--out``; the generator's
answers are cached under ``--out/cache/gate``, so a rerun replays them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from combee.cli.base import CliError
from combee.cli.task_setup import display_url, is_simulator, open_endpoint, timing_journal

__all__ = ["FORMULA_VAL_FILE", "cmd_gate", "formula_validation"]

FORMULA_VAL_FILE = "formula_val_subset_300.jsonl"
PHASE = "gate"


def formula_validation(n: int, seed: int, data_dir: Path | None, grader: str | None = None) -> tuple[Any, ...]:
    """``n`` Formula validation questions drawn with ``seed``, as gate tasks graded by the Formula rule (or by
    ``grader``, e.g. ``judge``, with no parameters)."""
    from combee.errors import ConfigError
    from combee.tasks.data import default_data_dir, load_questions, pick
    from combee.validation import ValidationTask

    try:
        questions = pick(load_questions((data_dir or default_data_dir()) / FORMULA_VAL_FILE), n, seed, "val")
    except ConfigError as exc:
        raise CliError(str(exc), code=2) from None
    name, params = (grader, {}) if grader else ("numeric", {"rule": "formula"})
    return tuple(ValidationTask(q.id, q.context, q.target, name, params) for q in questions)


def _tasks(args: argparse.Namespace) -> tuple[Any, ...]:
    from combee.errors import ConfigError
    from combee.graders import grader_names
    from combee.validation import parse_validation

    if args.grader is not None and args.grader not in grader_names():
        raise CliError(f"unknown grader {args.grader!r}; one of {', '.join(grader_names())}", code=2)
    if args.validation is None:
        return formula_validation(args.n_val, args.seed, args.data_dir, args.grader)
    try:
        text = args.validation.read_text()
        return parse_validation(text, default_grader=args.grader or "exact", source=str(args.validation))
    except OSError as exc:
        raise CliError(f"cannot read the validation set {args.validation} ({exc.strerror})", code=2) from None
    except ConfigError as exc:
        raise CliError(str(exc), code=2) from None


def _playbook(path: Path, what: str) -> Any:
    from combee.models import Playbook

    try:
        return Playbook.model_validate_json(path.read_text())
    except OSError as exc:
        raise CliError(f"cannot read the {what} playbook {path} ({exc.strerror})", code=2) from None
    except ValueError as exc:
        raise CliError(f"{path} is not a playbook JSON file ({str(exc).splitlines()[0]})", code=2) from None


def _rule(args: argparse.Namespace, settings: Any) -> Any:
    from combee.promotion import GateRule

    return GateRule(
        margin=args.margin if args.margin is not None else settings.promotion_gate_margin,
        min_pairs=args.min_pairs or settings.promotion_gate_min_pairs,
        alpha=settings.promotion_alpha,
        concurrency=settings.llm_max_concurrency,
    )


async def _run(args: argparse.Namespace, err: TextIO) -> dict[str, Any]:
    from combee.gate import decide_gate, grade_both, pair_scores, too_few_tasks
    from combee.llm import Role
    from combee.serving import Serving
    from combee.tasks.run import MeteredLLM, PhaseStats, with_timing

    candidate, live = _playbook(args.candidate, "candidate"), _playbook(args.live, "live")
    if candidate.namespace != live.namespace:
        raise CliError(f"the playbooks are of two namespaces: {candidate.namespace!r} and {live.namespace!r}")
    # the candidate is pending over the live version, as in the stream: one version number above it at least
    cand_version = max(candidate.version, live.version + 1)
    tasks = _tasks(args)
    async with contextlib.AsyncExitStack() as stack:
        settings, cards, llm_for, cache_root = await open_endpoint(args, stack, err)
        rule = _rule(args, settings)
        if (why := too_few_tasks(len(tasks), rule)) is not None:
            raise CliError(f"{why} (--n-val, --validation or --min-pairs)", code=2)
        timed, _, on_phase, _ = timing_journal(args.out, enabled=cache_root is not None)
        stats = PhaseStats()
        err.write(f"combee task gate: {len(tasks)} tasks x 2 playbooks at {display_url(settings.openai_base_url)}\n")
        t0 = time.monotonic()
        async with llm_for(PHASE) as llm:
            grades = await grade_both(MeteredLLM(llm, stats), tasks, candidate, live, concurrency=rule.concurrency)
        pairs = pair_scores(*grades)
        stats.wall_s = time.monotonic() - t0
    if (earlier := timed.get(PHASE)) is not None:
        stats = with_timing(stats, earlier[0], earlier[1])
    on_phase(PHASE, stats)
    serving = Serving(policy="gate", live=live.version)
    source = str(args.validation) if args.validation else f"{FORMULA_VAL_FILE} (n {len(tasks)}, seed {args.seed})"
    decision = decide_gate(serving, cand_version, pairs, rule, at=time.time(), validation={"source": source})
    return {
        "simulated": is_simulator(cards) or (stats.calls > 0 and stats.simulated == stats.calls),
        "model": settings.model_for(Role.GENERATOR),
        "endpoint": display_url(settings.openai_base_url),
        "candidate": {"file": str(args.candidate), "bullets": len(candidate.bullets), "version": cand_version},
        "live": {"file": str(args.live), "bullets": len(live.bullets), "version": live.version},
        "rule": {"margin": rule.margin, "min_pairs": rule.min_pairs, "alpha": rule.alpha},
        "decision": _decision(decision),
        "tasks": [
            {"id": t.id, "truth": t.truth, "candidate": _grade(c), "live": _grade(b)}
            for t, c, b in zip(tasks, grades[0], grades[1], strict=True)
        ],
        "phase": stats.as_dict(),
        "machine": {"cores": os.cpu_count(), "loadavg_end": os.getloadavg()},
    }


def _decision(decision: Any) -> dict[str, Any] | None:
    if decision is None:
        return None
    evidence = decision.evidence
    return {"action": decision.action, "reason": decision.reason, "serve": decision.serve, "evidence": evidence}


def _grade(score: Any) -> dict[str, Any] | None:
    return None if score is None else {"score": score.value, "success": score.success}


def _percent(side: dict[str, Any]) -> str:
    n, success = side["n"], side["success"]
    return f"{success}/{n} ({100 * success / n:.1f} %)" if n else "0/0"


def markdown(doc: dict[str, Any]) -> str:
    """``gate.md``: the two sides, the pair counts, the test and the decision."""
    decision = doc["decision"]
    label = " — SIMULATED model" if doc["simulated"] else ""
    lines = [f"# Gate evaluation{label}", "", f"Model `{doc['model']}` at {doc['endpoint']}.", ""]
    if decision is None:
        return "\n".join([*lines, "No decision (too few tasks answered).", ""])
    ev = decision["evidence"]
    cmp, pairs = ev["comparison"], ev["pairs"]
    lines += [
        "| side | playbook | bullets | right | unanswered |",
        "|---|---|---|---|---|",
        f"| candidate v{doc['candidate']['version']} | `{doc['candidate']['file']}` | {doc['candidate']['bullets']} "
        f"| {_percent(ev['candidate'])} | {ev['candidate']['unanswered']} |",
        f"| live v{doc['live']['version']} | `{doc['live']['file']}` | {doc['live']['bullets']} "
        f"| {_percent(ev['baseline'])} | {ev['baseline']['unanswered']} |",
        "",
        f"Pairs: both right {pairs['both']}, only the candidate {pairs['candidate_only']}, only live "
        f"{pairs['baseline_only']}, neither {pairs['neither']}.",
        "",
        f"Paired test (margin {cmp['margin']}, alpha {cmp['alpha']}): {cmp['verdict']}; difference "
        f"{cmp['difference']}, one-sided bounds [{cmp['lower']}, {cmp['upper']}].",
        "",
        f"**Decision: {decision['action']}** — {decision['reason']}",
        "",
    ]
    return "\n".join(lines)


def cmd_gate(args: argparse.Namespace) -> int:
    if args.candidate is None or args.live is None:
        raise CliError("combee task gate needs --candidate FILE and --live FILE (playbook JSON files)", code=2)
    started = time.monotonic()
    doc = asyncio.run(_run(args, sys.stderr))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gate.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    (args.out / "gate.md").write_text(markdown(doc))
    sys.stdout.write(markdown(doc))
    sys.stdout.write(f"wrote {args.out / 'gate.json'}, gate.md ({time.monotonic() - started:.0f} s)\n")
    return 0
