"""A gate's validation set: tasks with ground truth, read from JSON lines. Pure (the caller reads the file).

One JSON object per line (blank lines are skipped)::

    {"task": "What is 15% of 200?", "truth": "30", "grader": "numeric", "params": {"abs_tol": 0.01}}
    {"id": "q2", "task": "Capital of France?", "truth": "Paris"}

``task`` (the question the generator answers) and ``truth`` (a string or a number) are required; ``id``
(default ``line-N``) must be unique; ``grader`` (default: the caller's default, ``exact`` unless configured)
is one of :func:`combee.graders.grader_names`; ``params`` is an object given to that grader; ``producer``
(optional) names who the task came from, so forget rules apply to it (held-out traces carry it). Every task's
grader is built once here, so a bad name or parameter is refused when the set is loaded, not mid-evaluation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from combee.errors import ConfigError
from combee.graders import JUDGE, make_grader

__all__ = ["ValidationTask", "parse_validation", "validation_line"]

_KEYS = frozenset({"id", "task", "truth", "grader", "params", "producer"})


@dataclass(frozen=True)
class ValidationTask:
    """One task with its ground truth and the grader (by name, with parameters) that scores answers to it.
    ``producer``: for a held-out trace, the producer it names (forget rules apply to it)."""

    id: str
    task: str
    truth: str
    grader: str = "exact"
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)
    producer: str | None = None


def validation_line(task: ValidationTask) -> str:
    """``task`` as one line of a validation file (what :func:`parse_validation` reads back)."""
    record: dict[str, Any] = {"id": task.id, "task": task.task, "truth": task.truth, "grader": task.grader}
    if task.params:
        record["params"] = dict(task.params)
    if task.producer is not None:
        record["producer"] = task.producer
    return json.dumps(record, ensure_ascii=False, sort_keys=True)


def _task_of(obj: Any, line: int, default_grader: str) -> ValidationTask:
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        raise ValueError(f"unknown keys {unknown}; allowed: {sorted(_KEYS)}")
    task, truth = obj.get("task"), obj.get("truth")
    if not isinstance(task, str) or not task.strip():
        raise ValueError("'task' must be a non-empty string")
    if isinstance(truth, bool) or not isinstance(truth, str | int | float):
        raise ValueError("'truth' must be a string or a number")
    grader, params = obj.get("grader", default_grader), obj.get("params", {})
    if not isinstance(grader, str) or not isinstance(params, dict):
        raise ValueError("'grader' must be a string and 'params' an object")
    if grader == JUDGE:
        criteria = params.get("criteria", "")
        if set(params) - {"criteria"} or not isinstance(criteria, str):
            raise ValueError("the judge grader takes one parameter, 'criteria' (a string)")
    else:
        make_grader(grader, params)  # refuse a bad name or parameter now
    ident, producer = obj.get("id", f"line-{line}"), obj.get("producer")
    if not isinstance(ident, str | int) or isinstance(ident, bool):
        raise ValueError("'id' must be a string or a number")
    if producer is not None and not isinstance(producer, str):
        raise ValueError("'producer' must be a string")
    return ValidationTask(str(ident), task, str(truth), grader, params, producer)


def parse_validation(
    text: str, *, default_grader: str = "exact", source: str = "validation set"
) -> tuple[ValidationTask, ...]:
    """Every task of a JSON-lines ``text``, in file order. Raises :class:`ConfigError` naming ``source`` and the
    line for a line that is not a valid task, or for a repeated id."""
    tasks: list[ValidationTask] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = _task_of(json.loads(line), number, default_grader)
        except (ValueError, ConfigError) as exc:
            raise ConfigError(f"{source}, line {number}: {exc}") from exc
        if task.id in seen:
            raise ConfigError(f"{source}, line {number}: id {task.id!r} appears twice")
        seen.add(task.id)
        tasks.append(task)
    return tuple(tasks)
