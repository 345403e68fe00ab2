"""The learner's three LLM roles, one call each, with parse retries and repair turns.

* :func:`reflect` — one reflector call for one trace against a frozen playbook;
* :func:`curate` — one curator call turning a group of reflections into a partial delta;
* :func:`merge` — one merge call selecting among the partial deltas of its children.

:mod:`combee.engine` composes them into a window; the stream workers call them one by one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from combee.embeddings import NearDuplicates
from combee.errors import LLMParseError
from combee.llm import LLM, REFUSED_BY_SERVER, ChatResponse, Role, context_tokens_of
from combee.meter import Meter
from combee.models import Bullet, DeltaOp, Playbook, Reflection, Trace
from combee.playbook import unite_ops
from combee.prompts import (
    DEFAULT_PROMPTS,
    RETRY_TEMPERATURES,
    Ask,
    PromptSet,
    Proposal,
    curator_ask,
    merger_ask,
    reflector_ask,
    resolve_merge,
)
from combee.screen import screen_reflection
from combee.sections import DEFAULT_SECTIONS

__all__ = ["CallOutcome", "curate", "fold_ops", "merge", "proposals_of", "reflect"]

T = TypeVar("T")
V = TypeVar("V")

log = logging.getLogger(__name__)

REJECTED_ECHO_CHARS = 400
"""How much of a rejected answer the warning log shows (enough to see prose, a fence or a cut-off object)."""


@dataclass(frozen=True)
class CallOutcome(Generic[V]):
    """A parsed value (None when every attempt failed to parse) and the time the calls took.

    ``service_s`` sums the server-reported service times of the attempts (client-side latency where the
    server reports none): the call's contribution to a critical path.
    """

    value: V | None
    service_s: float
    attempts: int


def _problem(error: LLMParseError, response: ChatResponse, max_tokens: int) -> str:
    """What to tell the model about its rejected answer."""
    if response.finish_reason == REFUSED_BY_SERVER:
        return (
            "the server could not read it as the one JSON object the schema asks for (wrapped in a Markdown code"
            " fence, or with comments or text around it); reply with the bare JSON object and nothing else"
        )
    if response.finish_reason == "length":
        return (
            f"it stopped at the {max_tokens}-token limit before the JSON object was complete ({error}); "
            "write fewer and shorter items so that the whole object fits"
        )
    return str(error)


async def _call_parsed(
    llm: LLM,
    ask: Ask[T],
    attempts: int,
    meter: Meter,
    clock: Callable[[], float],
    temperatures: Sequence[float] = RETRY_TEMPERATURES,
) -> CallOutcome[T]:
    """Ask until an answer parses, at most ``attempts`` times; every later attempt is a repair turn.

    A repair turn carries the rejected answer and the parser's error back to the model and raises the
    temperature (``temperatures[attempt]``, the last one repeating), so a re-ask can come out differently.
    """
    service = 0.0
    role = ask.role
    request = ask.request.model_copy(update={"temperature": temperatures[0]})
    for attempt in range(attempts):
        started = clock()
        response = await llm.complete(request)
        elapsed = clock() - started
        meter.record(role, response)
        service += response.service_time_s if response.service_time_s is not None else elapsed
        try:
            if response.finish_reason == REFUSED_BY_SERVER:
                raise LLMParseError("the server refused to return the answer", kind="refused_by_server")
            parsed = ask.parse(response.text)
        except LLMParseError as exc:
            meter.parse_failure(role, exc.kind)
            log.warning(
                "%s answer rejected (attempt %d of %d, %s, finish_reason=%s): %s; the answer began %r",
                role.value,
                attempt + 1,
                attempts,
                exc.kind,
                response.finish_reason,
                exc,
                response.text[:REJECTED_ECHO_CHARS],
            )
            if attempt + 1 < attempts:
                temperature = temperatures[min(attempt + 1, len(temperatures) - 1)]
                problem = _problem(exc, response, request.max_tokens)
                request = ask.again(attempt + 1, temperature=temperature, answer=response.text, problem=problem)
                if len(request.messages) > len(ask.request.messages):
                    meter.role(role).repairs += 1
            continue
        stats = meter.role(role)
        if attempt:
            stats.repaired += 1
        if parsed.invalid:
            stats.salvaged += 1
            stats.invalid_items += len(parsed.invalid)
        return CallOutcome(parsed.value, service, attempt + 1)
    meter.role(role).gave_up += 1
    return CallOutcome(None, service, attempts)


async def reflect(
    trace: Trace,
    playbook: Playbook,
    llm: LLM,
    *,
    meter: Meter,
    prompts: PromptSet = DEFAULT_PROMPTS,
    attempts: int = 3,
    clock: Callable[[], float] = time.monotonic,
    temperatures: Sequence[float] = RETRY_TEMPERATURES,
    sections: Sequence[str] = DEFAULT_SECTIONS,
    screen: bool = True,
) -> CallOutcome[Reflection]:
    """Reflect on one trace against ``playbook`` (frozen). A trace whose answers never parse yields None.

    With ``screen``, insights that record the run rather than teach a lesson are taken out of the reflection
    and counted by reason in ``meter.refused`` (:func:`combee.screen.screen_reflection`).

    The request is sized to the LLM's context for the role when it says one (:func:`context_tokens_of`);
    raises :class:`~combee.errors.ContextTooSmall` when not even the smallest request fits.
    """
    context = await context_tokens_of(llm, Role.REFLECTOR)
    ask = reflector_ask(trace, playbook, prompts, context_tokens=context, sections=sections)
    outcome = await _call_parsed(llm, ask, attempts, meter, clock, temperatures)
    if outcome.value is None:
        meter.skipped_traces += 1
    elif screen:
        screened = screen_reflection(outcome.value, trace)
        meter.refuse(reason for _, reason in screened.refused)
        meter.trim(screened.trimmed)
        return CallOutcome(screened.reflection, outcome.service_s, outcome.attempts)
    return outcome


async def curate(
    reflections: Sequence[Reflection],
    playbook: Playbook,
    llm: LLM,
    *,
    meter: Meter,
    prompts: PromptSet = DEFAULT_PROMPTS,
    attempts: int = 3,
    clock: Callable[[], float] = time.monotonic,
    temperatures: Sequence[float] = RETRY_TEMPERATURES,
    sections: Sequence[str] = DEFAULT_SECTIONS,
) -> CallOutcome[tuple[DeltaOp, ...]]:
    """One curator call over a group; a group whose answers never parse is skipped (value None), counted."""
    if not reflections:
        return CallOutcome((), 0.0, 0)
    context = await context_tokens_of(llm, Role.CURATOR)
    ask = curator_ask(reflections, playbook, prompts, context_tokens=context, sections=sections)
    outcome = await _call_parsed(llm, ask, attempts, meter, clock, temperatures)
    if outcome.value is None:
        meter.skipped_groups += 1
    return outcome


def proposals_of(partials: Sequence[Sequence[DeltaOp]]) -> list[Proposal]:
    """Number the children's operations ``p1..pN`` in child order (inputs sorted, so the prompt is stable)."""
    ops = [op for partial in partials for op in partial]
    return [Proposal(id=f"p{i + 1}", op=op) for i, op in enumerate(ops)]


