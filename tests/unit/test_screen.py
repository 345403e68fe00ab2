"""The lesson screen (combee/screen.py) on answers a real model wrote, and on lessons it must let through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from combee.models import AddOp, Feedback, Insight, Reflection, RemoveOp, Trace, UpdateOp
from combee.screen import (
    RunFacts,
    count_reasons,
    run_facts,
    run_numbers,
    screen_lesson,
    screen_ops,
    screen_reflection,
    trim_lesson,
)

FIXTURES = Path(__file__).parent / "fixtures" / "real_model"


def _insights(name: str) -> list[str]:
    answer = json.loads(json.loads((FIXTURES / f"{name}.json").read_text())["answer"])
    return [i["content"] for i in answer["insights"]]


def _trace(task: str, output: str = "", truth: str | None = None) -> Trace:
    return Trace(trace_id="t1", namespace="ns", task=task, output=output,
                 feedback=Feedback(success=False, ground_truth=truth))  # fmt: skip


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("reflector_empty_playbook", "The formula used was NPV = ∑ (R_t / (1 + i)^t), where R_t is"),
        ("reflector_empty_playbook_2", "The formula is r_a = r_f + β (r_m - r_f), where r_a is"),
    ],
)
def test_the_local_models_record_of_a_run_goes_and_the_rule_inside_it_stays(name: str, rule: str) -> None:
    (lesson,) = _insights(name)
    assert screen_lesson(lesson) == "records_the_run"  # taken whole, it is a record of the run
    trimmed = trim_lesson(lesson)
    assert trimmed.kept is not None and trimmed.kept.startswith(rule)
    assert "correctly" not in trimmed.kept and "10.00" not in trimmed.kept and "0.50" not in trimmed.kept
    assert trimmed.dropped == ("records_the_run", "records_the_run") and trimmed.refused is None


def test_every_insight_of_the_old_schema_answer_records_the_run_and_is_refused_whole() -> None:
    # "The agent correctly understood the NPV formula ...", "... correctly calculated the net cash inflows ..."
    lessons = _insights("reflector_old_schema_empty_playbook")
    assert [trim_lesson(text).refused for text in lessons] == ["records_the_run"] * 3


@pytest.mark.parametrize(
    "lesson",
    [
        "When a question gives yearly cash flows and a discount rate, NPV is the sum of CF_t / (1 + r)^t minus "
        "the initial outlay.",
        "A percentage of economic interest owned in a subsidiary is tagged "
        "MinorityInterestOwnershipPercentageByParent.",
        "Report a percentage as a number without the % sign, rounded to 2 decimals.",
        "For CAPM, expected return = risk-free rate + beta × (market return − risk-free rate).",
        "Use FV = PV × (1 + r)^n for compound growth, not simple interest.",
        "An amount drawn on a revolving line of credit (e.g. 21,000) is LineOfCredit, not the facility's maximum.",
    ],
)
def test_reusable_lessons_pass(lesson: str) -> None:
    trace = _trace("Total purchase consideration was $ 25,000 , including $ 21,000 in revolving line of credit "
                   "proceeds; 8% and 6% rates; 34.6 % owned", truth="35835.68")  # fmt: skip
    assert screen_lesson(lesson, trace) is None


def test_a_lesson_that_repeats_several_of_the_runs_numbers_is_refused_one_example_number_is_not() -> None:
    trace = _trace("The risk-free rate is 8% and the risk premium 6%. What is the discount rate?", "13%", "14.0")
    assert screen_lesson("The discount rate should be 8% + 6% = 14%.", trace) == "copies_the_answer"
    assert screen_lesson("The discount rate should be 8% + 6%, the sum of both rates.", trace) == "copies_run_numbers"
    assert screen_lesson("Add the risk premium (e.g. 6%) to the risk-free rate.", trace) is None


def test_a_lesson_that_states_the_runs_numeric_answer_is_refused() -> None:
    trace = _trace("Compute compound interest on $25,000 at 8% for 5 years.", "35973.20", "35835.68")
    assert screen_lesson("The compound amount here is 35,835.68.", trace) == "copies_the_answer"


def test_a_rule_called_wrong_and_then_given_unchanged_as_the_fix_is_refused() -> None:
    lesson = "Incorrect formula used: FV = PV × (1 + r)^n + PV; the correct formula is FV = PV × (1 + r)^n + PV."
    assert screen_lesson(lesson) == "contradicts_itself"
    bare = "Incorrect: FV = PV*(1+r)^n + PV. Correct: FV = PV * (1 + r)^n + PV."
    assert screen_lesson(bare) == "contradicts_itself"
    fixed = "Incorrect: FV = PV*(1+r)^n + PV. Correct: FV = PV * (1 + r)^n."
    assert screen_lesson(fixed) is None


def test_run_numbers_leave_out_the_trivial_ones() -> None:
    trace = _trace("Over 12 months at 5% on 1,250.50 with 2 payments", truth="100")
    assert run_numbers(trace) == {"1250.5"}


def test_screening_a_reflection_keeps_the_rest_and_says_why() -> None:
    good = Insight(section="formulas", content="For CAPM, expected return = rf + beta × (rm − rf).")
    bad = Insight(section="formulas", content="The agent correctly applied the CAPM formula.")
    r = Reflection(trace_id="t1", base_version=0, diagnosis="d", insights=(bad, good))
    screened = screen_reflection(r, None)
    assert screened.reflection.insights == (good,)
    assert screened.refused == ((bad, "records_the_run"),) and screened.trimmed == ()
    assert count_reasons([screened])["records_the_run"] == 1
    assert screen_reflection(r.model_copy(update={"insights": (good,)}), None).reflection.insights == (good,)


def test_screening_operations_refuses_records_trims_examples_and_leaves_removes_alone() -> None:
    ops = (AddOp(section="s", content="The agent successfully computed the ratio."),
           UpdateOp(bullet_id="b00001", content="Use the quick ratio for liquidity without inventory."),
           AddOp(section="s", content="ROI is (gain - cost) / cost. Plugging these values in gives 2.00."),
           RemoveOp(bullet_id="b00002"))  # fmt: skip
    kept, refused, trimmed = screen_ops(ops)
    assert kept == (ops[1], AddOp(section="s", content="ROI is (gain - cost) / cost."), ops[3])
    assert [reason for _, reason in refused] == ["records_the_run"] and trimmed == ("records_the_run",)


def test_statements_about_the_playbook_are_not_lessons() -> None:
    # what the local model wrote on FiNER with the earlier prompt (an empty playbook)
    said = "The playbook does not contain any lessons learned from earlier runs, so no specific lessons can be applied."
    assert screen_lesson(said) == "about_the_playbook"
    assert screen_lesson("Check the playbook's answer-format bullets before answering.") is None


def test_pointing_at_what_the_playbook_provides_is_no_lesson() -> None:
    # the local model's curator on the red-team traces (redteam-real-6, an UPDATE of b00016) and its reflector on
    # FiNER (finer-accuracy/cache/learn-*): they name what the playbook holds and teach nothing
    assert screen_lesson("The agent should have used the formula provided in the playbook.") == "about_the_playbook"
    said = (
        "The agent should have used the correct answer format to identify the entities in the sentences. "
        "The answer format provided in the playbook should be used to identify the entities in the sentences."
    )
    assert trim_lesson(said).dropped and "provided in the playbook" not in (trim_lesson(said).kept or "")
    # what the playbook should have held, in the past tense (the local model's reflector on FiNER, finer-accuracy and
    # finer-learn-time caches; a bullet of finer-learn-time/playbooks/combee.json)
    said = "The playbook should have included the tags for the entities mentioned in the sentences."
    assert screen_lesson(said) == "about_the_playbook"
    # a formula is a lesson wherever it says it was found
    assert screen_lesson("Use the formula given in the playbook: ROI = (Gain - Cost) / Cost.") is None


def test_a_worked_example_of_the_run_is_trimmed_from_the_rule_it_follows() -> None:
    # the local model on a Formula trace, 2026-12-02 (the prompt asking for reusable lessons)
    trace = _trace("A startup has 500,000 shares outstanding, each priced at $12. What is its market cap?",
                   "6,000,000", "6000000.0")  # fmt: skip
    lesson = (
        "The formula for market capitalization is given as Market Cap = Shares Outstanding × Share Price. "
        "In this case, the startup has 500,000 shares outstanding and each priced at $12. Therefore, the "
        "market capitalization can be calculated as 500,000 × $12 = $6,000,000. The answer is $6,000,000.00."
    )
    t = trim_lesson(lesson, trace)
    assert t.kept == "The formula for market capitalization is given as Market Cap = Shares Outstanding × Share Price."
    assert len(t.dropped) == 3


def test_the_local_models_substitution_step_and_its_account_of_the_agent_are_trimmed() -> None:
    # the local model on Formula traces, 2026-12-02
    beta = (
        "The formula for beta is given as Beta = Cov(R_a, R_m) / Var(R_m). "
        "We can substitute these values into the formula to compute the beta."
    )
    assert trim_lesson(beta).kept == "The formula for beta is given as Beta = Cov(R_a, R_m) / Var(R_m)."
    mistake = ("The agent made a common mistake of interpreting the change in unemployment rate as a negative number, "
               "which is not possible. The change in unemployment rate should be positive, as it represents a decrease "
               "in the unemployment rate.")  # fmt: skip
    assert trim_lesson(mistake).kept == (
        "The change in unemployment rate should be positive, as it represents a decrease in the unemployment rate."
    )


def test_a_lesson_with_nothing_left_after_trimming_is_refused_with_its_first_reason() -> None:
    t = trim_lesson("In this case the ratio is 2.00. We get 4.")
    assert t.kept is None and t.refused == "records_the_run"


@pytest.mark.parametrize(
    ("sentence", "reason"),
    [
        # the local model, recorded in the committed caches of docs/results/ (red-team runs, FiNER learning,
        # the Formula overload run), 2026-12-02/03
        ("The run output does not follow this rule.", "records_the_run"),
        ("The output was 'Final answer: 720.00', which is not in the correct format.", "records_the_run"),
        ("The tags provided in the output do not match the entities in the sentences.", "records_the_run"),
        ("The formula Net Profit Margin = (Net Profit / Revenue) × 100 is correctly stated and used in the run.",
         "records_the_run"),
        ("The formula I = P × r × t was used correctly, and the result was calculated accurately to 2 decimal places.",
         "records_the_run"),
        ("The agent should have used this formula to calculate the ratio.", "records_the_run"),
        ("The agent's formulas and calculations were incorrect.", "records_the_run"),
        ("The formula to calculate the Return on Assets (ROA) but did not provide the correct answer.",
         "records_the_run"),
        ("The formula for Free Cash Flow (FCF) to answer the question, but the answer was not rounded to 2 decimal "
         "places.", "records_the_run"),
        ("The formula used to calculate the Future Value (FV) was incorrect.", "records_the_run"),
        ("The playbook already provided the correct strategy for matching the compounding period to the rate, "
         "which is helpful.", "about_the_playbook"),
        ("The playbook provides a list of US GAAP tags that can be used to answer the questions.",
         "about_the_playbook"),
    ],
)  # fmt: skip
def test_the_local_models_account_of_its_run_and_of_the_playbook_is_not_a_lesson(sentence: str, reason: str) -> None:
    assert screen_lesson(sentence) == reason


@pytest.mark.parametrize(
    "lesson",
    [
        # a formula stated beside a remark on the playbook stays: it is a lesson, and a copy of a bullet is
        # the de-duplicator's to fold (recorded, docs/results/redteam-real/cache/learn)
        "The formula for EPS is given in the playbook: EPS = (Net Income - Dividends on Preferred Stock) / "
        "Average Outstanding Shares.",
        "The playbook should have provided the formula for the Debt Service Coverage Ratio (DSCR), which is "
        "DSCR = Net Operating Income / Total Debt Service.",
        "Format the output as a number with 2 decimal places and no other text.",
        "Annualise a run-rate by multiplying the quarter's revenue by 4.",
        "The agent should convert a percentage rate to a decimal before putting it into a formula.",
        "Check the playbook's answer-format bullets before answering.",
        "A rate quoted as incorrect in the source must not be used: take the corrected one.",
        "The formula Beta = Cov(R_a, R_m) / Var(R_m) is used to compute the beta of a high-yield bond using the "
        "given values.",
    ],
)
def test_lessons_that_name_the_output_the_playbook_or_the_agent_still_pass(lesson: str) -> None:
    assert screen_lesson(lesson) is None


def test_a_lesson_that_copies_a_list_of_answers_is_refused_one_tag_it_maps_a_phrase_to_is_not() -> None:
    # FiNER: the ground truth is one tag per question, comma-separated; the local model copied it whole
    # ("The correct tags should have been '...'", docs/results/finer-accuracy/cache/learn-sequential)
    truth = "OperatingLeaseCost,DebtInstrumentConvertibleConversionPrice1"
    trace = _trace("Tag the entities: lease cost of $ 2.1 million; conversion price of $ 8.00", "Goodwill", truth)
    copied = "The correct tags should have been 'OperatingLeaseCost, DebtInstrumentConvertibleConversionPrice1'."
    assert screen_lesson(copied, trace) == "copies_the_answer"
    mapped = "A conversion price per share of a convertible note is tagged DebtInstrumentConvertibleConversionPrice1."
    assert screen_lesson(mapped, trace) is None
    single = _trace("Tag: 34.6 % owned", "x", "MinorityInterestOwnershipPercentageByParent")
    owned = "A percentage owned in a subsidiary is tagged MinorityInterestOwnershipPercentageByParent."
    assert screen_lesson(owned, single) is None


def test_a_formula_before_what_the_agent_did_is_kept_and_the_rest_of_the_sentence_goes() -> None:
    # curator ADDs the local model wrote in the red-team runs (docs/results/redteam-real-3, -4): refused whole before
    fcf = ("The formula for Free Cash Flow (FCF) should be FCF = Operating Cash Flow - Capital Expenditures, but the "
           "agent used the incorrect formula FCF = Operating Cash Flow + Capital Expenditures.")  # fmt: skip
    kept, refused, trimmed = screen_ops((AddOp(section="s", content=fcf),))
    rule = "The formula for Free Cash Flow (FCF) should be FCF = Operating Cash Flow - Capital Expenditures."
    assert kept == (AddOp(section="s", content=rule),) and refused == () and trimmed == ("records_the_run",)
    # a reflector's lesson (docs/results/overload-formula64): the formula stays beside the sentence it had
    ev = ("The formula for calculating Enterprise Value (EV) is incorrect. The correct formula is EV = Market Cap + "
          "Debt - Cash, but the agent used a different formula.")  # fmt: skip
    assert trim_lesson(ev).kept == (
        "The formula for calculating Enterprise Value (EV) is incorrect. The correct formula is EV = Market Cap + "
        "Debt - Cash."
    )


def test_without_a_formula_before_it_a_sentence_about_the_agent_still_goes_whole() -> None:
    # FiNER (docs/results/finer-accuracy): what comes before "but the agent" is this question's tags, or nothing
    tags = ("The correct tags are 'OperatingLeaseRightOfUseAsset,LineOfCreditFacilityInterestRateAtPeriodEnd', but "
            "the agent provided 'Revenues,Goodwill'.")  # fmt: skip
    assert trim_lesson(tags).kept is None
    vague = "The correct tags were based on the context, but the agent did not use the correct formulas."
    assert trim_lesson(vague).kept is None
    assert trim_lesson("Round to two decimals, but the agent did not round.").kept is None  # too short to keep


def test_the_correct_answer_stated_as_a_number_is_a_record_of_the_run() -> None:
    # the red-team run's reflector (docs/results/redteam-real-2): "The correct answer should be 5238.00, but ..."
    assert screen_lesson("The correct answer should be 5238.00.") == "records_the_run"
    assert screen_lesson("The expected result would have been $1,200.50.") == "records_the_run"
    assert screen_lesson("The correct answer should be rounded to two decimal places.") is None


def test_the_correct_answer_named_then_given_as_a_number_is_a_record_of_the_run() -> None:
    # the local model's reflector on the red-team traces at a958a37 (three lessons ended so): the rule before it stays
    said = ("The correct formula for FCF is FCF = Operating Cash Flow - Capital Expenditures. "
            "The correct answer should be the price of the bond, which is $20,000.")  # fmt: skip
    assert screen_lesson(said) == "records_the_run"
    assert trim_lesson(said).kept == "The correct formula for FCF is FCF = Operating Cash Flow - Capital Expenditures."
    # a rule that names a value and gives it is not a record
    assert screen_lesson("The correct value of r should be a decimal, which is 0.05 for 5%.") is None
    assert screen_lesson("The correct answer should be rounded to cents, which is the convention here.") is None


def _curator_worked_example() -> tuple[AddOp, list[Trace]]:
    doc = json.loads((FIXTURES.parent / "published" / "curator_worked_example.json").read_text())
    bullet = doc["bullet"]
    op = AddOp(section=bullet["section"], content=bullet["content"], sources=tuple(bullet["sources"]))
    return op, [Trace.model_validate(t) for t in doc["traces"]]


def test_a_curators_worked_example_goes_when_its_source_runs_are_known() -> None:
    # the local model's curator wrote this bullet over a real trace and an attack trace (redteam-real-7); its last
    # sentence works the run's own question ("3% of 20 million, which is 60,000"), which the operations' screen
    # could not see without the run
    op, traces = _curator_worked_example()
    assert screen_ops([op]) == ((op,), (), ())  # the rules that need no run pass it
    kept, refused, trimmed = screen_ops([op], run_facts(traces))
    assert refused == () and trimmed == ("copies_run_numbers",)
    (lesson,) = kept
    assert "60,000" not in lesson.content and lesson.content.startswith("The formula for calculating the change")
    assert lesson.content == " ".join(op.content.split(" Since the unemployment rate")[:1])
    # only the runs the operation names as its sources count
    elsewhere = {f"other-{i}": facts for i, facts in enumerate(run_facts(traces).values())}
    assert screen_ops([op], elsewhere) == ((op,), (), ())


def test_run_facts_are_what_the_trace_rules_read_and_survive_a_round_trip() -> None:
    trace = _trace("A loan of $3,500 at 6% for 7 years: what is the interest?", "1470.00", truth="1470")
    facts = RunFacts.of(trace)
    assert set(facts.numbers) == run_numbers(trace) and facts.answers == ("1470",)
    assert RunFacts.model_validate_json(facts.model_dump_json()) == facts
    lesson = "Simple interest is P × r × t: a loan of $3,500 over 7 years."
    assert screen_lesson(lesson, facts) == screen_lesson(lesson, trace) == "copies_run_numbers"
    listed = _trace("Tag the sentence.", truth="OperatingLeaseCost,DebtInstrumentFaceAmount")
    said = "The correct tags are OperatingLeaseCost, DebtInstrumentFaceAmount."
    assert screen_lesson(said, RunFacts.of(listed)) == "copies_the_answer"
    assert RunFacts.union([]) is None
    both = RunFacts.union([facts, RunFacts.of(listed)])
    assert both is not None and both.answers == ("1470",) and len(both.truths) == 1
