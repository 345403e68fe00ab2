"""The method: one iteration over a window of traces, for Combee and for the two baselines.

Built from the three role calls of :mod:`combee.roles` (reflect, curate, merge; the stream workers call them one
by one): :func:`run_window` — map → tags → augmented shuffle → grouped curation → merge tree → apply.

Methods: ``combee`` (the plan of :mod:`combee.plan`), ``naive`` (one curator call over every reflection of
the window) and ``sequential`` (windows of one trace: reflect, curate, apply — ACE as published). All three
share every call and parser, so comparisons differ only in the reduce.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from combee.corroborate import Corroborated, Corroboration, PendingLesson, corroborate_tags, corroborate_with
from combee.dedup import fold_copies
from combee.embeddings import NearDuplicates
from combee.evidence import window_lessons
from combee.guard import guard_ops
from combee.llm import LLM
from combee.meter import Meter
from combee.models import AddOp, Delta, DeltaOp, Playbook, Reflection, Trace
from combee.plan import (
    DEFAULT_SHUFFLE_KEY,
    SHUFFLE_KEYS,
    Forest,
    KeyedPlan,
    ReducePlan,
    default_p,
    flatten_keyed,
    flatten_reduce,
    plan_keyed,
    plan_reduce,
    window_id,
)
from combee.playbook import ApplyPolicy, ApplyStats, apply_delta, count_tags, harmful_taggers, unite_ops
from combee.prompts import (
    DEFAULT_PROMPTS,
    RETRY_TEMPERATURES,
    PromptSet,
)
from combee.roles import curate, fold_ops, merge, reflect
from combee.screen import RunFacts, run_facts, screen_ops
from combee.sections import DEFAULT_SECTIONS, SECTION_THRESHOLD, canonical_sections, section_choices

__all__ = [
    "Finished",
    "Method",
    "MethodConfig",
    "Window",
    "WindowResult",
    "canonical_reflections",
    "finish_ops",
    "fold_delta_ops",
    "reduce_window",
    "run_window",
    "section_map",
    "teaching",
]

T = TypeVar("T")
V = TypeVar("V")

log = logging.getLogger(__name__)


class Method(enum.StrEnum):
    COMBEE = "combee"
    SEQUENTIAL = "sequential"
    NAIVE = "naive"


def reflection_key(reflection: Reflection) -> str:
    """The routing key of a reflection in a keyed shuffle: its first insight's section ("" without insights)."""
    return str(reflection.insights[0].section) if reflection.insights else ""


@dataclass(frozen=True)
class MethodConfig:
    """Knobs of the reduce. Defaults are the paper's (k = ⌊√n⌋) plus Combee's tree bounds; ``p`` = 0 (the
    default) is the reduce shape's own duplication factor (:data:`combee.plan.DEFAULT_P`: the paper's 2 for the
    shapes that merge, 1 for ``section-union``), resolved at construction. ``replace(config, shuffle_key=...)``
    keeps the resolved ``p``: pass ``p=0`` with it for the new shape's own."""

    method: Method = Method.COMBEE
    p: int = 0
    max_group_items: int = 24
    max_fan_in: int = 12
    group_factor: float = 1.0
    # The reduce's shape: "none" = the paper's (one augmented shuffle over the window); "section" = a keyed
    # shuffle routing each reflection by its first insight's section, each section reduced on its own and the
    # sections' deltas united; "section-union" (the default) = the same with no merge call (partials united
    # within a key too).
    shuffle_key: str = DEFAULT_SHUFFLE_KEY
    # The sections offered to the reflector, curator and merger besides the playbook's own, and the cosine at
    # which a new label is taken for an offered one (combee.sections).
    sections: tuple[str, ...] = DEFAULT_SECTIONS
    section_threshold: float = SECTION_THRESHOLD
    # Refuse insights and operations that record a run instead of teaching a lesson (combee.screen).
    screen: bool = True
    parse_attempts: int = 3
    retry_temperatures: tuple[float, ...] = RETRY_TEMPERATURES
    policy: ApplyPolicy = field(default_factory=ApplyPolicy)
    # How many independent teachers a lesson needs, and how many bullets one trace or producer may add per
    # window (combee.corroborate; by default only a lone harmful tag on an established bullet is held back).
    corroboration: Corroboration = field(default_factory=Corroboration)
    corroboration_namespaces: tuple[tuple[str, int], ...] = ()  # (namespace, min_traces) overrides

    def corroboration_for(self, namespace: str) -> Corroboration:
        """The corroboration rules of ``namespace``: ``corroboration`` with its own ``min_traces`` if it has one."""
        k = dict(self.corroboration_namespaces).get(namespace)
        return self.corroboration if k is None else replace(self.corroboration, min_traces=k)

    def __post_init__(self) -> None:
        if self.shuffle_key not in SHUFFLE_KEYS:
            raise ValueError(f"shuffle_key must be one of {', '.join(SHUFFLE_KEYS)}, got {self.shuffle_key!r}")
        if self.p == 0:
            object.__setattr__(self, "p", default_p(self.shuffle_key))
        if self.p < 1:
            raise ValueError("p (duplication factor) must be >= 1 (or 0: the reduce shape's own)")
        if self.parse_attempts < 1:
            raise ValueError("parse_attempts must be >= 1")
        if not self.retry_temperatures or any(t < 0 for t in self.retry_temperatures):
            raise ValueError("retry_temperatures must be a non-empty list of temperatures >= 0")

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