async def merge(
    partials: Sequence[Sequence[DeltaOp]],
    playbook: Playbook,
    llm: LLM,
    *,
    meter: Meter,
    prompts: PromptSet = DEFAULT_PROMPTS,
    attempts: int = 3,
    clock: Callable[[], float] = time.monotonic,
    temperatures: Sequence[float] = RETRY_TEMPERATURES,
    dedup: NearDuplicates | None = None,
    sections: Sequence[str] = DEFAULT_SECTIONS,
) -> CallOutcome[tuple[DeltaOp, ...]]:
    """One merge call selecting among the children's operations.

    With ``dedup``, near-duplicate ADD proposals are collapsed first (the more specific wording kept), so the
    merge prompt shrinks; ``meter.folded_proposals`` counts them. With no proposals there is nothing to call.
    If every answer fails to parse, the children's operations pass through unmerged (exact duplicates
    dropped) and ``meter.merge_fallbacks`` counts it: every passed operation is a fully parsed curator
    proposal, so nothing half-parsed is applied, and a bad merge answer does not throw away the whole subtree.
    """
    if dedup is not None:
        partials = [await fold_ops(dedup, [op for partial in partials for op in partial], (), meter, proposals=True)]
    proposals = proposals_of(partials)
    if not proposals:
        return CallOutcome((), 0.0, 0)
    context = await context_tokens_of(llm, Role.MERGER)
    ask = merger_ask(proposals, playbook, prompts, context_tokens=context, sections=sections)
    outcome = await _call_parsed(llm, ask, attempts, meter, clock, temperatures)
    if outcome.value is None:
        meter.merge_fallbacks += 1
        return CallOutcome(unite_ops(partials), outcome.service_s, outcome.attempts)
    ops, unknown, redundant = resolve_merge(proposals, outcome.value)
    meter.unknown_proposal_ids += unknown
    meter.redundant_combines += redundant
    return CallOutcome(ops, outcome.service_s, outcome.attempts)


async def fold_ops(
    dedup: NearDuplicates, ops: Sequence[DeltaOp], bullets: Sequence[Bullet], meter: Meter, *, proposals: bool
) -> tuple[DeltaOp, ...]:
    started = time.perf_counter()
    folded, stats = await dedup.fold(ops, bullets, against_bullets=not proposals)
    meter.dedup_s += time.perf_counter() - started
    if proposals:
        meter.folded_proposals += stats.merged
    else:
        meter.folded_ops += stats.merged
    return folded
