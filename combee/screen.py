"""Is a proposed lesson a lesson? The screen between a reflector's answer and the reduce. Pure.

A small real model, asked what a run teaches, often answers with a record of the run instead: "The agent
correctly applied the formula Current Ratio ... resulting in a current ratio of 2.00", the run's own numbers
("the discount rate should be 8% + 6% = 14%"), or a rule called wrong and then given unchanged as the fix.
None of these helps on the next task, and each costs every later prompt its length. The prompts ask for
reusable lessons (combee/prompts/templates.py); this screen takes out, with a counted reason, what still is not.
It works sentence by sentence, because the local model usually writes the rule and then a worked example of
this run in one lesson ("The formula for ROI is (Gain − Cost) / Cost. In this case, ... = 2.00."): the example's
sentences go, the rule stays. A lesson with nothing left, or one that contradicts itself, is refused whole.
The reasons:

* ``records_the_run`` — it describes what the agent did or got in this run, not what to do;
* ``copies_the_answer`` — it states the run's numeric answer or ground truth;
* ``copies_run_numbers`` — it repeats several of the run's particular numbers (one number may name an example);
* ``contradicts_itself`` — it calls a rule wrong and gives the same rule as the correct one;
* ``about_the_playbook`` — it talks about the playbook or the learning ("the playbook does not contain any
  lessons ..."), not about the task.

A refused insight is dropped from its reflection before any curator sees it (the rest of the reflection
stays); :func:`screen_reflection` says why, for the meter. A curator or merger may write a worked example of
its own into an operation, so the window's operations are screened again (:func:`screen_ops`), each against the
facts of the runs it names as its sources (:class:`RunFacts`: a trace's particular numbers, its numeric answer,
a listed ground truth), which the stream's window plan carries from the mapper to the combiner.

The rules are deliberately narrow: a lesson lost to a false refusal is a lesson lost, so each rule is measured
on recorded answers of the local model (tests/unit/test_screen.py, tests/unit/fixtures/real_model/).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from combee.models import AddOp, DeltaOp, Insight, Reflection, Trace, UpdateOp

__all__ = [
    "REASONS",
    "RunFacts",
    "Screened",
    "Trimmed",
    "count_reasons",
    "run_facts",
    "run_numbers",
    "screen_lesson",
    "screen_ops",
    "screen_reflection",
    "trim_lesson",
]


REASONS = ("records_the_run", "copies_the_answer", "copies_run_numbers", "contradicts_itself", "about_the_playbook")


_RECORD_RES = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        # "The agent correctly applied ...", "the agent successfully calculated ...", "the model arrived at ..."
        r"\bthe (agent|model|assistant)\b[^.;:]{0,40}?\b(correctly|successfully|accurately|properly|rightly)\b",
        r"\bthe (agent|model|assistant) (arrived at|got|obtained|answered|returned|responded|produced|gave)\b",
        # "in this run", "for this question", "in this case"
        r"\b(in|for|on) this (run|task|question|case|example|trace|problem)\b",
        # "the answer was 10.00", "resulting in a current ratio of 2.00"
        r"\b(answer|result) (was|is|of) -?\$?\d",
        # "The correct answer should be 5238.00", "the expected result would have been $1,200"
        r"\b(correct|right|expected|true) (answer|result|value) (is|was|should (have )?be(en)?|would (have )?"
        r"be(en)?)\s*(approximately |about )?-?\$?\d",
        # "The correct answer should be the price of the bond, which is $20,000."
        r"\b(correct|right|expected|true) (answer|result) (is|was|should (have )?be(en)?|would (have )?be(en)?)\b"
        r"[^.;]{0,60}?,? (which|that) (is|was|comes to|equals)\s*(approximately |about )?-?\$?\d",
        r"\bresult(ing|ed) in (a|an|the)?\b[^.;]{0,40}\bof -?\$?\d",
        # a worked example: "Plugging these values into the formula gives ...", "Calculating this, we get ...",
        # "Therefore, the ROI on these materials is 2.00", "The agent provided the answer ..."
        r"\b(plug\w*|substitut\w*) (in )?(these|the|those) (values|numbers|figures)\b",
        r"\bwe (get|obtain|find|arrive at)\b",
        r"\btherefore,? the\b[^.;]{0,60}\b(is|are|was|equals?) (approximately |about )?[-$≈~]?\s?\d",
        r"\bthe (agent|model|assistant) (provided|answered|wrote|computed|calculated|interpreted|used|applied|made|"
        r"did not|didn't|failed to)\b",
        # what this run's output was: "The run output does not follow this rule", "The output '5324.00' is not
        # the correct answer", "the output was rounded to 2 decimal places"
        r"\bthe run'?s? output\b|\bthe output (was|were|provided|given|'|\")|\bprovided in the output\b",
        # "The agent's formulas and calculations were incorrect.", "The agent's output did not follow ..."
        r"\bthe (agent|model|assistant)'s (answer|output|response|formulas?|calculations?|verification|domain "
        r"knowledge|common mistakes)\b[^.;]{0,40}\b(was|were|did|provided|gave)\b",
        # "... is correctly stated and used in the run", "The formula I = P × r × t was used correctly"
        r"\b(in|from|of|during) the run\b",
        r"\b(is|was|were) (correctly|accurately|properly) (stated|used|applied|calculated|computed)\b",
        r"\b(was|were) (used|applied|calculated|computed|stated) (correctly|accurately|properly)\b",
        # "... but did not provide the correct answer", "but the answer was not rounded to 2 decimal places",
        # "The formula used to calculate the Future Value (FV) was incorrect."
        r"\bbut (it |the agent |they )?(did not|didn't|does not|failed to) (provide|give|get|compute|calculate|"
        r"round|account|include|use|apply|follow)\b",
        r"\bthe (answer|result|output) was not\b",
        r"\b(was|were) (used |applied |calculated |computed )?incorrect(ly)?\b",
        # "The agent should have used this formula to calculate the ratio", "... plugged in the given values"
        r"\bthe (agent|model|assistant) should have\b[^.;]{0,30}\b(this|these|that|those|the given|the provided)\b",
    )
)

_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")

_RECORD_CLAUSE_RE = re.compile(
    r",?\s+(?:but|whereas|while|however,?)\s+(?:the|this) (?:agent|model|assistant)\b", re.IGNORECASE
)
"""Where a sentence turns from the rule to what this run's agent did: "The formula for FCF should be FCF = OCF -
CapEx, but the agent used FCF = OCF + CapEx." The formula before it is kept when it passes on its own."""

