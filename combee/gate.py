"""The validation gate: a candidate version is served only when it answers a validation set no worse than the live
version (issue 24, item 2; docs/promotion.md).

The decision is pure (:func:`decide_gate`, from the serving state and the :class:`PairedScores` of an
evaluation); the evaluation (:func:`evaluate`) asks the generator role every validation task once with each
playbook, through the LLM port, and grades both answers with the task's grader (:mod:`combee.graders`, or the
LLM judge, :mod:`combee.judge`). The paired test is :func:`combee.compare.compare_paired`:

* ``not_worse`` (the candidate's success rate is not below the live version's by more than the margin) →
  promote the candidate;
* ``worse`` or ``undecided`` with enough pairs → reject: a fixed validation set cannot grow, so a candidate that
  cannot show it is not worse is not served (the gate's burden of proof is on the candidate);
* fewer tasks than ``min_pairs`` → no decision (:func:`too_few_tasks` says so before any LLM call); the
  candidate waits for an operator (``combee prompt promote|reject``) or a larger validation set.

A candidate whose lessons are the live version's (the head a rejection commits: the live content under a new
number) is promoted without an evaluation (:func:`same_lessons`): there is nothing to compare.

With a margin of 0 a candidate that answers exactly as the live version does is ``undecided`` (the bound is 0,
not above 0) and therefore rejected; keep a margin above 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from combee.answers import answer_one
from combee.compare import Comparison, compare_paired
from combee.errors import LLMParseError
from combee.graders import JUDGE, Score, make_grader
from combee.judge import judge_request, parse_judgement
from combee.llm import LLM, Role, context_tokens_of
from combee.models import Playbook
from combee.promotion import Decision, GateRule
from combee.serving import Serving, pending_candidate
from combee.validation import ValidationTask, validation_line

__all__ = [
    "BaselineGrades",
    "PairedScores",
    "decide_gate",
    "evaluate",
    "grade_answer",
    "grade_both",
    "pair_scores",
    "promote_same_lessons",
    "same_lessons",
    "too_few_tasks",
]

_FAIL = Score(0.0, False)


@dataclass(frozen=True)
class PairedScores:
    """Both versions' grades over the same tasks: the four pair counts of the paired test, each side's summed
    score, and how many tasks each side left unanswered (no answer found: graded as a failure)."""

    both: int = 0
    candidate_only: int = 0
    baseline_only: int = 0
    neither: int = 0
    candidate_score: float = 0.0
    baseline_score: float = 0.0
    candidate_unanswered: int = 0
    baseline_unanswered: int = 0

    @property
    def n(self) -> int:
        return self.both + self.candidate_only + self.baseline_only + self.neither

    def side(self, candidate: bool) -> dict[str, object]:
        """One side's summary: tasks, successes, mean score, unanswered."""
        success = self.both + (self.candidate_only if candidate else self.baseline_only)
        total = self.candidate_score if candidate else self.baseline_score
        unanswered = self.candidate_unanswered if candidate else self.baseline_unanswered
        mean = round(total / self.n, 6) if self.n else None
        return {"n": self.n, "success": success, "score_mean": mean, "unanswered": unanswered}


def pair_scores(candidate: Sequence[Score | None], baseline: Sequence[Score | None]) -> PairedScores:
    """The pair counts of two graded runs over the same tasks, in the same order (None: no answer, a failure).
    Raises ValueError when the runs differ in length."""
    if len(candidate) != len(baseline):
        raise ValueError(f"paired runs differ in length: {len(candidate)} and {len(baseline)}")
    counts = [0, 0, 0, 0]
    for c, b in zip(candidate, baseline, strict=True):
        cs, bs = c is not None and c.success, b is not None and b.success
        counts[0 if cs and bs else 1 if cs else 2 if bs else 3] += 1
    return PairedScores(
        both=counts[0],
        candidate_only=counts[1],
        baseline_only=counts[2],
        neither=counts[3],
        candidate_score=sum(c.value for c in candidate if c is not None),
        baseline_score=sum(b.value for b in baseline if b is not None),
        candidate_unanswered=sum(c is None for c in candidate),
        baseline_unanswered=sum(b is None for b in baseline),
    )


def too_few_tasks(tasks: int, rule: GateRule) -> str | None:
    """Why a validation set of ``tasks`` cannot decide under ``rule`` (None: it can)."""
    if tasks >= rule.min_pairs:
        return None
    return f"the validation set has {tasks} tasks; the gate needs at least {rule.min_pairs}"


def compare(pairs: PairedScores, rule: GateRule) -> Comparison:
    """The paired non-inferiority test of the candidate against the live version."""
    return compare_paired(
        pairs.both, pairs.candidate_only, pairs.baseline_only, pairs.neither,
        margin=rule.margin, min_pairs=rule.min_pairs, alpha=rule.alpha,
    )  # fmt: skip


def evidence_of(
    pairs: PairedScores, cmp: Comparison, candidate: int, baseline: int, validation: Mapping[str, object]
) -> dict[str, object]:
    """A gate decision's evidence: the comparison, both sides' summaries, the pair counts, the validation set."""
    return {
        "comparison": asdict(cmp),
        "candidate": pairs.side(candidate=True),
        "baseline": pairs.side(candidate=False),
        "pairs": {
            "both": pairs.both,
            "candidate_only": pairs.candidate_only,
            "baseline_only": pairs.baseline_only,
            "neither": pairs.neither,
        },
        "candidate_version": candidate,
        "baseline_version": baseline,
        "validation": dict(validation),
    }