async def _label_scores(
    dedup: NearDuplicates | None, labels: Sequence[str], known: Sequence[str]
) -> Callable[[str, str], float | None]:
    """Cosine between two section slugs' embeddings (their words, not the slug), or None without vectors."""
    if dedup is None or not labels:
        return lambda a, b: None
    sim = await dedup.similarity([x.replace("_", " ") for x in (*labels, *known)])
    return lambda a, b: sim.score(a.replace("_", " "), b.replace("_", " "))


async def section_map(
    labels: Sequence[str], playbook: Playbook, config: MethodConfig, dedup: NearDuplicates | None, meter: Meter
) -> dict[str, str]:
    """Each label's canonical section against ``playbook`` (:func:`combee.sections.canonical_sections`);
    ``meter.sections_mapped`` counts the labels mapped onto another section."""
    known = section_choices(config.sections, playbook.sections)
    fresh = sorted(set(labels) - set(known))
    scores = await _label_scores(dedup, fresh, known)
    mapping = dict(canonical_sections(fresh, known, scores, threshold=config.section_threshold))
    meter.sections_mapped += sum(1 for label, section in mapping.items() if label != section)
    return mapping


async def canonical_reflections(
    reflections: Sequence[Reflection],
    playbook: Playbook,
    config: MethodConfig,
    dedup: NearDuplicates | None,
    meter: Meter,
) -> list[Reflection]:
    """``reflections`` with every insight's section canonical, before they are routed by it."""
    mapping = await section_map([i.section for r in reflections for i in r.insights], playbook, config, dedup, meter)
    if not mapping:
        return list(reflections)
    out: list[Reflection] = []
    for r in reflections:
        insights = tuple(i.model_copy(update={"section": mapping.get(i.section, i.section)}) for i in r.insights)
        out.append(r if insights == r.insights else r.model_copy(update={"insights": insights}))
    return out


@dataclass(frozen=True)
class Finished:
    """A window's operations ready to apply, the ones the guard quarantined (with their reason), which must
    not be applied: the caller stores them for an operator (:mod:`combee.quarantine`), and the pending pool
    after corroboration (:mod:`combee.corroborate`; None when corroboration held nothing and had no pool)."""

    ops: tuple[DeltaOp, ...]
    quarantined: tuple[tuple[DeltaOp, str], ...] = ()
    corroborated: Corroborated | None = None
    refused: tuple[tuple[DeltaOp, str], ...] = ()  # operations the screen refused, with its reason (counted only)


