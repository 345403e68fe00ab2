"""Grading the finance tasks (Formula, FiNER): pure functions from a predicted answer and a target to a grade.

The rules re-implement how the upstream ACE code scores these sets (``../shared/data/SOURCES.md``), with the
one deliberate difference stated where it is made, and both figures reported so the comparison stays honest.

**Formula** (one number per question; targets are float strings such as ``"15.0"``, ``"0.2"``, ``"-12.34"``):

* :func:`formula_exact` is the upstream rule: remove ``,`` from both strings and compare ``float(pred) ==
  float(target)``; if either does not parse as a float, compare the (stripped) strings.
* :func:`formula_correct` is this project's headline rule. Both strings are cleaned first: ``,``, ``$``, ``%``
  and all whitespace are removed, a leading ``+`` is dropped and a Unicode minus becomes ``-``; an accounting
  negative in parentheses, ``"(0.5)"``, means ``-0.5``; exponents (``"1.2e3"``) are numbers. Both numbers are
  then rounded half-up to 2 decimals (the questions ask for "a numerical answer with 2 decimal places") and
  compared exactly, in decimal arithmetic (no binary float surprises). Anything that is not a finite number
  falls back to exact string equality of the cleaned strings. So ``"15.00%"``, ``"$15"`` and ``"14.999"`` all
  match ``"15.0"`` here and none of them does upstream (it strips only ``,``); ``"15.00"`` and ``"15"`` match
  under both rules. Every run reports both rates.

**FiNER** (4 comma-separated XBRL tags per sample): :func:`grade_finer` splits both strings on ``,``,
lowercases and strips every label, pads a short prediction with empty labels and truncates a long one, and
compares position by position (numeric labels as numbers). Accuracy is label-level (correct labels / all
labels, as upstream reports it); ``all_correct`` (every label right) is the sample-level figure upstream uses
as the training success signal.

The generator's answer is found in its raw text by :func:`combee.answers.extract_answer`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Context, Decimal, InvalidOperation

__all__ = [
    "FinerGrade",
    "clean_number_text",
    "formula_correct",
    "formula_exact",
    "grade_finer",
    "parse_number",
]

_CLEAN_RE = re.compile(r"[,$%\s]+")
_CENT = Decimal("0.01")
# Wide enough for every target in the data (up to 15 integer digits) and for any sane answer.
_DECIMAL = Context(prec=80)


def clean_number_text(text: str) -> str:
    """``text`` without ``,`` ``$`` ``%`` and whitespace, a Unicode minus made ASCII, a leading ``+`` dropped."""
    cleaned = _CLEAN_RE.sub("", text).replace("\u2212", "-")
    return cleaned[1:] if cleaned.startswith("+") else cleaned


def parse_number(text: str) -> Decimal | None:
    """The finite number ``text`` writes after :func:`clean_number_text`, or ``None``.

    ``"(0.5)"`` (an accounting negative) is ``-0.5``; ``"1.2e3"`` is ``1200``; ``"nan"``, ``"inf"`` and words
    are not numbers.
    """
    cleaned = clean_number_text(text)
    negative = len(cleaned) > 2 and cleaned.startswith("(") and cleaned.endswith(")")
    if negative:
        cleaned = cleaned[1:-1]
        if cleaned.startswith("-"):  # "(-0.5)" is not an accounting form; refuse rather than guess
            return None
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    return -value if negative else value


def _cents(value: Decimal) -> Decimal | None:
    try:
        return value.quantize(_CENT, rounding=ROUND_HALF_UP, context=_DECIMAL)
    except InvalidOperation:  # an exponent too large to quantize: no answer of that size is right
        return None


def formula_correct(prediction: str, target: str) -> bool:
    """This project's Formula rule (see the module docstring): equal after rounding both to 2 decimals."""
    pred, truth = parse_number(prediction), parse_number(target)
    if pred is None or truth is None:
        return clean_number_text(prediction) == clean_number_text(target)
    a, b = _cents(pred), _cents(truth)
    return a is not None and a == b


def formula_exact(prediction: str, target: str) -> bool:
    """The upstream Formula rule: ``float(pred) == float(target)`` after removing ``,``; else string equality."""
    pred, truth = prediction.replace(",", "").strip(), target.replace(",", "").strip()
    try:
        return float(pred) == float(truth)
    except ValueError:
        return pred == truth


@dataclass(frozen=True)
class FinerGrade:
    """Labels right out of labels asked (the target's label count), and whether all of them are right."""

    correct: int
    total: int

    @property
    def all_correct(self) -> bool:
        return self.total > 0 and self.correct == self.total

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0


def _same_label(pred: str, truth: str) -> bool:
    if pred == truth:
        return True
    try:
        return float(pred) == float(truth)
    except ValueError:
        return False


def grade_finer(prediction: str, target: str) -> FinerGrade:
    """Grade a FiNER answer position by position (see the module docstring)."""
    truth = [label.strip().lower() for label in target.split(",")]
    pred = [label.strip().lower() for label in prediction.split(",")]
    pred = (pred + [""] * len(truth))[: len(truth)]
    return FinerGrade(correct=sum(_same_label(p, t) for p, t in zip(pred, truth, strict=True)), total=len(truth))