_MIN_KEPT_CHARS = 24
"""A lesson trimmed to less than this is refused: what is left of it is no lesson."""

_ABOUT_PLAYBOOK_RE = re.compile(
    r"\b(the|this) playbook (does not|doesn't|did not|has no|had no|is empty|contains no|lacks|should (have )?"
    r"(include[ds]?|contain(s|ed)?|add(s|ed)?|provided?|given|stated?))\b"
    r"|\blessons learned from (earlier|previous|past) runs\b"
    # what the playbook says or lacks: "The playbook requires the answer to be ...", "The playbook already
    # provided the correct strategy ..., which is helpful", "the playbook only provides a formula"
    r"|\b(the|this) playbook (states|stated|says|said|requires|required|already|only|provides|provided|gives|gave)\b"
    # what it points at in the playbook: "The agent should have used the formula provided in the playbook."
    r"|\b(provided|given|stated|shown|listed|found|described|written) (in|by) (the|this) playbook\b",
    re.IGNORECASE,
)

_FORMULA_RE = re.compile(r"[A-Za-z)\]]\s*=\s*\S")
"""A sentence that states a formula keeps it even when it talks about the playbook ("ROI is given in the
playbook: ROI = ..."): the formula is a lesson, and a copy of a bullet is the de-duplicator's to fold."""

