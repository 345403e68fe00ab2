"""The gate's held-out traces: a fixed share of a namespace's traces that carry ground truth, never learned from,
kept as validation tasks. Pure.

A trace is held out when it has ``feedback.ground_truth`` and ``sha256("holdout", namespace, trace id)`` read as a
number in [0, 1) is below the share (:func:`held_out`): the choice depends on nothing else, so a redelivered or
replayed trace is held out again, every worker agrees, and raising the share only adds traces. The map stage
reflects only the other traces of a window (:func:`split_holdout`) and keeps the held-out ones as tasks for the
gate (:func:`holdout_task`; ``workers/mapper.py``, ``workers/gate.py``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from combee.forget import producer_of
from combee.models import Trace
from combee.validation import ValidationTask

__all__ = ["held_out", "holdout_position", "holdout_task", "split_holdout"]


def holdout_position(namespace: str, trace_id: str) -> float:
    """A uniform number in [0, 1) fixed by (namespace, trace id); salted apart from the canary's agent arm."""
    digest = hashlib.sha256(f"holdout\x00{namespace}\x00{trace_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def held_out(trace: Trace, share: float) -> bool:
    """Whether ``trace`` is held out at ``share``: it carries ground truth and its position is below the share."""
    truth = trace.feedback.ground_truth
    return share > 0.0 and bool(truth and truth.strip()) and holdout_position(trace.namespace, trace.trace_id) < share


def holdout_task(trace: Trace, grader: str) -> ValidationTask:
    """A held-out trace as a validation task: its task, its ground truth, graded by ``grader``; its producer kept
    so that a later forget rule still applies to it."""
    truth = trace.feedback.ground_truth or ""
    return ValidationTask(f"trace:{trace.trace_id}", trace.task, truth, grader, producer=producer_of(trace))


def split_holdout(traces: Sequence[Trace], share: float) -> tuple[tuple[Trace, ...], tuple[Trace, ...]]:
    """(the traces to learn from, the held-out ones), each in the window's order."""
    held = tuple(t for t in traces if held_out(t, share))
    kept = tuple(t for t in traces if not held_out(t, share))
    return kept, held
