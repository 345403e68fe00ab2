"""The method: one iteration over a window of traces, for Combee and for the two baselines.

Building blocks (also used one by one by the stream workers):

* :func:`reflect` — one reflector call (with parse retries) for one trace against a frozen playbook;
* :func:`curate` — one curator call turning a group of reflections into a partial delta;
* :func:`merge` — one merge call selecting among the partial deltas of its children;
* :func:`run_window` — map → tags → augmented shuffle → grouped curation → merge tree → apply.

Methods: ``combee`` (the plan of :mod:`combee.plan`), ``naive`` (one curator call over every reflection of
the window) and ``sequential`` (windows of one trace: reflect, curate, apply — ACE as published). All three
share every call and parser, so comparisons differ only in the reduce.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar, get_args

from combee.embeddings import NearDuplicates
from combee.errors import LLMParseError
from combee.llm import LLM, ChatResponse, Role, context_tokens_of
from combee.meter import Meter
from combee.models import Bullet, Delta, DeltaOp, Playbook, Reflection, Trace
from combee.plan import Forest, KeyedPlan, ReducePlan, flatten_keyed, flatten_reduce, plan_keyed, plan_reduce, window_id
from combee.playbook import ApplyPolicy, ApplyStats, apply_delta, count_tags, unite_ops
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

__all__ = [
    "DEFAULT_SHUFFLE_KEY",
    "SHUFFLE_KEYS",
    "CallOutcome",
    "Method",
    "MethodConfig",
    "ShuffleKey",
    "Window",
    "WindowResult",
    "curate",
    "fold_delta_ops",
    "merge",
    "proposals_of",
    "reflect",
    "run_window",
]

T = TypeVar("T")
V = TypeVar("V")

log = logging.getLogger(__name__)

REJECTED_ECHO_CHARS = 400
"""How much of a rejected answer the warning log shows (enough to see prose, a fence or a cut-off object)."""


class Method(enum.StrEnum):
    COMBEE = "combee"
    SEQUENTIAL = "sequential"
    NAIVE = "naive"


ShuffleKey = Literal["none", "section", "section-union"]
SHUFFLE_KEYS: tuple[str, ...] = get_args(ShuffleKey)
DEFAULT_SHUFFLE_KEY: ShuffleKey = "section-union"
"""The default reduce shape (docs/benchmarks.md, issue 12: under the gpu profile, SIMULATED, it keeps 0.93x
sequential's retention at merge factor 1, where the paper's shape keeps 0.17x)."""


def reflection_key(reflection: Reflection) -> str:
    """The routing key of a reflection in a keyed shuffle: its first insight's section ("" without insights)."""
    return str(reflection.insights[0].section) if reflection.insights else ""