_NEGATIVE_RE = re.compile(r"\b(incorrect(ly)?|wrong(ly)?|mistaken(ly)?|instead of|erroneous(ly)?|not correct)\b", re.I)

# "FV = PV × (1 + r)^n": the name before "=" and the right-hand side up to the end of its clause
_EXPRESSION_RE = re.compile(r"([A-Za-z_][\w]*)\s*=\s*((?:[^,;.]|\.\d){1,80})")

_NUMBER_RE = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")

_TRIVIAL = frozenset({"0", "1", "2", "3", "4", "5", "10", "12", "100", "365", "360"})
"""Numbers too common in rules to say anything about one run (periods, percent, counts)."""

_RUN_NUMBERS_REFUSED = 2


_MAX_RUN_NUMBERS = 256
"""A run's particular numbers kept in its :class:`RunFacts` (a bound on the window plan's size; a trace with more
keeps its first ones in the order they occur)."""

_MAX_TRUTH_CHARS = 2000


def _canonical_number(raw: str) -> str | None:
    text = raw.replace(",", "")
    try:
        value = float(text)
    except ValueError:
        return None
    return f"{value:.6g}"


def _canonical_numbers(text: str) -> Iterator[str]:
    """The numbers of ``text`` in the order they occur, canonical."""
    for m in _NUMBER_RE.finditer(text):
        number = _canonical_number(m.group(0))
        if number is not None:
            yield number


def _numbers(text: str) -> set[str]:
    return set(_canonical_numbers(text))


def _particular(number: str) -> bool:
    """A canonical number that can say something about one run (not one of :data:`_TRIVIAL`)."""
    return number.lstrip("-") not in _TRIVIAL


def _run_numbers_in_order(trace: Trace) -> tuple[str, ...]:
    texts = [trace.task, trace.output, *(s.content for s in trace.steps)]
    texts += [t for t in (trace.feedback.ground_truth, trace.feedback.message) if t]
    return tuple(dict.fromkeys(n for t in texts for n in _canonical_numbers(t) if _particular(n)))


def run_numbers(trace: Trace) -> set[str]:
    """The particular numbers of a run (its task, steps, output and feedback), canonical, trivial ones aside."""
    return set(_run_numbers_in_order(trace))


def _answers(trace: Trace) -> set[str]:
    """The run's numeric answer and ground truth (when they are numbers), canonical."""
    number = _canonical_number((trace.feedback.ground_truth or "").strip().replace("$", "").replace("%", ""))
    return {number} if number is not None and _particular(number) else set()


def _listed_truth(trace: Trace) -> str | None:
    """A ground truth of several answers ("OperatingLeaseCost,DebtInstrument..."), spaces out and case folded;
    None when it is one answer. One answer alone may be what a lesson teaches (a FiNER lesson names the tag a
    phrase maps to), so only a list of them counts as a copy of the run's truth."""
    truth = re.sub(r"\s+", "", trace.feedback.ground_truth or "").casefold()
    return truth if "," in truth and len(truth) >= 20 else None


class RunFacts(BaseModel):
    """What the screen's run rules need of one or more runs: their particular numbers, their numeric answers
    and their listed ground truths (see :func:`run_numbers`, :func:`_answers`, :func:`_listed_truth`).
    Serialisable, so the stream's window plan carries a trace's facts to the combiner, which has no traces."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    numbers: tuple[str, ...] = Field(default=(), max_length=_MAX_RUN_NUMBERS)
    answers: tuple[str, ...] = Field(default=(), max_length=4)
    truths: tuple[str, ...] = Field(default=(), max_length=4)

    @classmethod
    def of(cls, trace: Trace) -> RunFacts:
        truth = _listed_truth(trace)
        return cls(
            numbers=_run_numbers_in_order(trace)[:_MAX_RUN_NUMBERS],
            answers=tuple(sorted(_answers(trace))),
            truths=(truth[:_MAX_TRUTH_CHARS],) if truth else (),
        )

    @staticmethod
    def union(facts: Iterable[RunFacts]) -> RunFacts | None:
        """The facts of several runs as one (what an operation taught by several traces is judged against);
        None for no runs. Not bounded: it is judged, not stored."""
        items = list(facts)
        if not items:
            return None
        return RunFacts.model_construct(
            numbers=tuple(dict.fromkeys(n for f in items for n in f.numbers)),
            answers=tuple(dict.fromkeys(a for f in items for a in f.answers)),
            truths=tuple(dict.fromkeys(t for f in items for t in f.truths)),
        )

    def copies_truth(self, lesson: str) -> bool:
        """Does ``lesson`` copy one of the runs' listed ground truths whole?"""
        flat = re.sub(r"\s+", "", lesson).casefold()
        return any(t in flat for t in self.truths)


