"""The finance task data (Formula, FiNER), read where it lives, never copied.

The files are the folder ``finance/data`` of the ACE repository (:data:`DATA_SOURCE`); a checkout finds them at
``$COMBEE_FINANCE_DATA``, else at ``../shared/data/ace-agent-ace/finance/data`` beside it. Each row of the
JSON-lines files is ``{"context": <the full prompt text>, "target": <the answer string>}``.

A :class:`Question` is one row with a stable id (``<file stem>:<line>``), so a report can name the exact rows it
used. Rows are chosen by :func:`pick`, seeded, so a re-run with the
same seed answers the same questions in the same order.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from combee.errors import ConfigError

__all__ = ["DATA_ENV", "DATA_SOURCE", "TASKS", "Question", "TaskSpec", "default_data_dir", "load_questions", "pick"]

DATA_ENV = "COMBEE_FINANCE_DATA"
# Where a user gets the files (Apache-2.0 repository; the FiNER rows derive from FiNER-139, CC-BY-SA-4.0).
DATA_SOURCE = "https://github.com/ace-agent/ace (folder finance/data, or eval/finance/data in newer commits)"


def default_data_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """``$COMBEE_FINANCE_DATA``, else ``../shared/data/ace-agent-ace/finance/data`` next to this repository."""
    if environ.get(DATA_ENV):
        return Path(environ[DATA_ENV])
    repo = Path(__file__).resolve().parents[2]
    return repo.parent / "shared" / "data" / "ace-agent-ace" / "finance" / "data"


@dataclass(frozen=True)
class TaskSpec:
    """One finance task: its name (also the playbook's namespace) and the files it trains and tests on."""

    name: str
    train_file: str
    test_file: str
    note: str = ""


TASKS: dict[str, TaskSpec] = {
    "formula": TaskSpec("formula", "formula_train_subset_500.jsonl", "formula_test.jsonl"),
    # The upstream FiNER training file (1,000 rows) is not in ../shared (SOURCES.md: over the snapshot store's
    # size limit), so FiNER trains on the 500-row validation split; the test split is never trained on.
    "finer": TaskSpec(
        "finer",
        "finer_val_batched_500_samples.jsonl",
        "finer_test_subset_006_seed42.jsonl",
        note="FiNER trains on the validation split (the upstream training file is not available here)",
    ),
}


@dataclass(frozen=True)
class Question:
    id: str
    context: str
    target: str


def load_questions(path: Path) -> list[Question]:
    """Every row of one data file, in file order. Raises ConfigError naming the file and line of a bad row."""
    if not path.is_file():
        raise ConfigError(
            f"data file not found: {path}. The finance data comes from {DATA_SOURCE}: download that folder and"
            f" point {DATA_ENV} (or combee task --data-dir) at it"
        )
    stem = path.name.removesuffix(".jsonl")
    out: list[Question] = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                context, target = row["context"], row["target"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ConfigError(f"{path}:{number}: not a {{context, target}} row ({type(exc).__name__})") from None
            if not isinstance(context, str) or not isinstance(target, str | int | float):
                raise ConfigError(f"{path}:{number}: 'context' must be a string and 'target' a string or number")
            out.append(Question(id=f"{stem}:{number}", context=context, target=str(target)))
    return out


def pick(questions: Sequence[Question], n: int, seed: int, salt: str) -> list[Question]:
    """``n`` distinct questions drawn by a RNG seeded from ``(seed, salt)``, in the drawn order.

    Raises ConfigError when the file holds fewer than ``n`` questions.
    """
    if n < 1:
        raise ConfigError(f"need at least one question, asked for {n}")
    if n > len(questions):
        raise ConfigError(f"asked for {n} questions but the file holds {len(questions)}")
    rng = random.Random(f"{seed}:{salt}")
    return [questions[i] for i in rng.sample(range(len(questions)), n)]
