"""Calibration validated, not only fitted: the SIMULATED world's overload law is fitted on the paper's Formula curve
(naive batching, 500 traces); here it predicts FiNER's curve without refitting, and the error is reported.

The fit: :attr:`combee.sim.world.Behaviour.capacity_points` are the paper's Formula naive entries per curator call,
and the generator's accuracies (``base_accuracy``, ``informed_accuracy``) were set on Formula's sequential and
naive-100 accuracies. So reproducing Formula is true by construction (in-sample); FiNER is the out-of-sample test:
the same behaviour in the ``finer`` world (its own universe size and popularity skew), naive batching at batch 1
and 100, compared with the paper's FiNER figures (entries 246 → 11, accuracy 76.0 % → 70.6 %).

Runs in process (:class:`combee.sim.inproc.InProcessSim`, no latency), so it takes seconds::

    python -m combee.bench.calibration [--seeds 1,2,3] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from combee.bench.spec import PAPER_FORMULA_NAIVE

__all__ = ["PAPER_FINER", "PAPER_FORMULA", "main", "validate"]

PAPER_FORMULA: dict[str, dict[int, float]] = {
    "entries": {b: float(e) for b, e in PAPER_FORMULA_NAIVE.items()},
    "accuracy": {1: 87.0, 100: 72.5},
}
"""The fit target (paper, Formula, naive batching over 500 traces): entries by batch size, accuracy (%)."""

PAPER_FINER: dict[str, dict[int, float]] = {
    "entries": {1: 246.0, 100: 11.0},
    "accuracy": {1: 76.0, 100: 70.6},
}
"""The held-out target (paper, FiNER, naive batching): entries and accuracy (%) at batch 1 and 100."""


async def _naive_point(world: str, batch: int, seed: int, n: int, test_n: int) -> tuple[int, float]:
    from combee.engine import Method, MethodConfig
    from combee.learner import EvalTask, LearnConfig, evaluate, learn
    from combee.models import Trace
    from combee.sim.inproc import InProcessSim
    from combee.sim.world import Behaviour, WorldResponder, generate_traces

    traces, tests, _ = generate_traces(n, seed, namespace="bench", world=world, test_n=test_n)
    llm = InProcessSim(WorldResponder(Behaviour()))
    method = MethodConfig(method=Method.SEQUENTIAL if batch == 1 else Method.NAIVE)
    result = await learn([Trace.model_validate(t) for t in traces], llm, LearnConfig(method=method, batch_size=batch))
    tasks = [EvalTask(t.task_id, t.task, t.ground_truth) for t in tests]
    scored = await evaluate(tasks, result.playbook, llm, concurrency=64)
    return len(result.playbook.bullets), 100.0 * scored.accuracy


def _errors(predicted: dict[int, float], paper: dict[int, float]) -> dict[str, Any]:
    rows = {}
    for batch, target in sorted(paper.items()):
        value = predicted.get(batch)
        if value is None:
            continue
        rows[str(batch)] = {
            "paper": target,
            "simulated": value,
            "error": value - target,
            "relative_error": (value - target) / target if target else None,
        }
    return rows


def validate(seeds: Sequence[int] = (1, 2, 3), n: int = 500, test_n: int = 400) -> dict[str, Any]:
    """Formula (in-sample) and FiNER (held out) naive curves from the SIMULATED world, against the paper.

    Medians over ``seeds``. Returns a JSON-ready document with per-point errors and, per world, the mean
    absolute relative error of the entries and the mean absolute error of the accuracy (percentage points).
    """

    async def run() -> dict[str, Any]:
        doc: dict[str, Any] = {"simulated": True, "seeds": list(seeds), "n_traces": n, "fitted_on": "formula"}
        for world, paper in (("formula", PAPER_FORMULA), ("finer", PAPER_FINER)):
            batches = sorted(paper["entries"])
            entries: dict[int, float] = {}
            accuracy: dict[int, float] = {}
            for batch in batches:
                points = await asyncio.gather(*(_naive_point(world, batch, s, n, test_n) for s in seeds))
                entries[batch] = statistics.median(e for e, _ in points)
                if batch in paper["accuracy"]:
                    accuracy[batch] = statistics.median(a for _, a in points)
            entry_rows = _errors(entries, paper["entries"])
            accuracy_rows = _errors(accuracy, paper["accuracy"])
            doc[world] = {
                "role": "fit (in-sample)" if world == "formula" else "prediction (held out, no refit)",
                "entries": entry_rows,
                "accuracy": accuracy_rows,
                "mean_abs_relative_entry_error": statistics.fmean(
                    abs(r["relative_error"]) for r in entry_rows.values()
                ),
                "mean_abs_accuracy_error_points": statistics.fmean(abs(r["error"]) for r in accuracy_rows.values()),
            }
        return doc

    return asyncio.run(run())


def markdown(doc: dict[str, Any]) -> str:
    """The validation as a Markdown table (SIMULATED)."""
    lines = [
        "| world | role | batch | paper entries | simulated entries | error | paper accuracy | simulated accuracy "
        "| error (points) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for world in ("formula", "finer"):
        part = doc[world]
        for batch, row in part["entries"].items():
            acc = part["accuracy"].get(batch)
            acc_cells = f"{acc['paper']:.1f} % | {acc['simulated']:.1f} % | {acc['error']:+.1f}" if acc else "– | – | –"
            lines.append(
                f"| {world} | {part['role']} | {batch} | {row['paper']:g} | {row['simulated']:g} "
                f"| {row['relative_error']:+.0%} | {acc_cells} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m combee.bench.calibration", description=__doc__)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated trace-set seeds (default 1,2,3)")
    parser.add_argument("--traces", type=int, default=500, help="traces per seed (default 500, as the paper)")
    parser.add_argument("--out", type=Path, help="write the JSON document here")
    args = parser.parse_args(argv)
    seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    doc = validate(seeds, args.traces)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print("SIMULATED calibration check (fit on Formula, FiNER predicted without refitting)\n")
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