def run_facts(traces: Iterable[Trace]) -> dict[str, RunFacts]:
    """Trace id -> its :class:`RunFacts`, for :func:`screen_ops`."""
    return {t.trace_id: RunFacts.of(t) for t in traces}


def _facts(run: Trace | RunFacts | None) -> RunFacts | None:
    return RunFacts.of(run) if isinstance(run, Trace) else run


def _normalised_expression(text: str) -> str:
    return re.sub(r"[\s*×·]", "", text).casefold()


def _contradicts_itself(lesson: str) -> bool:
    if not _NEGATIVE_RE.search(lesson):
        return False
    seen: set[str] = set()
    for m in _EXPRESSION_RE.finditer(lesson):
        rhs = _normalised_expression(m.group(2))
        if len(rhs) < 3:
            continue
        expr = _normalised_expression(m.group(1)) + "=" + rhs
        if expr in seen:
            return True
        seen.add(expr)
    return False


def screen_lesson(lesson: str, trace: Trace | RunFacts | None = None) -> str | None:
    """The reason ``lesson``, taken whole, is not a reusable lesson (one of :data:`REASONS`), or None.

    ``trace``: the run it was learned from, or the facts of the runs (:class:`RunFacts`). Without it only the
    rules that need no run are applied (``records_the_run``, ``about_the_playbook``, ``contradicts_itself``)."""
    if any(r.search(lesson) for r in _RECORD_RES):
        return "records_the_run"
    if _ABOUT_PLAYBOOK_RE.search(lesson) and not _FORMULA_RE.search(lesson):
        return "about_the_playbook"
    if _contradicts_itself(lesson):
        return "contradicts_itself"
    run = _facts(trace)
    if run is not None:
        numbers = _numbers(lesson)
        if numbers.intersection(run.answers) or run.copies_truth(lesson):
            return "copies_the_answer"
        if len(numbers.intersection(run.numbers)) >= _RUN_NUMBERS_REFUSED:
            return "copies_run_numbers"
    return None


@dataclass(frozen=True)
class Trimmed:
    """What the screen keeps of a lesson (None: nothing) and why each sentence it took out went, in order."""

    kept: str | None
    dropped: tuple[str, ...] = ()

    @property
    def refused(self) -> str | None:
        """The reason the whole lesson goes (the first sentence's), or None when something is kept."""
        return self.dropped[0] if self.kept is None and self.dropped else None


def trim_lesson(lesson: str, trace: Trace | RunFacts | None = None) -> Trimmed:
    """``lesson`` without its sentences that :func:`screen_lesson` refuses (a self-contradiction is judged on
    the whole lesson). Nothing left, or less than a short sentence, refuses the lesson."""
    trace = _facts(trace)  # once, not per sentence
    if _contradicts_itself(lesson):
        return Trimmed(None, ("contradicts_itself",))
    sentences = [part.strip() for part in _SENTENCE_RE.split(lesson.strip()) if part.strip()]
    kept: list[str] = []
    dropped: list[str] = []
    for sentence in sentences:
        reason = screen_lesson(sentence, trace)
        if reason is None:
            kept.append(sentence)
            continue
        dropped.append(reason)
        head = _rule_before_the_record(sentence, trace) if reason == "records_the_run" else None
        if head is not None:
            kept.append(head)
    text = " ".join(kept)
    if not dropped:
        return Trimmed(lesson)
    if len(text) < _MIN_KEPT_CHARS:
        return Trimmed(None, tuple(dropped))
    return Trimmed(text, tuple(dropped))


