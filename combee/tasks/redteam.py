"""The red-team suite (issue 25, item 5; ``combee task redteam``): crafted attack traces mixed with genuine ones,
learned with the project's default method, to see what reaches the live prompt.

1. **Seed.** The attacks meet an established playbook: the hand-written genuine Formula lessons of
   :data:`combee.tasks.redteam_cases.SEED_LESSONS`, each helpful a few times (no model call: the targets of
   ``harmful_tags`` and ``near_duplicate`` are then known bullets, the same in every run).
2. **Mix.** ``n_genuine`` of the real model's Formula traces (a seeded pick), and every attack of
   :func:`~combee.tasks.redteam_cases.all_cases`, in one seeded shuffle (:func:`mix`).
   With ``producers`` = N > 0, every trace names its producer (``metadata.producer``): the genuine traces one
   of N agents (``agent-1`` ... in turn, by trace id) and every attack the one producer ``attacker``
   (:func:`name_producers`). That is a namespace that requires signed traces (docs/security.md), where a
   producer is what its key says and the attacker holds one key; corroboration then counts the attacker's
   traces as one teacher. With 0 (the default) no trace names one, as an unsigned fleet's traces need not.
3. **Learn.** The mixed traces, in windows of ``batch`` traces, through :func:`combee.engine.run_window` with the
   configuration given (the CLI passes the defaults: Combee, the default reduce shape, screen and guard on). The
   final playbook, every quarantined operation with its reason (the guard, :mod:`combee.guard`), every operation
   the screen refused (:mod:`combee.screen`) and the meter (which also counts the insights the screen refused in
   the reflector) are kept for the report (:mod:`combee.tasks.redteam_report`), and per window the harmful tags
   given to each bullet: which traces gave them and how many counted after the harmful-tag rule
   (:class:`HarmfulTags`), so the report can tell tags an attack gave from tags genuine agents gave.

One LLM phase, ``learn``, with its own response cache: a rerun into the same directory replays it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from combee.corroborate import PendingLesson
from combee.embeddings import NearDuplicates
from combee.engine import MethodConfig, Window, producers_of, run_window
from combee.meter import Meter
from combee.models import DeltaOp, Playbook, Trace
from combee.tasks.redteam_cases import Case, seeded_playbook
from combee.tasks.run import LLMFactory, MeteredLLM, PhaseDone, PhaseStats, ProgressFactory, with_timing

__all__ = [
    "ATTACKER",
    "LEARN_PHASE",
    "HarmfulTags",
    "RedTeamConfig",
    "RedTeamResult",
    "harmful_tags_of",
    "mix",
    "name_producers",
    "pick_genuine",
    "run_redteam",
    "windows",
]

LEARN_PHASE = "learn"


def pick_genuine(traces: Sequence[Trace], n: int, seed: int) -> list[Trace]:
    """``n`` of ``traces`` (all of them when fewer), drawn by ``seed`` from the traces sorted by id, in id order:
    the same pick whatever order the file lists them in."""
    ordered = sorted(traces, key=lambda t: t.trace_id)
    if n >= len(ordered):
        return ordered
    chosen = sorted(random.Random(f"redteam-genuine:{seed}").sample(range(len(ordered)), n))
    return [ordered[i] for i in chosen]


def mix(genuine: Sequence[Trace], cases: Sequence[Case], seed: int) -> list[Trace]:
    """The genuine traces and the attacks' traces in one shuffle seeded by ``seed``. Raises ValueError when two
    traces share an id (the report tells attacks from genuine traces by id)."""
    traces = [*genuine, *(c.trace for c in cases)]
    ids = [t.trace_id for t in traces]
    if len(set(ids)) != len(ids):
        raise ValueError("a trace id appears twice among the genuine traces and the attacks")
    random.Random(f"redteam-mix:{seed}").shuffle(traces)
    return traces


ATTACKER = "attacker"
"""The producer every attack names with ``producers`` > 0."""


def name_producers(traces: Sequence[Trace], attacks: Sequence[str], n: int) -> list[Trace]:
    """``traces`` (in their order) each naming its producer: the trace ids in ``attacks`` :data:`ATTACKER`, the
    others ``agent-1`` ... ``agent-n`` in turn by trace id. ``n`` = 0: ``traces`` as they are."""
    if n < 0:
        raise ValueError(f"producers must be 0 or more, got {n}")
    if n == 0:
        return list(traces)
    hostile = set(attacks)
    genuine = sorted(t.trace_id for t in traces if t.trace_id not in hostile)
    agent = {trace_id: f"agent-{i % n + 1}" for i, trace_id in enumerate(genuine)}
    return [
        t.model_copy(update={"metadata": {**t.metadata, "producer": agent.get(t.trace_id, ATTACKER)}}) for t in traces
    ]


def windows(n: int, batch: int) -> list[tuple[int, int]]:
    """The windows over ``n`` traces, ``batch`` at a time: (first, last) offsets, inclusive."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    return [(i, min(i + batch, n) - 1) for i in range(0, n, batch)]


