"""``combee task redteam``: the red-team suite (:mod:`combee.tasks.redteam`) against a real or simulated model.

Writes ``redteam.json``, ``redteam.md`` and ``playbook.json`` / ``playbook.md`` (the final playbook) into
``--out``. The method is the project's default (``method_config(Settings(), "combee")``: the default reduce
shape, screen and guard on) over windows of the default batch size (``COMBEE_BS_DEFAULT``) unless
``--batch-size`` says otherwise. ``--sim`` is SIMULATED: the simulator does not read trace text as a model does,
so only a real model's run is a verdict.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from combee.cli.base import CliError, Progress
from combee.cli.task_setup import display_url, is_simulator, open_endpoint, timing_journal
from combee.wiring import build_near_duplicates, method_config

__all__ = ["DEFAULT_TRACES", "cmd_redteam"]

# The 64 Formula traces the real local model answered (docs/results/overload-formula64)
DEFAULT_TRACES = Path(__file__).resolve().parents[2] / "docs" / "results" / "overload-formula64" / "traces.jsonl"
DEFAULT_GENUINE = 24


def _genuine(path: Path) -> list[Any]:
    from combee.models import Trace

    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        return [Trace.model_validate_json(line) for line in lines]
    except OSError as exc:
        raise CliError(f"cannot read the genuine traces {path} ({exc}); give them with --traces", code=2) from None
    except ValueError as exc:
        raise CliError(f"{path} is not a JSON-lines trace file ({str(exc).splitlines()[0]})", code=2) from None


async def _run(args: argparse.Namespace, err: TextIO) -> dict[str, Any]:
    from combee.llm import Role
    from combee.tasks.redteam import RedTeamConfig, pick_genuine, run_redteam
    from combee.tasks.redteam_cases import all_cases
    from combee.tasks.redteam_report import document

    traces = args.traces or DEFAULT_TRACES
    genuine = pick_genuine(_genuine(traces), args.n_genuine or DEFAULT_GENUINE, args.seed)
    async with contextlib.AsyncExitStack() as stack:
        settings, cards, llm_for, cache_root = await open_endpoint(args, stack, err)
        dedup = build_near_duplicates(settings, log=None if args.quiet else lambda m: err.write(f"combee task: {m}\n"))
        method = method_config(settings, "combee")
        batch = args.batch_size or settings.bs_default
        config = RedTeamConfig(
            genuine, all_cases(), method, batch, seed=args.seed, dedup=dedup, producers=args.producers or 0
        )
        timed, _, on_phase, _ = timing_journal(args.out, enabled=cache_root is not None)
        try:
            result = await run_redteam(
                config, llm_for, progress=lambda label: Progress(label, err, quiet=args.quiet), timed=timed,
                on_phase=on_phase,
            )  # fmt: skip
        except ValueError as exc:
            raise CliError(str(exc)) from None
    stats = result.phases["learn"]
    meta = {
        "suite": "red-team (issue 25, item 5)",
        "simulated": is_simulator(cards) or (stats.calls > 0 and stats.simulated == stats.calls),
        "model": settings.model_for(Role.CURATOR),
        "endpoint": display_url(settings.openai_base_url),
        "seed": args.seed,
        "method": f"{method.method.value}, reduce shape {method.shuffle_key}, p {method.p}, screen "
        f"{'on' if method.screen else 'off'}, guard on, corroboration min_traces {method.corroboration.min_traces}, "
        f"harmful tags {method.corroboration.harmful_tags}",
        "batch": batch,
        "producers": (
            f"{args.producers} genuine producers and one attacker (a namespace that requires signed traces)"
            if args.producers
            else "none named (unsigned traces)"
        ),
        "windows": result.windows,
        "genuine_source": str(traces),
        "genuine_ids": [t.trace_id for t in genuine],
        "order": [t.trace_id for t in result.traces],
        "pending_at_end": result.pending,
        "guard_quarantined": dict(result.meter.quarantined),
        "held": dict(result.meter.held),  # what corroboration held back, by reason (combee.corroborate.HELD_REASONS)
        "dedup": f"{dedup.embedder.name} at cosine {dedup.threshold}" if dedup else None,
        "phase": stats.as_dict(),
        "machine": {"cores": os.cpu_count(), "loadavg_end": os.getloadavg()},
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in sorted(vars(args).items()) if k != "func"},
    }
    from combee.screen import REASONS

    refused = {reason: result.meter.refused.get(reason, 0) for reason in REASONS}
    doc = document(
        config.cases, result.seeded, result.playbook, result.quarantined, meta["genuine_ids"], refused, meta,
        screened=result.screened, harmful=result.harmful,
    )  # fmt: skip
    _write(args.out, result, doc)
    return doc


def _write(out: Path, result: Any, doc: dict[str, Any]) -> None:
    from combee.playbook import render_prompt
    from combee.tasks.redteam_report import markdown

    out.mkdir(parents=True, exist_ok=True)
    (out / "redteam.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    (out / "redteam.md").write_text(markdown(doc))
    (out / "playbook.json").write_text(result.playbook.model_dump_json(indent=2) + "\n")
    (out / "playbook.md").write_text(render_prompt(result.playbook))
    with (out / "traces.jsonl").open("w") as fh:
        for trace in result.traces:
            fh.write(trace.model_dump_json(exclude_none=True) + "\n")


def cmd_redteam(args: argparse.Namespace) -> int:
    import asyncio

    started = time.monotonic()
    doc = asyncio.run(_run(args, sys.stderr))
    sys.stdout.write((args.out / "redteam.md").read_text())
    sys.stdout.write(
        f"wrote {args.out / 'redteam.json'}, redteam.md, playbook.json, playbook.md, traces.jsonl "
        f"({time.monotonic() - started:.0f} s)" + (" — SIMULATED model\n" if doc["simulated"] else "\n")
    )
    return 0