def _rule_before_the_record(sentence: str, trace: RunFacts | None) -> str | None:
    """The formula a sentence states before it turns to what the agent did (:data:`_RECORD_CLAUSE_RE`), as a
    sentence of its own, when that part states a formula, alone passes the screen and is long enough to be a
    lesson; else None. Only a formula: what else the local model writes there is this run's answer or tags ("The
    correct tags are 'A,B'") or says nothing."""
    m = _RECORD_CLAUSE_RE.search(sentence)
    if m is None:
        return None
    head = sentence[: m.start()].rstrip(" ,;:") + "."
    if len(head) < _MIN_KEPT_CHARS or not _FORMULA_RE.search(head) or screen_lesson(head, trace) is not None:
        return None
    return head


@dataclass(frozen=True)
class Screened:
    """A reflection with its insights screened: refused ones taken out, trimmed ones shortened; why each
    refused insight went, and the reasons of the sentences trimmed from the ones kept."""

    reflection: Reflection
    refused: tuple[tuple[Insight, str], ...] = ()
    trimmed: tuple[str, ...] = ()


def screen_reflection(reflection: Reflection, trace: Trace | None) -> Screened:
    """``reflection`` with each insight passed through :func:`trim_lesson` (tags and diagnosis untouched)."""
    kept: list[Insight] = []
    refused: list[tuple[Insight, str]] = []
    trimmed: list[str] = []
    facts = _facts(trace)  # once for every insight
    for insight in reflection.insights:
        t = trim_lesson(insight.content, facts)
        if t.kept is None:
            refused.append((insight, t.refused or "records_the_run"))
            continue
        trimmed.extend(t.dropped)
        kept.append(insight if t.kept == insight.content else insight.model_copy(update={"content": t.kept}))
    if not refused and not trimmed:
        return Screened(reflection)
    return Screened(reflection.model_copy(update={"insights": tuple(kept)}), tuple(refused), tuple(trimmed))


def count_reasons(screened: Iterable[Screened]) -> dict[str, int]:
    """How many insights each reason refused, over ``screened``."""
    counts = dict.fromkeys(REASONS, 0)
    for s in screened:
        for _, reason in s.refused:
            counts[reason] += 1
    return counts


def screen_ops(
    ops: Iterable[DeltaOp],
    runs: Mapping[str, RunFacts] | None = None,
) -> tuple[tuple[DeltaOp, ...], tuple[tuple[DeltaOp, str], ...], tuple[str, ...]]:
    """A window's operations with every ADD or UPDATE text trimmed (a curator or merger may write a record of a
    run too, or a worked example with a run's numbers), and those with nothing left taken out. An operation is
    judged against the facts of the runs it names as sources and ``runs`` knows (trace id -> facts); one with
    none known, by the rules that need no run. Returns the operations, the refused ones with their reason, and
    the reasons of the sentences trimmed from the kept ones."""
    kept: list[DeltaOp] = []
    refused: list[tuple[DeltaOp, str]] = []
    trimmed: list[str] = []
    for op in ops:
        if not isinstance(op, AddOp | UpdateOp):
            kept.append(op)
            continue
        facts = RunFacts.union(runs[s] for s in op.sources if s in runs) if runs else None
        t = trim_lesson(op.content, facts)
        if t.kept is None:
            refused.append((op, t.refused or "records_the_run"))
            continue
        trimmed.extend(t.dropped)
        kept.append(op if t.kept == op.content else op.model_copy(update={"content": t.kept}))
    return tuple(kept), tuple(refused), tuple(trimmed)