@dataclass(frozen=True)
class MethodConfig:
    """Knobs of the reduce. Defaults are the paper's (p = 2, k = ⌊√n⌋) plus Combee's tree bounds."""

    method: Method = Method.COMBEE
    p: int = 2
    max_group_items: int = 24
    max_fan_in: int = 12
    group_factor: float = 1.0
    # The reduce's shape: "none" = the paper's (one augmented shuffle over the window); "section" = a keyed
    # shuffle routing each reflection by its first insight's section, each section reduced on its own and the
    # sections' deltas united; "section-union" (the default) = the same with no merge call (partials united
    # within a key too).
    shuffle_key: str = DEFAULT_SHUFFLE_KEY
    parse_attempts: int = 3
    retry_temperatures: tuple[float, ...] = RETRY_TEMPERATURES
    policy: ApplyPolicy = field(default_factory=ApplyPolicy)

    def __post_init__(self) -> None:
        if self.p < 1:
            raise ValueError("p (duplication factor) must be >= 1")
        if self.parse_attempts < 1:
            raise ValueError("parse_attempts must be >= 1")
        if not self.retry_temperatures or any(t < 0 for t in self.retry_temperatures):
            raise ValueError("retry_temperatures must be a non-empty list of temperatures >= 0")
        if self.shuffle_key not in SHUFFLE_KEYS:
            raise ValueError(f"shuffle_key must be one of {', '.join(SHUFFLE_KEYS)}, got {self.shuffle_key!r}")

    def plan_keyed(self, reflections: Sequence[Reflection], seed_key: str) -> KeyedPlan:
        """The keyed reduce of ``reflections`` (``shuffle_key`` other than "none")."""
        return plan_keyed(
            [reflection_key(r) for r in reflections],
            self.p,
            seed_key,
            max_group_items=self.max_group_items,
            max_fan_in=self.max_fan_in,
            group_factor=self.group_factor,
            merge_within_key=self.shuffle_key != "section-union",
        )

    def forest(self, reflections: Sequence[Reflection], seed_key: str) -> Forest:
        """The window's reduce laid out for the stream workers: the same groups, merges and union that
        :func:`run_window` executes for Combee on the same reflections and seed (an empty forest for none)."""
        if not reflections:
            return Forest()
        if self.shuffle_key != "none":
            return flatten_keyed(self.plan_keyed(reflections, seed_key))
        return flatten_reduce(self.plan(len(reflections), seed_key))

    def plan(self, n: int, seed_key: str) -> ReducePlan:
        return plan_reduce(
            n,
            self.p,
            seed_key,
            max_group_items=self.max_group_items,
            max_fan_in=self.max_fan_in,
            group_factor=self.group_factor,
        )


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
) -> CallOutcome[Reflection]:
    """Reflect on one trace against ``playbook`` (frozen). A trace whose answers never parse yields None.

    The request is sized to the LLM's context for the role when it says one (:func:`context_tokens_of`);
    raises :class:`~combee.errors.ContextTooSmall` when not even the smallest request fits.
    """
    context = await context_tokens_of(llm, Role.REFLECTOR)
    ask = reflector_ask(trace, playbook, prompts, context_tokens=context)
    outcome = await _call_parsed(llm, ask, attempts, meter, clock, temperatures)
    if outcome.value is None:
        meter.skipped_traces += 1
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
) -> CallOutcome[tuple[DeltaOp, ...]]:
    """One curator call over a group; a group whose answers never parse is skipped (value None), counted."""
    if not reflections:
        return CallOutcome((), 0.0, 0)
    context = await context_tokens_of(llm, Role.CURATOR)
    ask = curator_ask(reflections, playbook, prompts, context_tokens=context)
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
) -> CallOutcome[tuple[DeltaOp, ...]]:
    """One merge call selecting among the children's operations.

    With ``dedup``, near-duplicate ADD proposals are collapsed first (the more specific wording kept), so the
    merge prompt shrinks; ``meter.folded_proposals`` counts them. With no proposals there is nothing to call.
    If every answer fails to parse, the children's operations pass through unmerged (exact duplicates
    dropped) and ``meter.merge_fallbacks`` counts it: every passed operation is a fully parsed curator
    proposal, so nothing half-parsed is applied, and a bad merge answer does not throw away the whole subtree.
    """
    if dedup is not None:
        partials = [await _fold(dedup, [op for partial in partials for op in partial], (), meter, proposals=True)]
    proposals = proposals_of(partials)
    if not proposals:
        return CallOutcome((), 0.0, 0)
    context = await context_tokens_of(llm, Role.MERGER)
    ask = merger_ask(proposals, playbook, prompts, context_tokens=context)
    outcome = await _call_parsed(llm, ask, attempts, meter, clock, temperatures)
    if outcome.value is None:
        meter.merge_fallbacks += 1
        return CallOutcome(unite_ops(partials), outcome.service_s, outcome.attempts)
    ops, unknown = resolve_merge(proposals, outcome.value)
    meter.unknown_proposal_ids += unknown
    return CallOutcome(ops, outcome.service_s, outcome.attempts)


