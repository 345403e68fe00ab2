"""A SIMULATED trace set on disk: the traces (JSON lines), the held-out tasks and the ground truth beside them.

``combee sim traces``, ``combee demo --offline`` and the benchmark write trace sets this way; ``combee learn
--test`` reads the held-out file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["test_path", "truth_path", "write_trace_set"]


def test_path(out: Path) -> Path:
    """The held-out tasks beside the trace file ``out`` (``t.jsonl`` → ``t.test.jsonl``)."""
    return out.with_name(out.stem + ".test.jsonl")


def truth_path(out: Path) -> Path:
    """The ground truth beside the trace file ``out`` (``t.jsonl`` → ``t.truth.json``)."""
    return out.with_name(out.stem + ".truth.json")


def write_trace_set(out: Path, traces: list[dict[str, Any]], tests: Sequence[Any], truth: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as fh:
        for t in traces:
            fh.write(json.dumps(t, separators=(",", ":")) + "\n")
    with test_path(out).open("w") as fh:
        for t in tests:
            fh.write(json.dumps({"task_id": t.task_id, "namespace": t.namespace, "task": t.task,
                                 "ground_truth": t.ground_truth, "insight": t.insight}) + "\n")  # fmt: skip
    truth_path(out).write_text(json.dumps(truth, indent=1) + "\n")
