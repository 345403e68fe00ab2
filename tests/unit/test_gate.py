"""The gate's pure parts: graders, the validation set, the judge's parser, the paired decision, and the evaluation
with a scripted LLM that answers differently per playbook (docs/promotion.md, "The gate")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from combee.errors import ConfigError, LLMParseError
from combee.forget import ForgetRule
from combee.gate import (
    BaselineGrades,
    PairedScores,
    decide_gate,
    evaluate,
    pair_scores,
    promote_same_lessons,
    same_lessons,
    too_few_tasks,
)
from combee.graders import Score, grader_names, make_grader, normalise, set_f1
from combee.holdout import held_out, holdout_task, split_holdout
from combee.judge import judge_request, judge_schema, parse_judgement
from combee.llm import ChatRequest, Role
from combee.models import Feedback, Playbook, Trace
from combee.promotion import GateRule
from combee.serving import Serving
from combee.validation import ValidationTask, parse_validation, validation_line
from tests.fakes import ScriptedLLM, user_text
from tests.unit.test_dedup import bullet

RULE = GateRule(margin=0.05, min_pairs=20, alpha=0.05)
GATED = Serving(policy="gate", live=3, previous=2, rejected_through=0, serial=4)


# --- graders ---


def test_exact_normalises_case_space_quotes_and_final_punctuation() -> None:
    exact = make_grader("exact")
    assert exact('  "Paris".', "paris") == Score(1.0, True)
    assert exact("New   York", "new york").success
    assert not exact("Lyon", "Paris").success
    assert not exact(None, "Paris").success
    assert normalise(" A\tB!") == "a b"


def test_numeric_tolerance_and_the_formula_rule() -> None:
    assert make_grader("numeric")("$1,500", "1500").success
    assert not make_grader("numeric")("1500.2", "1500").success
    assert make_grader("numeric", {"abs_tol": 0.5})("1500.2", "1500").success
    assert make_grader("numeric", {"rel_tol": 0.01})("1510", "1500").success
    assert not make_grader("numeric", {"rel_tol": 0.001})("1510", "1500").success
    assert not make_grader("numeric")("about fifteen", "15").success
    assert make_grader("numeric", {"rule": "formula"})("14.999", "15.0").success  # the Formula task's rounding


def test_labels_by_position_reuse_the_finer_rule_and_by_set_score_f1() -> None:
    pos = make_grader("labels")
    assert pos("A, b, c", "a,b,c") == Score(1.0, True)
    partial = pos("a,x,c", "a,b,c")
    assert partial.value == pytest.approx(2 / 3) and not partial.success
    as_set = make_grader("labels", {"match": "set"})
    assert as_set("c, b, a", "a,b,c").success  # order does not matter
    half = as_set("a,x", "a,b")
    assert half.value == pytest.approx(0.5) and not half.success
    assert make_grader("labels", {"match": "set", "min_f1": 0.5})("a,x", "a,b").success
    assert set_f1(frozenset(), frozenset()) == 1.0


@pytest.mark.parametrize(
    ("name", "params"),
    [("nope", {}), ("judge", {}), ("numeric", {"abs_tol": -1}), ("labels", {"match": "bag"}), ("numeric", {"rule": 1})],
)
def test_unknown_graders_and_bad_parameters_are_refused(name: str, params: dict) -> None:
    with pytest.raises(ConfigError):
        make_grader(name, params)


def test_the_registry_names_every_grader() -> None:
    assert grader_names() == ("exact", "labels", "numeric", "judge")


# --- the validation set ---


def test_a_validation_file_is_read_line_by_line_with_defaults() -> None:
    text = "\n".join(
        [
            json.dumps({"task": "2+2?", "truth": 4, "grader": "numeric"}),
            "",
            json.dumps({"id": "q2", "task": "Capital of France?", "truth": "Paris"}),
            json.dumps({"task": "Is it right?", "truth": "yes", "grader": "judge", "params": {"criteria": "strict"}}),
        ]
    )
    tasks = parse_validation(text, default_grader="exact")
    assert [(t.id, t.truth, t.grader) for t in tasks] == [
        ("line-1", "4", "numeric"),
        ("q2", "Paris", "exact"),
        ("line-4", "yes", "judge"),
    ]


@pytest.mark.parametrize(
    "line",
    [
        "not json",
        "[1]",
        json.dumps({"task": "", "truth": "x"}),
        json.dumps({"task": "t", "truth": True}),
        json.dumps({"task": "t", "truth": "x", "grader": "nope"}),
        json.dumps({"task": "t", "truth": "x", "extra": 1}),
        json.dumps({"task": "t", "truth": "x", "grader": "judge", "params": {"model": "x"}}),
    ],
)
def test_a_bad_line_is_refused_with_its_number(line: str) -> None:
    good = json.dumps({"task": "t", "truth": "x"})
    with pytest.raises(ConfigError, match="line 2"):
        parse_validation(f"{good}\n{line}", source="v.jsonl")


def test_a_repeated_id_is_refused() -> None:
    line = json.dumps({"id": "a", "task": "t", "truth": "x"})
    with pytest.raises(ConfigError, match="twice"):
        parse_validation(f"{line}\n{line}")


# --- the judge ---


def test_the_judges_parser_accepts_what_its_schema_admits() -> None:
    assert parse_judgement('{"correct": true, "reason": "same value"}') == Score(1.0, True)
    assert parse_judgement('```json\n{"correct": false, "reason": "no"}\n```') == Score(0.0, False)
    schema = judge_schema()
    assert schema["required"] == ["correct", "reason"] and schema["additionalProperties"] is False
    for bad in ('{"correct": "yes", "reason": ""}', '{"correct": true}', '{"correct": true, "reason": "", "x": 1}',
                json.dumps({"correct": True, "reason": "r" * 301})):  # fmt: skip
        with pytest.raises(LLMParseError):
            parse_judgement(bad)


def test_the_judge_request_carries_the_data_escaped() -> None:
    request = judge_request("task </task>", "42", "42.0", "numbers")
    assert request.schema_name == "combee_judge" and request.role == Role.REFLECTOR
    assert "</task>\n<reference>" in request.messages[1].content
    assert "task \\u003c/task\\u003e" in request.messages[1].content  # the data cannot close the block


# --- the decision ---


def pairs(both: int, cand: int, base: int, neither: int) -> PairedScores:
    return PairedScores(both, cand, base, neither, candidate_score=both + cand, baseline_score=both + base)


def test_an_equal_candidate_is_promoted_with_the_paired_evidence() -> None:
    d = decide_gate(GATED, 5, pairs(30, 0, 0, 10), RULE, at=1.0, validation={"source": "redis", "tasks": 40})
    assert d is not None and (d.action, d.version, d.serve, d.decided_by, d.policy) == ("promote", 5, 5, "gate", "gate")
    assert d.id == "promote/v5"
    ev = d.evidence
    assert ev["comparison"]["verdict"] == "not_worse"  # type: ignore[index]
    assert ev["pairs"] == {"both": 30, "candidate_only": 0, "baseline_only": 0, "neither": 10}
    assert ev["candidate"] == {"n": 40, "success": 30, "score_mean": 0.75, "unanswered": 0}
    assert (ev["candidate_version"], ev["baseline_version"]) == (5, 3)


def test_a_worse_candidate_is_rejected_back_to_the_live_version() -> None:
    d = decide_gate(GATED, 5, pairs(10, 0, 20, 10), RULE, at=1.0)
    assert d is not None and (d.action, d.version, d.serve, d.decided_by) == ("reject", 4, 3, "gate")
    assert d.evidence["comparison"]["verdict"] == "worse"  # type: ignore[index]


def test_an_undecided_comparison_with_enough_pairs_is_rejected() -> None:
    d = decide_gate(GATED, 5, pairs(20, 4, 6, 10), RULE, at=1.0)
    assert d is not None and d.action == "reject"
    assert d.evidence["comparison"]["verdict"] == "undecided" and "not shown" in d.reason  # type: ignore[index]


def test_too_few_pairs_waits() -> None:
    assert decide_gate(GATED, 5, pairs(5, 0, 0, 5), RULE, at=1.0) is None
    assert too_few_tasks(10, RULE) == "the validation set has 10 tasks; the gate needs at least 20"
    assert too_few_tasks(20, RULE) is None


def test_the_gate_decides_only_a_pending_candidate_of_a_gated_namespace() -> None:
    ok = pairs(30, 0, 0, 10)
    assert decide_gate(Serving(policy="canary", live=3), 5, ok, RULE, at=1.0) is None
    assert decide_gate(GATED, 3, ok, RULE, at=1.0) is None  # the live version is no candidate
    assert decide_gate(Serving(policy="gate", live=3, rejected_through=5), 5, ok, RULE, at=1.0) is None
    assert decide_gate(GATED, 5, None, RULE, at=1.0) is None  # not evaluated
    first = decide_gate(Serving(policy="gate"), 1, None, RULE, at=1.0)
    assert first is not None and (first.action, first.serve) == ("promote", 1)  # nothing live: no baseline


def test_pair_scores_counts_each_pair_once() -> None:
    ok, no = Score(1.0, True), Score(0.25, False)
    got = pair_scores([ok, ok, no, None, no], [ok, no, ok, None, None])
    assert (got.both, got.candidate_only, got.baseline_only, got.neither) == (1, 1, 1, 2)
    assert (got.candidate_unanswered, got.baseline_unanswered) == (1, 2)
    assert got.candidate_score == pytest.approx(2.5) and got.baseline_score == pytest.approx(2.25)
    with pytest.raises(ValueError):
        pair_scores([ok], [])


# --- the evaluation, with a model whose answers depend on the playbook ---

BAD_LESSON = "round every figure to the nearest ten"


def per_playbook(request: ChatRequest) -> str:
    """The generator answers the number in the task, except with the bad lesson in its playbook (then it rounds);
    the judge says correct when the candidate answer equals the reference."""
    if request.schema_name == "combee_judge":
        same = re.findall(r"<reference>\n(.*)\n</reference>.*<candidate>\n(.*)\n</candidate>", user_text(request), re.S)
        return json.dumps({"correct": same[0][0] == same[0][1], "reason": "compared"})
    number = int(re.findall(r"\d+", user_text(request))[0])
    rounded = BAD_LESSON in request.messages[0].content
    return json.dumps({"reasoning": "read it", "final_answer": str(round(number, -1) if rounded else number)})


def numbered(n: int, grader: str = "numeric") -> tuple[ValidationTask, ...]:
    return tuple(ValidationTask(f"q{i}", f"What is {i + 11}?", str(i + 11), grader) for i in range(n))


GOOD = Playbook(namespace="n", version=3, bullets=(bullet(1, "read the number carefully"),), next_id=2)
BAD = Playbook(namespace="n", version=4, bullets=(*GOOD.bullets, bullet(2, BAD_LESSON)), next_id=3)


@pytest.mark.parametrize("grader", ["numeric", "judge"])
async def test_evaluation_pairs_each_task_answered_with_both_playbooks(grader: str) -> None:
    llm = ScriptedLLM(per_playbook)
    tasks = numbered(30, grader)
    worse = await evaluate(llm, tasks, BAD, GOOD, concurrency=3)
    assert (worse.both, worse.candidate_only, worse.baseline_only, worse.neither) == (3, 0, 27, 0)  # 20 and 30 round
    assert len(llm.calls(Role.GENERATOR)) == 60 and llm.max_in_flight <= 3
    assert len(llm.calls(Role.REFLECTOR)) == (60 if grader == "judge" else 0)
    d = decide_gate(Serving(policy="gate", live=3), 4, worse, RULE, at=1.0)
    assert d is not None and d.action == "reject"
    same = await evaluate(ScriptedLLM(per_playbook), tasks, GOOD.model_copy(update={"version": 4}), GOOD, concurrency=3)
    assert (same.both, same.baseline_only) == (30, 0)
    d = decide_gate(Serving(policy="gate", live=3), 4, same, RULE, at=1.0)
    assert d is not None and d.action == "promote"


async def test_the_live_versions_grades_are_reused_by_the_next_candidate_against_it() -> None:
    """A rejected candidate leaves the live version as it was: the next evaluation against it asks the generator
    only for the candidate's answers (and the new tasks' live answers), with the same pairs as a full one."""
    tasks = numbered(30)
    known = BaselineGrades(GOOD.version)
    first = ScriptedLLM(per_playbook)
    await evaluate(first, tasks[:20], BAD, GOOD, concurrency=3, known=known)
    assert len(first.calls(Role.GENERATOR)) == 40 and len(known.grades) == 20
    again = ScriptedLLM(per_playbook)
    reused = await evaluate(again, tasks, BAD.model_copy(update={"version": 5}), GOOD, concurrency=3, known=known)
    assert len(again.calls(Role.GENERATOR)) == 30 + 10
    full = await evaluate(ScriptedLLM(per_playbook), tasks, BAD, GOOD, concurrency=3)
    assert reused == full
    other_live = ScriptedLLM(per_playbook)  # grades of another live version are never used
    await evaluate(other_live, tasks, BAD, GOOD.model_copy(update={"version": 9}), concurrency=3, known=known)
    assert len(other_live.calls(Role.GENERATOR)) == 60


async def test_a_judge_answer_that_does_not_parse_grades_the_answer_wrong() -> None:
    def script(request: ChatRequest) -> str:
        return "no idea" if request.schema_name == "combee_judge" else json.dumps({"final_answer": "11"})

    got = await evaluate(ScriptedLLM(script), numbered(1, "judge"), GOOD, GOOD, concurrency=1)
    assert got.neither == 1


# --- held-out traces ---


def traced(i: int, truth: str | None = "42") -> Trace:
    return Trace(trace_id=f"t-{i}", namespace="ns", task=f"task {i}", feedback=Feedback(ground_truth=truth))


def test_the_held_out_share_is_stable_close_to_the_setting_and_grows_by_adding() -> None:
    traces = [traced(i) for i in range(20_000)]
    at_10 = {t.trace_id for t in traces if held_out(t, 0.1)}
    assert abs(len(at_10) / len(traces) - 0.1) < 0.01
    assert at_10 == {t.trace_id for t in traces if held_out(t, 0.1)}  # the same choice every time
    assert at_10 < {t.trace_id for t in traces if held_out(t, 0.2)}  # a larger share only adds traces
    assert not any(held_out(t, 0.0) for t in traces[:100])


def test_only_traces_with_ground_truth_are_held_out_and_they_read_back_as_tasks() -> None:
    assert not any(held_out(traced(i, truth), 0.99) for i in range(50) for truth in (None, "  "))
    learn, held = split_holdout([traced(i) for i in range(50)], 0.5)
    assert len(learn) + len(held) == 50 and learn and held
    assert not {t.trace_id for t in learn} & {t.trace_id for t in held}
    task = holdout_task(held[0], "numeric")
    assert parse_validation(validation_line(task)) == (task,)


def test_the_documented_validation_lines_parse() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "promotion.md").read_text(encoding="utf-8")
    block = doc.split("### The validation set", 1)[1].split("```json\n", 1)[1].split("```", 1)[0]
    tasks = parse_validation(block)
    assert [t.grader for t in tasks] == ["numeric", "exact", "labels", "judge"]


def test_a_held_out_task_keeps_its_producer_for_later_forget_rules() -> None:
    trace = Trace(trace_id="t-1", namespace="ns", task="q", metadata={"producer": "agent-a"},
                  feedback=Feedback(ground_truth="1"))  # fmt: skip
    task = holdout_task(trace, "exact")
    assert task.producer == "agent-a" and parse_validation(validation_line(task)) == (task,)
    assert ForgetRule(producer="agent-a").covers("ns", task.producer)
    assert ForgetRule(namespace="ns").covers("ns", None)
    assert not ForgetRule(namespace="other", producer="agent-a").covers("ns", "agent-a")
    assert not ForgetRule(producer="agent-b").covers("ns", task.producer)


def test_same_lessons_ignores_version_numbers_and_counters() -> None:
    counted = GOOD.bullets[0].model_copy(update={"helpful": 7})
    assert same_lessons(GOOD.model_copy(update={"version": 9, "bullets": (counted,)}), GOOD)
    assert not same_lessons(BAD, GOOD)
    assert promote_same_lessons(Serving(policy="canary", live=3), 4, at=1.0) is None
    assert promote_same_lessons(GATED, 3, at=1.0) is None  # the live version is no candidate
    d = promote_same_lessons(GATED, 4, at=1.0)
    assert d is not None and (d.action, d.serve, d.decided_by) == ("promote", 4, "gate")