async def finish_ops(
    ops: Sequence[DeltaOp],
    playbook: Playbook,
    config: MethodConfig,
    dedup: NearDuplicates | None,
    meter: Meter,
    *,
    pending: Sequence[PendingLesson] = (),
    producers: Mapping[str, str] | None = None,
    verified: Mapping[str, str] | None = None,
    window_id: str = "",
    at: float = 0.0,
    graded: Mapping[str, str] | None = None,
    lessons: Mapping[str, Sequence[str]] | None = None,
    runs: Mapping[str, RunFacts] | None = None,
) -> Finished:
    """A window's united operations made ready to apply against ``playbook``, in this order: the augmented
    shuffle's copies of one lesson folded (:func:`combee.dedup.fold_copies`), every ADD and UPDATE text put on
    one line and the ones that may not go live quarantined (:func:`combee.guard.guard_ops`: always, whatever the
    reduce that proposed them), operations that record a run refused (``config.screen``), ADD sections
    canonical, near duplicates folded into the playbook and into one another (:func:`fold_delta_ops`), and
    last the ones not corroborated yet held in the pending pool ``pending`` (``config.corroboration``,
    :func:`combee.corroborate.corroborate_with`; ``producers``: trace id -> producer, ``verified``: trace id
    -> verified producer, ``graded``: trace id -> producer of its trusted feedback, ``lessons``: trace id -> the
    lessons its reflection stated, so that a change to an established bullet counts the traces that said it;
    ``window_id`` and ``at`` stamp new entries). The screen judges each operation against the facts of its
    source runs that ``runs`` holds (trace id -> :class:`combee.screen.RunFacts`), so a curator's worked example
    with a run's numbers goes as a reflector's does.
    Deterministic given the embedder's vectors; what it returns is what gets applied and logged, so applying it
    again (a replay) needs no vectors. Every path that adds a bullet from learning goes through here: the
    offline engine's :func:`reduce_window` (every method and reduce shape) and the stream combiner."""
    if not ops and not pending:
        return Finished(())
    texts = [op.content for op in ops if isinstance(op, AddOp)]
    similarity = await dedup.similarity(texts) if dedup is not None and texts else None
    ops, copies = fold_copies(ops, similarity)
    meter.folded_copies += copies
    guarded = guard_ops(ops)
    ops = guarded.ops
    meter.quarantine(reason for _, reason in guarded.quarantined)
    meter.normalised += guarded.normalised
    refused: tuple[tuple[DeltaOp, str], ...] = ()
    if config.screen:
        ops, refused, trimmed = screen_ops(ops, runs)
        meter.refuse(reason for _, reason in refused)
        meter.trim(trimmed)
    mapping = await section_map([op.section for op in ops if isinstance(op, AddOp)], playbook, config, dedup, meter)
    ops = tuple(
        op.model_copy(update={"section": mapping[op.section]})
        if isinstance(op, AddOp) and mapping.get(op.section, op.section) != op.section
        else op
        for op in ops
    )
    ops = await fold_delta_ops(dedup, ops, playbook, meter)
    corroborated = await corroborate_with(
        ops,
        pending,
        playbook,
        config.corroboration_for(playbook.namespace),
        dedup,
        producers=producers or {},
        verified=verified,
        window_id=window_id,
        at=at,
        graded=graded,
        lessons=lessons,
    )
    meter.hold(corroborated.held)
    held = corroborated if corroborated.held or pending else None
    return Finished(corroborated.ops, guarded.quarantined, held, refused)


def producers_of(traces: Sequence[Trace]) -> dict[str, str]:
    """Trace id -> producer (``metadata["producer"]``) of the traces that name one."""
    return {t.trace_id: str(t.metadata["producer"]) for t in traces if t.metadata.get("producer")}


def teaching(reflections: Sequence[Reflection]) -> list[Reflection]:
    """The reflections with at least one insight: the ones a curator has something to fold in from (every
    reflection's tags are counted all the same)."""
    return [r for r in reflections if r.insights]


