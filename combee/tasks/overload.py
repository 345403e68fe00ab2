"""Context overload on a real model: the paper's Figure 2, measured (``combee task TASK --overload``).

The question: when one curator call folds in more reflections, how much of what they teach reaches the
playbook, and what does each reduce shape cost? Measured so that every method reduces the *same* reflections:

1. **Traces.** The agent answers the training questions with the empty playbook (as ``combee task``; the same
   phase and cache, so an accuracy run into the same directory reuses them).
2. **Reflections, once.** Every trace is reflected against the empty playbook, screened (:mod:`combee.screen`)
   and kept: ``reflections.jsonl``. Every variant below starts from these, so a difference between variants
   comes from the reduce alone.
3. **Reduces.** Each variant reduces the reflections in order, from the empty playbook, one variant after the
   other (so each wall time is its own): naive batching at several batch sizes (windows of b reflections, one
   curator call each), sequential (one reflection per window: ACE as published), and Combee's shapes over one
   window of all of them.

Steps 1 and 2 can come from an earlier run instead (``--reflections-from DIR``, :func:`load_recorded`): its
``traces.jsonl``, ``reflections.jsonl`` and ``overload.json``, for the same training questions. Then no trace is
answered and nothing is reflected; every variant reduces the recorded reflections, so variants run on another
day, or after a change to the reflector's request that the response cache would not match, start from the
same reflections as the earlier run's.

Per variant: entries, distinct lessons (bullets clustered by the project's embedder at its threshold,
:mod:`combee.quality`), bullets per lesson, playbook tokens, calls, tokens, wall time and critical path (the
sum over windows of the slowest chain of calls), lessons refused and copies folded; for a keyed variant, the
routing classes of its window. Every phase has its own response cache, and the timings journal of
``combee task`` keeps model timings across a resumed run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from combee.embeddings import NearDuplicates
from combee.engine import Method, MethodConfig, Window, WindowResult, reduce_window
from combee.meter import Meter
from combee.models import Playbook, Reflection, Trace
from combee.plan import default_p
from combee.quality import Bloat, bloat
from combee.roles import reflect
from combee.screen import REASONS
from combee.tasks.agent import answer_all, to_trace
from combee.tasks.data import Question
from combee.tasks.run import LLMFactory, MeteredLLM, PhaseDone, PhaseStats, ProgressFactory, with_timing
from combee.tracefile import read_traces

__all__ = [
    "OverloadConfig",
    "OverloadResult",
    "Recorded",
    "Variant",
    "VariantResult",
    "check_recorded",
    "default_variants",
    "load_recorded",
    "refusals",
    "run_overload",
    "same_rule",
    "without",
]


@dataclass(frozen=True)
class Variant:
    """One way to reduce the reflections: ``config`` over windows of ``batch`` reflections."""

    name: str
    config: MethodConfig
    batch: int
    family: str  # "naive", "sequential" or "combee": how the plot draws it


def default_variants(base: MethodConfig, n: int, naive_batches: Sequence[int] = (8, 16, 32, 64)) -> list[Variant]:
    """The issue's set over ``n`` reflections: naive at each batch size up to ``n`` (and ``n``), Combee's
    shapes over one window of ``n`` (the paper's, ``section``, ``section-union``) at ``base.p`` when it is more
    than 1, else at the paper's p = 2 (the names of these variants carry no p), ``section-union`` at p = 1
    too (``-p1-``), and sequential last (the longest)."""
    naive = replace(base, method=Method.NAIVE)
    combee = replace(base, method=Method.COMBEE, p=max(base.p, default_p("none")))
    sizes = sorted({b for b in naive_batches if b < n} | {n})
    out = [Variant(f"naive-b{b}", naive, b, "naive") for b in sizes]
    for shape in ("none", "section", "section-union"):
        out.append(Variant(f"combee-{shape}-b{n}", replace(combee, shuffle_key=shape), n, "combee"))
    p1 = replace(combee, shuffle_key="section-union", p=1)
    out.append(Variant(f"combee-section-union-p1-b{n}", p1, n, "combee"))
    out.append(Variant("sequential", replace(base, method=Method.SEQUENTIAL), 1, "sequential"))
    return out


def without(variants: Sequence[Variant], skip: Sequence[str]) -> list[Variant]:
    """``variants`` less those named in ``skip``. Raises ValueError naming an unknown name and the known ones."""
    names = [v.name for v in variants]
    unknown = [name for name in skip if name not in names]
    if unknown:
        raise ValueError(f"no overload variant named {', '.join(unknown)}; the variants are {', '.join(names)}")
    left_out = set(skip)
    return [v for v in variants if v.name not in left_out]


@dataclass(frozen=True)
class Recorded:
    """Traces and reflections an earlier overload run wrote, with its figures for them."""

    source: str  # the folder they were read from
    train_ids: tuple[str, ...]
    traces: tuple[Trace, ...]
    reflections: tuple[Reflection | None, ...]  # per trace, in trace order
    traces_figures: Mapping[str, Any]  # overload.json's "traces" block of that run
    reflections_figures: Mapping[str, Any]  # and its "reflections" block


def load_recorded(folder: Path) -> Recorded:
    """The traces and reflections an earlier ``--overload`` run wrote into ``folder``.

    Raises ValueError saying what is missing or does not agree (a file, a line, trace ids out of step).
    """
    files = {name: folder / name for name in ("overload.json", "traces.jsonl", "reflections.jsonl")}
    missing = [str(path) for path in files.values() if not path.is_file()]
    if missing:
        raise ValueError(f"not the output of a --overload run: missing {', '.join(missing)}")
    read = read_traces(files["traces.jsonl"])
    if read.errors:
        first = read.errors[0]
        raise ValueError(f"{files['traces.jsonl']}: line {first.line}: {first.reason}")
    traces = read.traces
    try:
        doc = json.loads(files["overload.json"].read_text())
        rows = [json.loads(line) for line in _lines(files["reflections.jsonl"])]
        reflections = [None if r["reflection"] is None else Reflection.model_validate(r["reflection"]) for r in rows]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{folder}: cannot read the recorded run: {exc}") from None
    ids = [t.trace_id for t in traces]
    if [r["trace_id"] for r in rows] != ids or len(doc.get("train_ids", ())) != len(ids):
        raise ValueError(f"{folder}: traces.jsonl, reflections.jsonl and overload.json's train_ids are out of step")
    return Recorded(
        source=str(folder),
        train_ids=tuple(doc["train_ids"]),
        traces=tuple(traces),
        reflections=tuple(reflections),
        traces_figures=doc["traces"],
        reflections_figures=doc["reflections"],
    )


def check_recorded(recorded: Recorded, train: Sequence[Question]) -> None:
    """Raises ValueError when ``recorded`` holds the traces of other training questions than ``train``."""
    wanted = tuple(q.id for q in train)
    if recorded.train_ids != wanted:
        raise ValueError(
            f"{recorded.source} holds the traces of {len(recorded.train_ids)} training questions, not this run's "
            f"{len(wanted)}: use the --n-train and --seed of the run that wrote it"
        )


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class OverloadConfig:
    task: str
    train: Sequence[Question]
    variants: Sequence[Variant]
    reflect_config: MethodConfig  # sections, screen and parse attempts of the one reflection pass
    concurrency: int = 4
    dedup: NearDuplicates | None = None
    recorded: Recorded | None = None  # steps 1 and 2 from an earlier run (same training questions), not run here


@dataclass
class VariantResult:
    variant: Variant
    playbook: Playbook
    meter: Meter
    windows: int
    wall_s: float
    critical_path_s: float | None  # None: replayed from the cache and the journal kept none
    size: Bloat
    routing_classes: tuple[str, ...] = ()  # the keyed plan's classes (its first window), for keyed shapes
    phase: PhaseStats = field(default_factory=PhaseStats)


@dataclass
class OverloadResult:
    config: OverloadConfig
    traces: list[Trace]
    reflections: list[Reflection | None]  # per trace, in trace order; None where no answer parsed
    reflect_meter: Meter  # empty when the reflections were recorded (config.recorded)
    variants: list[VariantResult]
    phases: dict[str, PhaseStats]
    wall_s: float


async def _reflect_all(
    traces: Sequence[Trace], llm: Any, config: MethodConfig, concurrency: int, meter: Meter, progress: Any
) -> list[Reflection | None]:
    """Every trace reflected against the empty playbook, at most ``concurrency`` at a time, in trace order."""
    import asyncio

    gate = asyncio.Semaphore(concurrency)
    done = 0
    empty = Playbook(namespace=traces[0].namespace) if traces else None

    async def one(trace: Trace) -> Reflection | None:
        nonlocal done
        assert empty is not None
        async with gate:
            outcome = await reflect(
                trace, empty, llm, meter=meter, attempts=config.parse_attempts,
                temperatures=config.retry_temperatures, sections=config.sections, screen=config.screen,
            )  # fmt: skip
        done += 1
        progress.update(done, len(traces))
        return outcome.value

    return list(await asyncio.gather(*(one(t) for t in traces)))


async def _reduce(
    variant: Variant,
    reflections: Sequence[Reflection],
    namespace: str,
    llm: Any,
    dedup: NearDuplicates | None,
    clock: Callable[[], float],
    progress: Any,
) -> tuple[Playbook, Meter, int, float, tuple[str, ...]]:
    playbook = Playbook(namespace=namespace)
    meter = Meter()
    critical = 0.0
    classes: tuple[str, ...] = ()
    chunks = [reflections[i : i + variant.batch] for i in range(0, len(reflections), variant.batch)]
    for i, chunk in enumerate(chunks):
        first = i * variant.batch
        window = Window(namespace, f"overload:{variant.name}", first, first + len(chunk) - 1, ())
        result: WindowResult = await reduce_window(
            window, chunk, playbook, llm, variant.config, clock=clock, dedup=dedup
        )
        playbook = result.playbook
        meter.absorb(result.meter)
        critical += result.critical_path_s
        if result.keyed is not None and not classes:
            classes = result.keyed.keys
        progress.update(i + 1, len(chunks), f"{len(playbook.bullets)} bullets")
    return playbook, meter, len(chunks), critical, classes


async def run_overload(
    config: OverloadConfig,
    llm_for: LLMFactory,
    *,
    progress: ProgressFactory,
    clock: Callable[[], float] = time.monotonic,
    timed: dict[str, tuple[PhaseStats, str]] | None = None,
    on_phase: PhaseDone | None = None,
) -> OverloadResult:
    """Run the three steps of the module docstring. Phases: ``traces``, ``reflect``, ``reduce-<variant>``; the
    first two are not run when ``config.recorded`` gives their outcome (ValueError when it is for other training
    questions than ``config.train``)."""
    started = clock()
    phases: dict[str, PhaseStats] = {}

    def done(name: str) -> None:
        earlier = (timed or {}).get(name)
        if earlier is not None:
            phases[name] = with_timing(phases[name], earlier[0], earlier[1])
        if on_phase is not None:
            on_phase(name, phases[name])

    recorded = config.recorded
    if recorded is not None:
        check_recorded(recorded, config.train)
        variants = await _reduce_all(config, list(recorded.reflections), llm_for, progress, clock, phases, done)
        return OverloadResult(
            config, list(recorded.traces), list(recorded.reflections), Meter(), variants, phases, clock() - started
        )

    empty = Playbook(namespace=config.task)
    stats = phases.setdefault("traces", PhaseStats())
    bar = progress("traces (agent, empty playbook)")
    t0 = clock()
    async with llm_for("traces") as llm:
        attempts = await answer_all(
            MeteredLLM(llm, stats), config.task, config.train, empty, concurrency=config.concurrency,
            progress=bar.update,
        )  # fmt: skip
    stats.wall_s = clock() - t0
    bar.close()
    done("traces")
    traces = [to_trace(a, namespace=config.task, playbook_version=0) for a in attempts]

    stats = phases.setdefault("reflect", PhaseStats())
    reflect_meter = Meter()
    bar = progress("reflections (empty playbook, once)")
    t0 = clock()
    async with llm_for("reflect") as llm:
        reflections = await _reflect_all(
            traces, MeteredLLM(llm, stats), config.reflect_config, config.concurrency, reflect_meter, bar
        )
    stats.wall_s = clock() - t0
    bar.close()
    done("reflect")
    variants = await _reduce_all(config, reflections, llm_for, progress, clock, phases, done)
    return OverloadResult(
        config=config,
        traces=traces,
        reflections=reflections,
        reflect_meter=reflect_meter,
        variants=variants,
        phases=phases,
        wall_s=clock() - started,
    )


async def _reduce_all(
    config: OverloadConfig,
    reflections: Sequence[Reflection | None],
    llm_for: LLMFactory,
    progress: ProgressFactory,
    clock: Callable[[], float],
    phases: dict[str, PhaseStats],
    done: Callable[[str], None],
) -> list[VariantResult]:
    """Step 3: every variant reduces the parsed ``reflections``, one after the other (phase ``reduce-<name>``)."""
    parsed = [r for r in reflections if r is not None]
    results: list[VariantResult] = []
    for variant in config.variants:
        name = f"reduce-{variant.name}"
        stats = phases.setdefault(name, PhaseStats())
        bar = progress(f"reduce ({variant.name})")
        t0 = clock()
        async with llm_for(name) as llm:
            playbook, meter, windows, critical, classes = await _reduce(
                variant, parsed, config.task, MeteredLLM(llm, stats), config.dedup, clock, bar
            )
        stats.wall_s = clock() - t0
        stats.critical_path_s = None if stats.replayed else critical  # cached answers take no time: not a measurement
        bar.close()
        done(name)
        figures = phases[name]  # this run's figures, or the run's that filled the cache
        size = bloat(playbook, await same_rule(config.dedup, playbook))
        row = VariantResult(
            variant, playbook, meter, windows, figures.wall_s, figures.critical_path_s, size, classes, figures
        )
        results.append(row)
    return results


async def same_rule(dedup: NearDuplicates | None, playbook: Playbook) -> Callable[[str, str], bool]:
    """Whether two bullets say the same thing: the de-duplicator's rule, or exact normalised text without one."""
    if dedup is None:
        from combee.playbook import normalise_text

        return lambda a, b: normalise_text(a) == normalise_text(b)
    similarity = await dedup.similarity([b.content for b in playbook.bullets])
    return similarity.near


def refusals(meter: Meter) -> dict[str, int]:
    """Lessons refused by the screen, every reason listed (0 where none)."""
    return {reason: meter.refused.get(reason, 0) for reason in REASONS}