def decide_gate(
    serving: Serving,
    candidate: int,
    pairs: PairedScores | None,
    rule: GateRule,
    *,
    at: float,
    validation: Mapping[str, object] | None = None,
) -> Decision | None:
    """The gate's decision on ``candidate`` (the head that was evaluated), or None: not the gate's to take
    (another policy, nothing pending), not evaluated yet (``pairs`` None), or too few pairs (wait).

    With nothing live the candidate is promoted at once: there is no baseline to protect (the first version)."""
    if serving.policy != "gate" or pending_candidate(serving, candidate) is None:
        return None
    if serving.live is None:
        return Decision("promote", candidate, "gate", "gate", "nothing is live: no baseline", serve=candidate, at=at)
    if pairs is None:
        return None
    cmp = compare(pairs, rule)
    if cmp.difference is None:  # below the minimum: the candidate waits
        return None
    evidence = evidence_of(pairs, cmp, candidate, serving.live, validation or {})
    if cmp.verdict == "not_worse":
        return Decision("promote", candidate, "gate", "gate", cmp.reason, candidate, evidence, at)
    first = max(serving.live, serving.rejected_through) + 1
    why = cmp.reason if cmp.verdict == "worse" else f"not shown to be no worse: {cmp.reason}"
    return Decision("reject", first, "gate", "gate", why, serving.live, evidence, at)


def same_lessons(candidate: Playbook, live: Playbook) -> bool:
    """Whether the two playbooks hold the same lessons (ids, sections, texts), whatever their version numbers and
    counters."""
    return [(b.id, b.section, b.content) for b in candidate.bullets] == [
        (b.id, b.section, b.content) for b in live.bullets
    ]


def promote_same_lessons(serving: Serving, candidate: int, *, at: float) -> Decision | None:
    """The gate's promotion of a pending candidate known to hold the live version's lessons (no evaluation)."""
    if serving.policy != "gate" or serving.live is None or pending_candidate(serving, candidate) is None:
        return None
    why = f"the same lessons as the live v{serving.live}: nothing to evaluate"
    evidence = {"same_lessons_as": serving.live, "candidate_version": candidate, "baseline_version": serving.live}
    return Decision("promote", candidate, "gate", "gate", why, candidate, evidence, at)


async def grade_answer(llm: LLM, task: ValidationTask, prediction: str | None) -> Score | None:
    """``prediction`` graded by ``task``'s grader (None: there was no answer). The judge is asked once; an answer
    of the judge that does not parse grades the prediction as wrong."""
    if prediction is None:
        return None
    if task.grader != JUDGE:
        return make_grader(task.grader, task.params)(prediction, task.truth)
    criteria = str(task.params.get("criteria", ""))
    response = await llm.complete(judge_request(task.task, prediction, task.truth, criteria))
    try:
        return parse_judgement(response.text)
    except LLMParseError:
        return _FAIL


async def evaluate(
    llm: LLM,
    tasks: Sequence[ValidationTask],
    candidate: Playbook,
    baseline: Playbook,
    *,
    concurrency: int,
    known: BaselineGrades | None = None,
) -> PairedScores:
    """Answer every task with both playbooks (the generator role, as an agent would), grade, and pair the grades.
    At most ``concurrency`` generator requests are in flight. LLM-layer errors propagate (nothing is decided).

    ``known``: the baseline's grades kept from an earlier evaluation against the same baseline version (see
    :class:`BaselineGrades`); tasks found there are not asked again, and the grades of the others are added to it.
    """
    graded_candidate, graded_baseline = await grade_both(
        llm, tasks, candidate, baseline, concurrency=concurrency, known=known
    )
    return pair_scores(graded_candidate, graded_baseline)


@dataclass
class BaselineGrades:
    """The grades of one baseline (live) version's answers, by task: a candidate rejected leaves the live version
    as it was, so the next candidate's evaluation needs only its own answers (half the generator calls)."""

    version: int
    grades: dict[str, Score | None] = field(default_factory=dict)

    @staticmethod
    def key(task: ValidationTask) -> str:
        return validation_line(task)


async def grade_both(
    llm: LLM,
    tasks: Sequence[ValidationTask],
    candidate: Playbook,
    baseline: Playbook,
    *,
    concurrency: int,
    known: BaselineGrades | None = None,
) -> tuple[list[Score | None], list[Score | None]]:
    """:func:`evaluate`'s grades task by task, before pairing: the candidate's, then the baseline's (None: no
    answer found). ``known`` as for :func:`evaluate` (ignored unless it is the baseline's version)."""
    gate = asyncio.Semaphore(concurrency)
    context = await context_tokens_of(llm, Role.GENERATOR)
    if known is not None and known.version != baseline.version:
        known = None

    async def run(task: ValidationTask, playbook: Playbook) -> Score | None:
        _, extracted = await answer_one(llm, task.task, playbook, context_tokens=context, gate=gate)
        async with gate:
            return await grade_answer(llm, task, extracted.answer)

    async def run_baseline(task: ValidationTask) -> Score | None:
        if known is not None and (key := BaselineGrades.key(task)) in known.grades:
            return known.grades[key]
        score = await run(task, baseline)
        if known is not None:
            known.grades[BaselineGrades.key(task)] = score
        return score

    graded = await asyncio.gather(*(run(t, candidate) for t in tasks), *(run_baseline(t) for t in tasks))
    return graded[: len(tasks)], graded[len(tasks) :]
