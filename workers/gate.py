"""The gate in the worker that owns a namespace: evaluate the pending candidate on the validation set and decide.

Called by :func:`workers.promotion.check_namespace` (the canary's place). Reads the namespace's validation set
(its own, kept in Redis by ``combee prompt policy NS gate --validation FILE``, else the worker's default,
``COMBEE_PROMOTION_GATE_VALIDATION_FILE``), the candidate's and the live version's playbooks from the store, runs
:func:`combee.gate.evaluate` with the worker's LLM and returns :func:`combee.gate.decide_gate`'s decision. The
caller records it (once per version: the decision script refuses an id recorded before or a stale live version).
"""

from __future__ import annotations

import logging
from collections import Counter

from combee.errors import ConfigError
from combee.gate import BaselineGrades, decide_gate, evaluate, promote_same_lessons, same_lessons, too_few_tasks
from combee.holdout import holdout_task
from combee.models import Playbook, Trace
from combee.promotion import Decision
from combee.serving import Serving, pending_candidate
from combee.validation import ValidationTask, parse_validation, validation_line
from workers.context import StageContext

__all__ = ["gate_decision", "keep_holdout", "validation_set"]

log = logging.getLogger("combee.worker.gate")


async def keep_holdout(ctx: StageContext, namespace: str, held: tuple[Trace, ...]) -> None:
    """Keep a window's held-out traces as the namespace's validation tasks (each once, within the cap). Redis
    failing is logged and the window goes on: a held-out trace is never learned from, kept or not."""
    if not held or ctx.serving is None:
        return
    promotion = ctx.config.promotion
    lines = {t.trace_id: validation_line(holdout_task(t, promotion.gate_grader)) for t in held}
    try:
        await ctx.serving.hold_out(namespace, lines, cap=promotion.gate_holdout_max)
    except Exception as exc:  # the learning of the window must not wait on the validation set
        log.warning("%s: %d held-out traces not kept: %s", namespace, len(held), exc)


def _parsed(text: str, namespace: str, what: str, grader: str) -> tuple[ValidationTask, ...]:
    try:
        return parse_validation(text, default_grader=grader, source=f"{namespace}'s {what}")
    except ConfigError as exc:
        log.error("%s: the gate's %s in Redis is unusable: %s", namespace, what, exc)
        return ()


async def validation_set(ctx: StageContext, namespace: str) -> tuple[tuple[ValidationTask, ...], str]:
    """The namespace's validation tasks and where they come from: its own set (``redis``) or the worker's default
    (``file:<name>``), then its held-out traces (``+holdout``). A set kept in Redis that no longer parses is
    logged and left out."""
    promotion = ctx.config.promotion
    if ctx.serving is None:
        return promotion.gate_tasks, promotion.gate_source
    own = await ctx.serving.validation(namespace)
    tasks, source = promotion.gate_tasks, promotion.gate_source
    if own is not None:
        tasks, source = _parsed(own, namespace, "validation set", promotion.gate_grader), "redis"
    held = await _held_out(ctx, namespace)
    if held:
        tasks, source = (*tasks, *held), f"{source}+holdout" if source else "holdout"
    return tasks, source


async def _held_out(ctx: StageContext, namespace: str) -> tuple[ValidationTask, ...]:
    """The namespace's held-out traces as tasks, without those a forget rule names (made after they were kept)."""
    assert ctx.serving is not None
    lines = await ctx.serving.held_out(namespace)
    if not lines:
        return ()
    tasks = _parsed("\n".join(lines), namespace, "held-out traces", ctx.config.promotion.gate_grader)
    rules = await ctx.forget_rules.rules() if ctx.forget_rules is not None else ()
    return tuple(t for t in tasks if not any(rule.covers(namespace, t.producer) for rule in rules))


async def _playbook(ctx: StageContext, namespace: str, version: int) -> Playbook | None:
    found = await ctx.store.get_version(namespace, version)
    return Playbook.model_validate_json(found.playbook_json) if found is not None else None


def _wait(ctx: StageContext, namespace: str, candidate: int, why: str) -> None:
    """Say once per candidate why it waits (the check runs every few seconds)."""
    if ctx.gate_waits.get(namespace) != candidate:
        ctx.gate_waits[namespace] = candidate
        log.warning("%s: gate: candidate v%d waits: %s", namespace, candidate, why)


async def gate_decision(ctx: StageContext, namespace: str, state: Serving, head: int, now: float) -> Decision | None:
    """The gate's decision on the pending candidate (the head), or None: not gated, nothing pending, too few
    validation tasks (it waits, said once in the log), or a playbook not retained. LLM errors propagate (the
    next check evaluates again)."""
    candidate = pending_candidate(state, head)
    rule = ctx.config.promotion.gate
    if state.policy != "gate" or candidate is None:
        return None
    if state.live is None:
        return decide_gate(state, candidate, None, rule, at=now)
    cand, live = await _playbook(ctx, namespace, candidate), await _playbook(ctx, namespace, state.live)
    if cand is None or live is None:
        _wait(ctx, namespace, candidate, f"v{candidate} or the live v{state.live} is no longer in the store")
        return None
    if same_lessons(cand, live):
        return promote_same_lessons(state, candidate, at=now)
    tasks, source = await validation_set(ctx, namespace)
    why = too_few_tasks(len(tasks), rule)
    if why is not None:
        _wait(ctx, namespace, candidate, why)
        return None
    log.info("%s: gate: evaluating v%d against the live v%d on %d tasks", namespace, candidate, state.live, len(tasks))
    known = ctx.gate_baselines.get(namespace)
    if known is None or known.version != live.version:
        known = ctx.gate_baselines[namespace] = BaselineGrades(live.version)
    reused = sum(BaselineGrades.key(t) in known.grades for t in tasks)
    if reused:
        log.info(
            "%s: gate: the live v%d's answers to %d of the tasks kept from before", namespace, live.version, reused
        )
    pairs = await evaluate(ctx.llm, tasks, cand, live, concurrency=rule.concurrency, known=known)
    log.info(
        "%s: gate: evaluated v%d against the live v%d: %d of %d tasks right with the candidate, %d with the live",
        namespace, candidate, state.live, pairs.both + pairs.candidate_only, pairs.n, pairs.both + pairs.baseline_only,
    )  # fmt: skip
    graders = dict(sorted(Counter(t.grader for t in tasks).items()))
    validation = {"source": source, "tasks": len(tasks), "graders": graders}
    return decide_gate(state, candidate, pairs, rule, at=now, validation=validation)
