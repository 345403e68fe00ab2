"""The finance harness's run loop: collect training traces once, learn them with every method, evaluate.

Order of work:

1. **Traces.** The agent answers every training question with the *empty* playbook; each graded answer is a
   trace (:mod:`combee.tasks.agent`).
2. **Learn, offline.** The same traces, in the same order, are learned by every method in ``methods``
   (sequential, naive, Combee) through :func:`combee.learner.learn`, one method after another, each starting
   from the empty playbook. Offline, because a comparison of methods needs the same inputs: in an online loop
   each method's agent would answer with its own, newer playbook, so the methods would learn from different
   traces and a difference in accuracy could come from the traces rather than from the reduce.
3. **Evaluate.** The empty playbook and every final playbook answer the same held-out test questions, one
   playbook after another (so each wall time is that playbook's alone).

Every phase gets its LLM from ``llm_for(phase)`` (phases: ``traces``, ``learn-<method>``, ``eval``), so a
caller can give each phase its own response cache: a cached reflector answer of one method must not make
another method's learning look fast. Calls, cached calls, tokens and wall time are counted per phase (and per
evaluated playbook) by a thin wrapper around the port.

A run can be resumed: with a response cache, a phase an earlier run completed is replayed at no cost, and its
wall time would then be the cache's, not the model's. So the caller keeps the timings of phases answered
without the cache (``timed``, passed back in; ``on_phase`` hands each finished phase out) and a replayed phase
reports the timing it had when the model answered it (:func:`with_timing`): the same calls, every one cached
now, none cached then.

A learning phase can also be resumed part-way, at a step (a trace for sequential, a window otherwise): the caller
journals each step's figures while every answer so far is the model's (``on_step``), and passes the last one
back (``steps``). If the re-run reaches that step having replayed exactly those calls from the cache, the phase
reports the earlier wall time up to that step plus this run's wall time after it (:class:`Resumed`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from combee.errors import ContextTooSmall
from combee.learner import LearnConfig, LearnResult, learn
from combee.llm import LLM, ChatRequest, ChatResponse, Role, context_tokens_of
from combee.models import Playbook, Trace
from combee.tasks.agent import Attempt, answer_all, to_trace
from combee.tasks.data import Question

if TYPE_CHECKING:
    from combee.embeddings import NearDuplicates

__all__ = [
    "BASELINE",
    "HarnessConfig",
    "HarnessResult",
    "LLMFactory",
    "MeteredLLM",
    "PhaseStats",
    "ProgressBar",
    "Resumed",
    "StepTiming",
    "run_harness",
    "with_timing",
]

BASELINE = "none"
"""The name of the empty playbook in results (no learning)."""


class ProgressBar(Protocol):
    def update(self, done: int, total: int, note: str = "") -> None: ...

    def close(self) -> None: ...


LLMFactory = Callable[[str], contextlib.AbstractAsyncContextManager[LLM]]
ProgressFactory = Callable[[str], ProgressBar]


@dataclass
class PhaseStats:
    """What one phase (or one evaluated playbook) cost. Cached answers count their recorded tokens and are
    also counted in ``cached``; ``simulated`` counts answers the server labelled as the Combee simulator."""

    wall_s: float = 0.0
    calls: int = 0
    cached: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    simulated: int = 0
    models: set[str] = field(default_factory=set)
    timed_at: str | None = None  # set when these figures are an earlier run's (see with_timing): when measured
    resumed_after: int | None = None  # set when the first steps were timed in an earlier run (see Resumed)
    # the machine's load average (1, 5, 15 min) when the phase ended, set by the caller: how busy the machine
    # was while the phase was timed
    loadavg: tuple[float, float, float] | None = None
    # the phase's critical path (the slowest chain of calls, summed over windows) where the caller measures one:
    # journaled with the wall time, since a resumed phase answered from the cache cannot measure it again
    critical_path_s: float | None = None

    @property
    def replayed(self) -> bool:
        """Every answer of the phase came from the response cache: its clock measured the cache, not the model."""
        return self.calls > 0 and self.cached == self.calls

    def add(self, response: ChatResponse) -> None:
        self.calls += 1
        self.cached += int(response.cached)
        self.prompt_tokens += response.usage.prompt_tokens
        self.completion_tokens += response.usage.completion_tokens
        self.simulated += int(response.simulated)
        if response.model:
            self.models.add(response.model)

    def as_dict(self) -> dict[str, object]:
        return {
            "wall_s": round(self.wall_s, 3),
            "calls": self.calls,
            "cached_calls": self.cached,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "tokens": self.prompt_tokens + self.completion_tokens,
            "simulated_answers": self.simulated,
            **({"timed_in_an_earlier_run_at": self.timed_at} if self.timed_at else {}),
            **({"resumed_after_step": self.resumed_after} if self.resumed_after is not None else {}),
            **({"loadavg_at_end": [round(x, 2) for x in self.loadavg]} if self.loadavg else {}),
            **({"critical_path_s": round(self.critical_path_s, 3)} if self.critical_path_s is not None else {}),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, object]) -> PhaseStats:
        """The inverse of :meth:`as_dict` (``models`` aside: a journal keeps only the figures)."""

        def num(key: str) -> int:
            value = doc.get(key, 0)
            return int(value) if isinstance(value, (int, float)) else 0

        wall = doc.get("wall_s", 0.0)
        at = doc.get("timed_in_an_earlier_run_at")
        after = doc.get("resumed_after_step")
        load = doc.get("loadavg_at_end")
        critical = doc.get("critical_path_s")
        return cls(
            wall_s=float(wall) if isinstance(wall, (int, float)) else 0.0,
            calls=num("calls"),
            cached=num("cached_calls"),
            prompt_tokens=num("prompt_tokens"),
            completion_tokens=num("completion_tokens"),
            simulated=num("simulated_answers"),
            timed_at=str(at) if at else None,
            resumed_after=int(after) if isinstance(after, int) else None,
            loadavg=(float(load[0]), float(load[1]), float(load[2]))
            if isinstance(load, list) and len(load) == 3
            else None,
            critical_path_s=float(critical) if isinstance(critical, (int, float)) else None,
        )

    def copy(self) -> PhaseStats:
        return replace(self, models=set(self.models))


def with_timing(fresh: PhaseStats, earlier: PhaseStats | None, measured_at: str) -> PhaseStats:
    """The figures to report for a phase: ``fresh`` unless every answer in it came from the response cache and
    ``earlier`` timed the same number of calls with none cached, i.e. the run that filled the cache. Then the
    earlier figures, stamped with when they were measured (``measured_at``, unless already stamped)."""
    if not fresh.replayed or earlier is None or earlier.cached or earlier.calls != fresh.calls:
        return fresh
    return PhaseStats(
        wall_s=earlier.wall_s,
        calls=earlier.calls,
        cached=0,
        prompt_tokens=earlier.prompt_tokens,
        completion_tokens=earlier.completion_tokens,
        simulated=earlier.simulated,
        models=fresh.models,
        timed_at=earlier.timed_at or measured_at,
        resumed_after=earlier.resumed_after,
        loadavg=earlier.loadavg,
        critical_path_s=earlier.critical_path_s,
    )


@dataclass(frozen=True)
class StepTiming:
    """An earlier run's figures for the first ``step`` steps of a phase, every answer the model's (none cached),
    and when they were measured."""

    step: int
    stats: PhaseStats
    measured_at: str


class Resumed:
    """The figures of a learning phase resumed at a step of an earlier run.

    ``at(step, fresh)`` is called after every step with this run's figures so far. When this run reaches the
    earlier run's step having made exactly that run's calls, all of them from the cache, the replay up to there
    is replaced by the earlier timing: wall time is the earlier run's up to the step plus this run's after it;
    calls and tokens are this run's (a cached answer carries the usage it was served with); the calls replayed
    up to the step are not counted as cached, since the model answered them then. In any other case (no
    earlier timing, a different number of calls, any of them answered afresh) the figures are this run's own.
    """

    def __init__(self, earlier: StepTiming | None) -> None:
        self.earlier = earlier
        self._mark: PhaseStats | None = None  # this run's figures when it reached the earlier step

    def at(self, step: int, fresh: PhaseStats) -> PhaseStats:
        e = self.earlier
        if (
            self._mark is None
            and e is not None
            and step == e.step
            and fresh.calls == fresh.cached == e.stats.calls > 0
            and e.stats.cached == 0
        ):
            self._mark = fresh.copy()
        return self.figures(fresh)

    def figures(self, fresh: PhaseStats) -> PhaseStats:
        if self._mark is None or self.earlier is None:
            return fresh
        mark, e = self._mark, self.earlier
        return replace(
            fresh,
            wall_s=e.stats.wall_s + (fresh.wall_s - mark.wall_s),
            cached=fresh.cached - mark.cached,
            models=set(fresh.models),
            timed_at=e.measured_at,
            resumed_after=e.step,
        )


PhaseDone = Callable[[str, PhaseStats], None]
StepDone = Callable[[str, int, PhaseStats], None]


class MeteredLLM:
    """The port, counting every answer into a :class:`PhaseStats`. Says the inner LLM's context window for a
    role when the inner one can (``context_tokens``), so the core sizes requests as it would without the
    wrapper."""

    def __init__(self, inner: LLM, stats: PhaseStats) -> None:
        self.inner = inner
        self.stats = stats

    async def complete(self, request: ChatRequest) -> ChatResponse:
        response = await self.inner.complete(request)
        self.stats.add(response)
        return response

    async def context_tokens(self, role: Role) -> int | None:
        ask = getattr(self.inner, "context_tokens", None)
        return await ask(role) if ask is not None else None


@dataclass(frozen=True)
class HarnessConfig:
    """What to run. ``methods`` maps a method name to its learner configuration, run in that order."""

    task: str
    train: Sequence[Question]
    test: Sequence[Question]
    methods: Mapping[str, LearnConfig]
    concurrency: int = 4
    dedup: NearDuplicates | None = None  # the learners' semantic de-duplicator, as the workers use it; None: exact


@dataclass
class HarnessResult:
    config: HarnessConfig
    train_attempts: list[Attempt]
    traces: list[Trace]
    learned: dict[str, LearnResult]
    failed: dict[str, str]  # method -> why it could not learn (its calls did not fit the model's context)
    evals: dict[str, list[Attempt]]
    playbooks: dict[str, Playbook]
    phases: dict[str, PhaseStats]
    wall_s: float
    context_tokens: int | None = None  # the model's context window per request, when the LLM says it


class _Quiet:
    def update(self, done: int, total: int, note: str = "") -> None:
        pass

    def close(self) -> None:
        pass


def _learn_progress(bar: ProgressBar, step: Callable[[int], None]) -> Callable[[int, int, Playbook], None]:
    def update(done: int, total: int, playbook: Playbook) -> None:
        step(done)
        bar.update(done, total, f"{len(playbook.bullets)} bullets")

    return update


def _stepper(
    name: str, stats: PhaseStats, resumed: Resumed, clock: Callable[[], float], t0: float, on_step: StepDone | None
) -> Callable[[int], None]:
    """After each step of a learning phase: its figures so far, resumed if they can be, handed to ``on_step``."""

    def step(n: int) -> None:
        stats.wall_s = clock() - t0
        figures = resumed.at(n, stats)
        if on_step is not None:
            on_step(name, n, figures)

    return step


async def run_harness(
    config: HarnessConfig,
    llm_for: LLMFactory,
    *,
    progress: ProgressFactory | None = None,
    clock: Callable[[], float] = time.monotonic,
    timed: Mapping[str, tuple[PhaseStats, str]] | None = None,
    on_phase: PhaseDone | None = None,
    steps: Mapping[str, StepTiming] | None = None,
    on_step: StepDone | None = None,
) -> HarnessResult:
    """Run the three phases (module docstring) and return everything they produced, uncut.

    A method whose calls cannot fit the model's context window (:class:`~combee.errors.ContextTooSmall`: e.g.
    one naive curator call over many reflections on a small-context server) is recorded in ``failed`` and not
    evaluated; the others go on. Other LLM-layer errors (endpoint gone after retries) propagate; with a
    response cache a re-run resumes cheaply.
    """

    def bar(label: str) -> ProgressBar:
        return progress(label) if progress is not None else _Quiet()

    def done(name: str) -> None:
        """A phase ended: an earlier run's timing replaces a replay's (module docstring), then hand it out."""
        earlier = (timed or {}).get(name)
        if earlier is not None:
            phases[name] = with_timing(phases[name], earlier[0], earlier[1])
        if on_phase is not None:
            on_phase(name, phases[name])

    started = clock()
    phases: dict[str, PhaseStats] = {}
    empty = Playbook(namespace=config.task)

    # 1. traces, with the empty playbook
    stats = phases.setdefault("traces", PhaseStats())
    p = bar("traces (agent, empty playbook)")
    t0 = clock()
    async with llm_for("traces") as llm:
        context = await context_tokens_of(llm, Role.GENERATOR)
        train_attempts = await answer_all(
            MeteredLLM(llm, stats), config.task, config.train, empty, concurrency=config.concurrency,
            progress=p.update,
        )  # fmt: skip
    stats.wall_s = clock() - t0
    p.close()
    done("traces")
    traces = [to_trace(a, namespace=config.task, playbook_version=empty.version) for a in train_attempts]

    # 2. learn the same traces with every method
    learned: dict[str, LearnResult] = {}
    failed: dict[str, str] = {}
    for method, learn_config in config.methods.items():
        name = f"learn-{method}"
        stats = phases.setdefault(name, PhaseStats())
        resumed = Resumed((steps or {}).get(name))
        p = bar(f"learning ({method})")
        t0 = clock()
        step = _stepper(name, stats, resumed, clock, t0, on_step)
        try:
            async with llm_for(name) as llm:
                learned[method] = await learn(
                    traces,
                    MeteredLLM(llm, stats),
                    learn_config,
                    progress=_learn_progress(p, step),
                    clock=clock,
                    dedup=config.dedup,
                )
        except ContextTooSmall as exc:  # this method's calls do not fit the model; the others may
            failed[method] = f"{exc} (serve a larger context per slot, or use a smaller --batch-size)"
        finally:
            stats.wall_s = clock() - t0
            p.close()
        phases[name] = resumed.figures(stats)
        done(name)

    # 3. evaluate the empty playbook and every learned one on the same test questions
    playbooks = {BASELINE: empty, **{m: r.playbook for m, r in learned.items()}}
    evals: dict[str, list[Attempt]] = {}
    async with llm_for("eval") as llm:
        for name, playbook in playbooks.items():
            stats = phases.setdefault(f"eval-{name}", PhaseStats())
            p = bar(f"evaluating ({name}, {len(playbook.bullets)} bullets)")
            t0 = clock()
            evals[name] = await answer_all(
                MeteredLLM(llm, stats), config.task, config.test, playbook, concurrency=config.concurrency,
                progress=p.update,
            )  # fmt: skip
            stats.wall_s = clock() - t0
            p.close()
            done(f"eval-{name}")

    return HarnessResult(
        config=config,
        train_attempts=train_attempts,
        traces=traces,
        learned=learned,
        failed=failed,
        context_tokens=context,
        evals=evals,
        playbooks=playbooks,
        phases=phases,
        wall_s=clock() - started,
    )
