"""Graders: how the gate scores an answer against a validation task's ground truth. Pure.

A grader is built from its name and parameters (:func:`make_grader`, the registry :data:`GRADERS`) and maps
(prediction, truth) to a :class:`Score`: a value in [0, 1] and a success flag. The gate's paired test counts
successes (docs/promotion.md); the score is reported beside it.

* ``exact``: equal after :func:`normalise` (case folded, whitespace collapsed, surrounding quotes and final
  punctuation dropped).
* ``numeric``: both sides read as numbers by the finance harness's :func:`combee.tasks.grading.parse_number`
  (``$``, ``%``, ``,`` and accounting negatives understood); right when ``|p - t| <= max(abs_tol, rel_tol·|t|)``.
  Params ``abs_tol`` (default 0) and ``rel_tol`` (default 0); ``rule: "formula"`` uses the Formula task's rule
  (:func:`combee.tasks.grading.formula_correct`: both rounded to cents).
* ``labels``: a comma-separated label list. ``match: "position"`` (default) is the FiNER rule
  (:func:`combee.tasks.grading.grade_finer`: the share of labels right, success when all are);
  ``match: "set"`` compares the sets of normalised labels: the score is their F1, success when F1 reaches
  ``min_f1`` (default 1: set equality). ``sep`` (default ``,``) splits the list.
* ``judge``: an LLM decides (:mod:`combee.judge`); it is not a pure grader, so it is named here
  (:data:`JUDGE`) and built by the evaluation, which holds the LLM.

A missing answer (``None``: none found in the generator's reply) is a failure under every grader.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Final, Protocol

from combee.errors import ConfigError
from combee.tasks.grading import formula_correct, grade_finer, parse_number

__all__ = ["GRADERS", "JUDGE", "Grader", "Score", "grader_names", "make_grader", "normalise", "set_f1"]

JUDGE: Final = "judge"


@dataclass(frozen=True)
class Score:
    """``value`` in [0, 1]; ``success``: the pass/fail the paired test counts."""

    value: float
    success: bool


class Grader(Protocol):
    def __call__(self, prediction: str | None, truth: str) -> Score: ...


Params = Mapping[str, object]
_WS = re.compile(r"\s+")
_EDGE = "\"'`“”‘’"
_FAIL = Score(0.0, False)


def normalise(text: str) -> str:
    """Case folded, runs of whitespace made one space, surrounding quotes and a final ``.`` ``!`` ``;`` dropped."""
    out = _WS.sub(" ", text).strip().casefold()
    out = out.rstrip(".!;").strip().strip(_EDGE).strip()
    return out


def _number(params: Params, key: str) -> float:
    value = params.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"grader parameter {key!r} must be a number >= 0, got {value!r}")
    return float(value)


def _exact(params: Params) -> Grader:
    def grade(prediction: str | None, truth: str) -> Score:
        ok = prediction is not None and normalise(prediction) == normalise(truth)
        return Score(float(ok), ok)

    return grade


def _numeric(params: Params) -> Grader:
    rule = params.get("rule", "tolerance")
    if rule not in ("tolerance", "formula"):
        raise ConfigError(f"numeric grader: rule must be 'tolerance' or 'formula', got {rule!r}")
    abs_tol, rel_tol = Decimal(repr(_number(params, "abs_tol"))), Decimal(repr(_number(params, "rel_tol")))

    def grade(prediction: str | None, truth: str) -> Score:
        if prediction is None:
            return _FAIL
        if rule == "formula":
            ok = formula_correct(prediction, truth)
            return Score(float(ok), ok)
        p, t = parse_number(prediction), parse_number(truth)
        ok = p is not None and t is not None and abs(p - t) <= max(abs_tol, rel_tol * abs(t))
        return Score(float(ok), ok)

    return grade


def _label_set(text: str, sep: str) -> frozenset[str]:
    return frozenset(label for label in (normalise(part) for part in text.split(sep)) if label)


def set_f1(predicted: frozenset[str], truth: frozenset[str]) -> float:
    """F1 of two label sets (both empty: 1)."""
    if not predicted and not truth:
        return 1.0
    hits = len(predicted & truth)
    return 2.0 * hits / (len(predicted) + len(truth))


def _labels(params: Params) -> Grader:
    match, sep = params.get("match", "position"), params.get("sep", ",")
    if match not in ("position", "set"):
        raise ConfigError(f"labels grader: match must be 'position' or 'set', got {match!r}")
    if not isinstance(sep, str) or not sep:
        raise ConfigError(f"labels grader: sep must be a non-empty string, got {sep!r}")
    min_f1 = _number(params, "min_f1") if "min_f1" in params else 1.0

    def grade(prediction: str | None, truth: str) -> Score:
        if prediction is None:
            return _FAIL
        if match == "position":
            g = grade_finer(prediction.replace(sep, ","), truth.replace(sep, ","))
            return Score(g.accuracy, g.all_correct)
        f1 = set_f1(_label_set(prediction, sep), _label_set(truth, sep))
        return Score(f1, f1 >= min_f1)

    return grade


GRADERS: Final[Mapping[str, Callable[[Params], Grader]]] = {
    "exact": _exact,
    "numeric": _numeric,
    "labels": _labels,
}
"""The pure graders by name (``judge`` is built by the evaluation: :data:`JUDGE`)."""


def grader_names() -> tuple[str, ...]:
    """Every grader name a validation task may give (the pure ones and ``judge``)."""
    return (*sorted(GRADERS), JUDGE)


def make_grader(name: str, params: Params | None = None) -> Grader:
    """The pure grader ``name`` with ``params``. Raises :class:`ConfigError` for an unknown name (``judge``
    included: it needs an LLM) or a bad parameter."""
    factory = GRADERS.get(name)
    if factory is None:
        raise ConfigError(f"unknown grader {name!r}; one of {', '.join(grader_names())}")
    return factory(params or {})