async def _fold(
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


async def fold_delta_ops(
    dedup: NearDuplicates | None, ops: Sequence[DeltaOp], playbook: Playbook, meter: Meter
) -> tuple[DeltaOp, ...]:
    """A window's final operations with near duplicates folded (into ``playbook``'s bullets and one another).

    This is what gets applied and logged, so applying it again (a replay) needs no vectors.
    """
    if dedup is None or not ops:
        return tuple(ops)
    return await _fold(dedup, ops, playbook.bullets, meter, proposals=False)


@dataclass(frozen=True)
class Window:
    """A batch of traces of one namespace, identified by where its offsets come from.

    ``seed_key`` seeds the shuffle; it defaults to the window id, and a replay into another namespace keeps
    the original's so that it makes the same plan.
    """

    namespace: str
    source: str
    first_offset: int
    last_offset: int
    traces: tuple[Trace, ...]
    seed_key: str | None = None

    @property
    def id(self) -> str:
        return window_id(self.namespace, self.source, self.first_offset, self.last_offset)

    @property
    def seed(self) -> str:
        return self.seed_key or self.id


@dataclass
class WindowResult:
    """One iteration: the delta, the playbook after it, and what it cost."""

    window_id: str
    delta: Delta
    playbook: Playbook
    apply_stats: ApplyStats
    meter: Meter
    plan: ReducePlan | None
    wall_s: float
    critical_path_s: float
    reflections: int
    keyed: KeyedPlan | None = None


async def _gather(aws: Sequence[Awaitable[V]]) -> list[V]:
    return list(await asyncio.gather(*aws))


async def run_window(
    window: Window,
    playbook: Playbook,
    llm: LLM,
    config: MethodConfig,
    *,
    prompts: PromptSet = DEFAULT_PROMPTS,
    clock: Callable[[], float] = time.monotonic,
    dedup: NearDuplicates | None = None,
) -> WindowResult:
    """Run one iteration of ``config.method`` on ``window`` against ``playbook`` (frozen for the iteration).

    With ``dedup`` (semantic de-duplication), near-duplicate proposals collapse before every merge call and
    the final delta's ADDs are folded into near-duplicate bullets (or one another) before it is applied —
    the same for all three methods.

    Raises the LLM layer's :class:`combee.errors.LLMUnavailable` / ``LLMRateLimited`` if the endpoint stays
    down past its retries; bad answers never raise (they are retried, then skipped and counted in the meter).
    """
    started = clock()
    meter = Meter()
    attempts = config.parse_attempts
    kw = {
        "meter": meter,
        "prompts": prompts,
        "attempts": attempts,
        "clock": clock,
        "temperatures": config.retry_temperatures,
    }

    reflected = await _gather([reflect(t, playbook, llm, **kw) for t in window.traces])  # type: ignore[arg-type]
    map_s = max((o.service_s for o in reflected), default=0.0)
    reflections = [o.value for o in reflected if o.value is not None]
    tags = count_tags(reflections)

    plan: ReducePlan | None = None
    keyed: KeyedPlan | None = None
    if not reflections:
        ops: tuple[DeltaOp, ...] = ()
        reduce_s = 0.0
    elif config.method is Method.COMBEE and config.shuffle_key != "none":
        keyed = config.plan_keyed(reflections, window.seed)
        ops, reduce_s = await _reduce_keyed(keyed, reflections, playbook, llm, {**kw, "dedup": dedup})
    elif config.method is Method.COMBEE:
        plan = config.plan(len(reflections), window.seed)
        ops, reduce_s = await _reduce(plan, reflections, playbook, llm, {**kw, "dedup": dedup})
    else:  # sequential (a window of one) and naive: one curator call over every reflection
        outcome = await curate(reflections, playbook, llm, **kw)  # type: ignore[arg-type]
        ops, reduce_s = outcome.value or (), outcome.service_s

    ops = await fold_delta_ops(dedup, ops, playbook, meter)
    delta = Delta(
        namespace=window.namespace,
        window_id=window.id,
        base_version=playbook.version,
        ops=ops,
        tag_counts=tags,
        trace_count=len(window.traces),
    )
    new_playbook, stats = apply_delta(playbook, delta, config.policy)
    return WindowResult(
        window_id=window.id,
        delta=delta,
        playbook=new_playbook,
        apply_stats=stats,
        meter=meter,
        plan=plan,
        wall_s=clock() - started,
        critical_path_s=map_s + reduce_s,
        reflections=len(reflections),
        keyed=keyed,
    )


async def _reduce_keyed(
    plan: KeyedPlan,
    reflections: Sequence[Reflection],
    playbook: Playbook,
    llm: LLM,
    kw: dict[str, object],
) -> tuple[tuple[DeltaOp, ...], float]:
    """Each key's class reduced on its own, all at once; the classes' deltas united (exact duplicates dropped).

    Returns the united operations and the critical path (the slowest class)."""

    curate_kw = {k: v for k, v in kw.items() if k != "dedup"}

    async def one_class(c: int) -> tuple[tuple[DeltaOp, ...], float]:
        members = [reflections[i] for i in plan.members[c]]
        sub = plan.plans[c]
        if plan.merge_within_key:
            return await _reduce(sub, members, playbook, llm, kw)
        groups = [[members[i] for i in group] for group in sub.groups.groups]
        outcomes = await _gather([curate(g, playbook, llm, **curate_kw) for g in groups])  # type: ignore[arg-type]
        return unite_ops([o.value or () for o in outcomes]), max((o.service_s for o in outcomes), default=0.0)

    done = await _gather([one_class(c) for c in range(len(plan.plans))])
    return unite_ops([ops for ops, _ in done]), max((s for _, s in done), default=0.0)


async def _reduce(
    plan: ReducePlan,
    reflections: Sequence[Reflection],
    playbook: Playbook,
    llm: LLM,
    kw: dict[str, object],
) -> tuple[tuple[DeltaOp, ...], float]:
    """Execute a reduce plan as a dataflow: each merge starts as soon as its own children are done.

    Returns the root's operations and the critical path of the reduce (longest chain of service times).
    """

    curate_kw = {k: v for k, v in kw.items() if k != "dedup"}

    async def leaf(g: int) -> tuple[tuple[DeltaOp, ...], float]:
        group = [reflections[i] for i in plan.groups.groups[g]]
        outcome = await curate(group, playbook, llm, **curate_kw)  # type: ignore[arg-type]
        return outcome.value or (), outcome.service_s

    tasks: dict[tuple[int, int], asyncio.Task[tuple[tuple[DeltaOp, ...], float]]] = {
        (1, g): asyncio.ensure_future(leaf(g)) for g in range(plan.groups.k)
    }

    def node_task(level: int, children: tuple[int, ...]) -> asyncio.Task[tuple[tuple[DeltaOp, ...], float]]:
        child_tasks = [tasks[(level - 1, c)] for c in children]

        async def run() -> tuple[tuple[DeltaOp, ...], float]:
            done = await asyncio.gather(*child_tasks)
            outcome = await merge([ops for ops, _ in done], playbook, llm, **kw)  # type: ignore[arg-type]
            return outcome.value or (), max(s for _, s in done) + outcome.service_s

        return asyncio.ensure_future(run())

    for level_nodes in plan.tree.levels:
        for node in level_nodes:
            tasks[(node.level, node.index)] = node_task(node.level, node.children)
    try:
        return await tasks[plan.tree.root]
    finally:
        for t in tasks.values():
            if not t.done():
                t.cancel()