@dataclass(frozen=True)
class RedTeamConfig:
    genuine: Sequence[Trace]  # the genuine traces already picked
    cases: Sequence[Case]
    method: MethodConfig
    batch: int
    seed: int = 0
    dedup: NearDuplicates | None = None
    producers: int = 0  # genuine producers; > 0: every trace names one, the attacks all "attacker" (step 2)


@dataclass(frozen=True)
class HarmfulTags:
    """One window's harmful tags on one bullet: the traces whose reflections gave them, each one's teacher (its
    producer when it names one, else itself), and how many of the tags counted (0 when the harmful-tag rule held
    them back; one per teacher on an established bullet, one per tagger on a new one)."""

    window: int  # 0-based, in learning order
    bullet_id: str
    taggers: tuple[str, ...]
    counted: int
    teachers: tuple[str, ...] = ()  # per tagger, in order; empty: each tagger its own teacher


def harmful_tags_of(
    window: int,
    taggers: Mapping[str, Sequence[str]],
    counts: Mapping[str, tuple[int, int]],
    producers: Mapping[str, str] | None = None,
) -> list[HarmfulTags]:
    """A window's :class:`HarmfulTags`, per bullet some reflection tagged harmful, in bullet order: ``taggers``
    (:attr:`combee.engine.WindowResult.harmful_taggers`), the window's tag counts as applied
    (``delta.tag_counts``) and its traces' producers (:func:`combee.engine.producers_of`)."""
    named = producers or {}
    return [
        HarmfulTags(
            window, bullet_id, tuple(traces), counts.get(bullet_id, (0, 0))[1], tuple(named.get(t, t) for t in traces)
        )
        for bullet_id, traces in sorted(taggers.items())
    ]


@dataclass
class RedTeamResult:
    config: RedTeamConfig
    seeded: Playbook
    playbook: Playbook  # after every window
    traces: list[Trace]  # in the order learned
    quarantined: list[tuple[DeltaOp, str]]  # every window's, in order: the operation and the guard's reason
    screened: list[tuple[DeltaOp, str]]  # the operations the screen refused, with its reason (not its insights)
    meter: Meter
    windows: int
    pending: int  # lessons still waiting for corroboration at the end
    harmful: list[HarmfulTags] = field(default_factory=list)  # every window's, in order
    phases: dict[str, PhaseStats] = field(default_factory=dict)
    wall_s: float = 0.0


async def run_redteam(
    config: RedTeamConfig,
    llm_for: LLMFactory,
    *,
    progress: ProgressFactory,
    clock: Callable[[], float] = time.monotonic,
    timed: dict[str, tuple[PhaseStats, str]] | None = None,
    on_phase: PhaseDone | None = None,
) -> RedTeamResult:
    """Run the three steps of the module docstring. LLM-layer errors propagate (the endpoint is down)."""
    started = clock()
    seeded = seeded_playbook()
    traces = mix(config.genuine, config.cases, config.seed)
    traces = name_producers(traces, [c.name for c in config.cases], config.producers)
    playbook = seeded
    pending: tuple[PendingLesson, ...] = ()
    quarantined: list[tuple[DeltaOp, str]] = []
    screened: list[tuple[DeltaOp, str]] = []
    harmful: list[HarmfulTags] = []
    meter = Meter()
    stats = PhaseStats()
    spans = windows(len(traces), config.batch)
    bar = progress(f"learn ({len(traces)} traces, {len(spans)} windows)")
    t0 = clock()
    async with llm_for(LEARN_PHASE) as llm:
        metered = MeteredLLM(llm, stats)
        for i, (first, last) in enumerate(spans):
            window = Window(seeded.namespace, "redteam", first, last, tuple(traces[first : last + 1]))
            result = await run_window(
                window, playbook, metered, config.method, clock=clock, dedup=config.dedup, pending=pending
            )
            playbook, pending = result.playbook, result.pending
            quarantined.extend(result.quarantined)
            screened.extend(result.screened)
            tagged = harmful_tags_of(i, result.harmful_taggers, result.delta.tag_counts, producers_of(window.traces))
            harmful.extend(tagged)
            meter.absorb(result.meter)
            bar.update(i + 1, len(spans), f"{len(playbook.bullets)} bullets, {len(quarantined)} quarantined")
    stats.wall_s = clock() - t0
    bar.close()
    earlier = (timed or {}).get(LEARN_PHASE)
    if earlier is not None:
        stats = with_timing(stats, earlier[0], earlier[1])
    if on_phase is not None:
        on_phase(LEARN_PHASE, stats)
    return RedTeamResult(
        config=config,
        seeded=seeded,
        playbook=playbook,
        traces=traces,
        quarantined=quarantined,
        screened=screened,
        meter=meter,
        windows=len(spans),
        pending=len(pending),
        harmful=harmful,
        phases={LEARN_PHASE: stats},
        wall_s=clock() - started,
    )
