"""The finance evaluator: Formula's number formats, FiNER's label matching, answer extraction."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from combee.answers import extract_answer
from combee.tasks.agent import grade
from combee.tasks.grading import (
    formula_correct,
    formula_exact,
    grade_finer,
    parse_number,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("15.0", Decimal("15.0")),
        ("$1,234.50", Decimal("1234.50")),
        ("12%", Decimal("12")),
        ("-0.5", Decimal("-0.5")),
        ("(0.5)", Decimal("-0.5")),  # accounting negative
        ("1.2e3", Decimal("1200")),
        (" 4,250,000,000,000.0 ", Decimal("4250000000000.0")),
        ("+3", Decimal("3")),
        ("\u22122.5", Decimal("-2.5")),  # Unicode minus
        ("$ 40", Decimal("40")),
    ],
)
def test_parse_number_reads_the_formats_of_the_data_and_of_model_answers(text: str, value: Decimal) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize("text", ["", "abc", "nan", "inf", "-inf", "(-0.5)", "()", "15.0.0", "1/2"])
def test_parse_number_refuses_what_is_not_a_finite_number(text: str) -> None:
    assert parse_number(text) is None


@pytest.mark.parametrize(
    ("prediction", "target", "ours", "upstream"),
    [
        ("15.0", "15.0", True, True),
        ("15.00", "15.0", True, True),
        ("15", "15.0", True, True),
        ("15%", "15.0", True, False),  # upstream strips only ','
        ("$40", "40.0", True, False),
        ("$1,234.50", "1234.5", True, False),
        ("1,234.5", "1234.5", True, True),
        ("-0.5", "-0.5", True, True),
        ("(0.5)", "-0.5", True, False),
        ("1.2e3", "1200.0", True, True),
        ("14.999", "15.0", True, False),  # rounds to 15.00
        ("15.004", "15.0", True, False),
        ("15.005", "15.0", False, False),  # rounds half up to 15.01
        ("0.2", "0.2", True, True),
        ("0.20", "0.2", True, True),
        ("0.15", "15.0", False, False),  # a ratio where a percentage is asked is wrong
        ("40.1", "40.0", False, False),
        ("forty", "40.0", False, False),
        ("", "40.0", False, False),
        ("n/a", "n/a", True, True),  # non-numbers: equal strings
    ],
)
def test_formula_rules(prediction: str, target: str, ours: bool, upstream: bool) -> None:
    assert formula_correct(prediction, target) is ours
    assert formula_exact(prediction, target) is upstream


def test_formula_huge_exponent_is_wrong_not_an_error() -> None:
    assert formula_correct("1e999999", "15.0") is False
    assert formula_exact("1e999999", "15.0") is False


def test_finer_is_position_by_position_lowercased_and_stripped() -> None:
    target = "Revenues,Goodwill,LineOfCredit,InterestExpense"
    assert grade_finer(" revenues , GOODWILL,LineOfCredit,InterestExpense", target).correct == 4
    g = grade_finer("Goodwill,Revenues,LineOfCredit,InterestExpense", target)
    assert (g.correct, g.total, g.all_correct, g.accuracy) == (2, 4, False, 0.5)


def test_finer_pads_a_short_answer_and_truncates_a_long_one() -> None:
    target = "A,B,C,D"
    assert grade_finer("a,b", target).correct == 2
    assert grade_finer("a,b,c,d,e,f", target).correct == 4
    assert grade_finer("", target).correct == 0


def test_finer_numeric_labels_compare_as_numbers() -> None:
    assert grade_finer("1.0,x", "1,x").correct == 2


def _reply(answer: str) -> str:
    return json.dumps({"reasoning": "because", "final_answer": answer})


def test_extract_answer_prefers_the_project_parser() -> None:
    found = extract_answer(_reply("15.0"))
    assert (found.answer, found.how, found.parsed) == ("15.0", "parsed", True)


@pytest.mark.parametrize(
    ("raw", "answer", "how"),
    [
        ("thinking... Finish[15.00]", "15.00", "finish"),
        ("Finish[1] then Finish[2]", "2", "finish"),
        ('{"reasoning": "x", "final_answer": "15.0"', "15.0", "final_answer_field"),  # truncated object
        ('{"reasoning": "x", "final_answer": "15.', "15.", "final_answer_field"),  # cut inside the string
        ('{"final_answer": 15.5, "extra": }', "15.5", "final_answer_field"),
        ("The margin is 15%. The final answer is 15.00.", "15.00", "final_answer_is"),
        ("the final answer is: **$40**", "$40", "final_answer_is"),
        ("I cannot tell.", None, "none"),
        ("", None, "none"),
    ],
)
def test_extract_answer_fallbacks_on_raw_text(raw: str, answer: str | None, how: str) -> None:
    found = extract_answer(raw)
    assert (found.answer, found.how) == (answer, how)


def test_grade_by_task() -> None:
    assert grade("formula", "15%", "15.0").score == 1.0
    assert grade("formula", "15%", "15.0").upstream == 0.0
    assert grade("formula", None, "15.0").success is False
    g = grade("finer", "a,b,c,x", "a,b,c,d")
    assert (g.score, g.success) == (0.75, False)
    assert "3 of 4" in g.detail
    with pytest.raises(ValueError, match="unknown task"):
        grade("nope", "1", "1")
