"""The agent side of the finance harness: answer a question with a playbook, grade it, make it a trace.

The agent is the generator role: :func:`combee.prompts.generator_request` puts the playbook in the system
message (the shared prefix a llama.cpp or hosted server can reuse) and the question in the user message; the
answer goes through :func:`combee.answers.extract_answer`. A graded :class:`Attempt` becomes a
:class:`combee.models.Trace` the way ACE's environment reports a run to its reflector: the question as the task,
the agent's reasoning and final answer as the output, and feedback with a success flag and a message that
states the ground truth.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from combee.answers import Extracted, answer_one
from combee.llm import LLM, ChatResponse, Role, context_tokens_of
from combee.models import LIMITS, Feedback, Playbook, Trace
from combee.tasks.data import Question
from combee.tasks.grading import formula_correct, formula_exact, grade_finer

__all__ = ["Attempt", "Grade", "answer_all", "clip", "grade", "to_trace"]


@dataclass(frozen=True)
class Grade:
    """``score``: the headline per-question value (Formula: 1/0 under this project's rule; FiNER: the share of
    labels right). ``upstream``: the same under the upstream rule. ``success``: the training signal (Formula:
    correct; FiNER: all labels right). ``detail``: a short human phrase for the feedback message."""

    score: float
    upstream: float
    success: bool
    detail: str = ""


def grade(task: str, prediction: str | None, target: str) -> Grade:
    """Grade ``prediction`` (``None``: no answer found) against ``target`` with ``task``'s rules."""
    if task == "formula":
        if prediction is None:
            return Grade(0.0, 0.0, False)
        ok = formula_correct(prediction, target)
        return Grade(float(ok), float(formula_exact(prediction, target)), ok)
    if task == "finer":
        g = grade_finer(prediction or "", target)
        return Grade(g.accuracy, g.accuracy, g.all_correct, f"{g.correct} of {g.total} labels right")
    raise ValueError(f"unknown task {task!r}")


@dataclass(frozen=True)
class Attempt:
    """One question answered with one playbook: the raw reply, the answer found in it, the grade."""

    question: Question
    raw: str
    extracted: Extracted
    grade: Grade
    response: ChatResponse

    def record(self) -> dict[str, object]:
        """A JSON-able line for ``answers/<method>.jsonl``."""
        return {
            "id": self.question.id,
            "target": self.question.target,
            "answer": self.extracted.answer,
            "found_by": self.extracted.how,
            "score": self.grade.score,
            "upstream": self.grade.upstream,
            "success": self.grade.success,
            "raw": self.raw,
            "cached": self.response.cached,
        }


async def answer_all(
    llm: LLM,
    task: str,
    questions: Sequence[Question],
    playbook: Playbook,
    *,
    concurrency: int,
    progress: Callable[[int, int], None] | None = None,
) -> list[Attempt]:
    """Answer and grade every question with ``playbook``; results in the order of ``questions``.

    Requests are sized to the LLM's context window when it says one (a playbook too large to fit is shown in
    part, by :func:`combee.prompts.generator_request`); a question that cannot fit at all is not sent and
    counts as unanswered (``found_by = "too_long"``). At most ``concurrency`` requests are in flight.
    LLM-layer errors (the endpoint is gone) propagate.
    """
    gate = asyncio.Semaphore(concurrency)
    done = 0
    context = await context_tokens_of(llm, Role.GENERATOR)

    async def one(q: Question) -> Attempt:
        nonlocal done
        response, extracted = await answer_one(llm, q.context, playbook, context_tokens=context, gate=gate)
        attempt = Attempt(q, response.text, extracted, grade(task, extracted.answer, q.target), response)
        done += 1
        if progress is not None:
            progress(done, len(questions))
        return attempt

    return list(await asyncio.gather(*(one(q) for q in questions)))


def clip(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: the head and the tail kept, the middle replaced by a marker."""
    if len(text) <= limit:
        return text
    marker = "\n[… {} characters omitted …]\n"
    room = limit - len(marker.format(len(text)))
    head = room // 2
    tail = room - head
    return text[:head] + marker.format(len(text) - head - tail) + text[len(text) - tail :]


def _reasoning(raw: str) -> str | None:
    # Display only: the answer itself is read by extract_answer; here the reasoning, if the reply is JSON with one.
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        return None
    value = obj.get("reasoning") if isinstance(obj, dict) else None
    return value.strip() if isinstance(value, str) and value.strip() else None


def _message(attempt: Attempt) -> str:
    truth = attempt.question.target
    answer = attempt.extracted.answer
    if answer is None:
        return f"Incorrect: no final answer could be read from the agent's reply. The ground truth is {truth!r}."
    verdict = "Correct" if attempt.grade.success else "Incorrect"
    detail = f" ({attempt.grade.detail})" if attempt.grade.detail else ""
    return f"{verdict}{detail}: the agent answered {answer!r}; the ground truth is {truth!r}."


def to_trace(attempt: Attempt, *, namespace: str, playbook_version: int = 0) -> Trace:
    """The trace ``combee learn`` consumes for one graded attempt (texts clipped to the trace limits)."""
    reasoning = _reasoning(attempt.raw)
    answer = attempt.extracted.answer
    if reasoning is not None and answer is not None:
        output = f"Reasoning: {reasoning}\nFinal answer: {answer}"
    else:
        output = attempt.raw
    return Trace(
        trace_id=f"{namespace}-{attempt.question.id}".replace(":", "-"),
        namespace=namespace,
        task=clip(attempt.question.context, LIMITS.task_chars),
        output=clip(output, LIMITS.output_chars),
        feedback=Feedback(
            score=attempt.grade.score,
            success=attempt.grade.success,
            ground_truth=clip(attempt.question.target, LIMITS.ground_truth_chars),
            message=clip(_message(attempt), LIMITS.feedback_chars),
        ),
        playbook_version=playbook_version,
        metadata={"question_id": attempt.question.id, "answer_found_by": attempt.extracted.how},
    )