async def fold_delta_ops(
    dedup: NearDuplicates | None, ops: Sequence[DeltaOp], playbook: Playbook, meter: Meter
) -> tuple[DeltaOp, ...]:
    """A window's final operations with near duplicates folded (into ``playbook``'s bullets and one another).

    This is what gets applied and logged, so applying it again (a replay) needs no vectors.
    """
    if dedup is None or not ops:
        return tuple(ops)
    return await fold_ops(dedup, ops, playbook.bullets, meter, proposals=False)


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
    teaching: int = 0  # reflections with at least one insight after the screen: what the reduce planned over
    quarantined: tuple[tuple[DeltaOp, str], ...] = ()  # operations the guard held back, with their reason
    screened: tuple[tuple[DeltaOp, str], ...] = ()  # operations the screen refused, with its reason
    pending: tuple[PendingLesson, ...] = ()  # the pending pool after the window (combee.corroborate)
    # per bullet, the traces whose reflections tagged it harmful, before the harmful-tag rule (whether they counted:
    # delta.tag_counts)
    harmful_taggers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


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
    pending: Sequence[PendingLesson] = (),
) -> WindowResult:
    """Run one iteration of ``config.method`` on ``window`` against ``playbook`` (frozen for the iteration),
    with the pending pool ``pending`` of corroboration (the result's ``pending`` is the pool after it).

    With ``dedup`` (semantic de-duplication), near-duplicate proposals collapse before every merge call and
    the final delta's ADDs are folded into near-duplicate bullets (or one another) before it is applied —
    the same for all three methods.

    Raises the LLM layer's :class:`combee.errors.LLMUnavailable` / ``LLMRateLimited`` if the endpoint stays
    down past its retries; bad answers never raise (they are retried, then skipped and counted in the meter).
    """
    started = clock()
    meter = Meter()
    kw = _call_kw(config, meter, prompts, clock)
    reflected = await _gather(
        [
            reflect(t, playbook, llm, **kw, sections=config.sections, screen=config.screen)  # type: ignore[arg-type]
            for t in window.traces
        ]
    )
    map_s = max((o.service_s for o in reflected), default=0.0)
    return await reduce_window(
        window,
        [o.value for o in reflected if o.value is not None],
        playbook,
        llm,
        config,
        prompts=prompts,
        clock=clock,
        dedup=dedup,
        meter=meter,
        started=started,
        map_s=map_s,
        pending=pending,
    )


def _call_kw(config: MethodConfig, meter: Meter, prompts: PromptSet, clock: Callable[[], float]) -> dict[str, object]:
    return {
        "meter": meter,
        "prompts": prompts,
        "attempts": config.parse_attempts,
        "clock": clock,
        "temperatures": config.retry_temperatures,
    }


async def reduce_window(
    window: Window,
    reflected: Sequence[Reflection],
    playbook: Playbook,
    llm: LLM,
    config: MethodConfig,
    *,
    prompts: PromptSet = DEFAULT_PROMPTS,
    clock: Callable[[], float] = time.monotonic,
    dedup: NearDuplicates | None = None,
    meter: Meter | None = None,
    started: float | None = None,
    map_s: float = 0.0,
    pending: Sequence[PendingLesson] = (),
) -> WindowResult:
    """The rest of an iteration once the window's traces are reflected (``reflected``, in trace order): tags,
    the reduce of ``config``, the finishing of its operations and the apply. :func:`run_window` calls it after
    its map step; a benchmark that reduces the same recorded reflections with several methods calls it alone
    (then ``map_s`` is 0 unless given, and wall time counts from the call)."""
    started = clock() if started is None else started
    meter = Meter() if meter is None else meter
    tags = count_tags(reflected)
    reflections = await canonical_reflections(teaching(reflected), playbook, config, dedup, meter)
    kw = {**_call_kw(config, meter, prompts, clock), "sections": config.sections}

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

    producers = producers_of(window.traces)
    finished = await finish_ops(
        ops, playbook, config, dedup, meter, pending=pending, producers=producers, window_id=window.id, at=clock(),
        lessons=window_lessons(reflected), runs=run_facts(window.traces),
    )  # fmt: skip
    ops = finished.ops
    taggers = harmful_taggers(reflected)
    tags, held_tags = corroborate_tags(
        tags, playbook, config.corroboration_for(playbook.namespace), taggers=taggers, producers=producers
    )
    meter.hold({"harmful_tag": held_tags} if held_tags else {})
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
        reflections=len(reflected),
        keyed=keyed,
        teaching=len(reflections),
        quarantined=finished.quarantined,
        screened=finished.refused,
        pending=finished.corroborated.pending if finished.corroborated is not None else tuple(pending),
        harmful_taggers=taggers,
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
