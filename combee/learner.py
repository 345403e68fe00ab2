"""The offline learner: epochs over a trace list, fixed or controller-chosen batch sizes, evaluation hook.

Windows are consecutive slices of the namespace's traces in file order; window ids use the source
``file:e<epoch>`` and the slice's first/last indices, so a re-run makes the same plans.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from combee.controller import BatchSizeController, ControllerDecision
from combee.corroborate import PendingLesson
from combee.embeddings import NearDuplicates
from combee.engine import Method, MethodConfig, Window, WindowResult, run_window
from combee.errors import ConfigError, LLMParseError
from combee.llm import LLM
from combee.meter import Meter
from combee.models import Playbook, Trace
from combee.playbook import ApplyStats, playbook_tokens
from combee.prompts import DEFAULT_PROMPTS, PromptSet, generator_request, parse_answer

__all__ = [
    "EvalResult",
    "EvalTask",
    "IterationRecord",
    "LearnConfig",
    "LearnResult",
    "evaluate",
    "learn",
]


@dataclass(frozen=True)
class LearnConfig:
    """``batch_size`` is a number or ``"auto"`` (the controller); sequential always uses windows of one."""

    method: MethodConfig = field(default_factory=MethodConfig)
    batch_size: int | str = 50
    epochs: int = 1
    controller: BatchSizeController | None = None

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ConfigError("epochs must be >= 1")
        if isinstance(self.batch_size, str):
            if self.batch_size != "auto":
                raise ConfigError(f"batch size must be a positive integer or 'auto', got {self.batch_size!r}")
        elif self.batch_size < 1:
            raise ConfigError(f"batch size must be a positive integer or 'auto', got {self.batch_size}")


@dataclass(frozen=True)
class IterationRecord:
    window_id: str
    epoch: int
    batch_size: int
    reflections: int
    wall_s: float
    critical_path_s: float
    llm_calls: int
    group_calls: int
    merge_calls: int
    ops: int
    playbook_version: int
    playbook_entries: int
    trial: bool = False
    applied: ApplyStats = field(default_factory=ApplyStats)  # what applying the delta did (added, deduplicated, ...)
    teaching: int = 0  # reflections with an insight after the screen: what the reduce planned over


@dataclass
class LearnResult:
    playbook: Playbook
    iterations: list[IterationRecord]
    meter: Meter
    wall_s: float
    decision: ControllerDecision | None = None
    pending: tuple[PendingLesson, ...] = ()  # lessons still waiting for corroboration at the end

    @property
    def critical_path_s(self) -> float:
        return sum(it.critical_path_s for it in self.iterations)

    @property
    def batch_sizes(self) -> list[int]:
        return [it.batch_size for it in self.iterations]


ProgressFn = Callable[[int, int, Playbook], None]


def _record(result: WindowResult, epoch: int, size: int, trial: bool) -> IterationRecord:
    roles = result.meter.roles
    return IterationRecord(
        window_id=result.window_id,
        epoch=epoch,
        batch_size=size,
        reflections=result.reflections,
        wall_s=result.wall_s,
        teaching=result.teaching,
        critical_path_s=result.critical_path_s,
        llm_calls=result.meter.calls,
        group_calls=roles["curator"].calls if "curator" in roles else 0,
        merge_calls=roles["merger"].calls if "merger" in roles else 0,
        ops=len(result.delta.ops),
        playbook_version=result.playbook.version,
        playbook_entries=len(result.playbook.bullets),
        trial=trial,
        applied=result.apply_stats,
    )


async def learn(
    traces: Sequence[Trace],
    llm: LLM,
    config: LearnConfig,
    *,
    playbook: Playbook | None = None,
    prompts: PromptSet = DEFAULT_PROMPTS,
    progress: ProgressFn | None = None,
    clock: Callable[[], float] = time.monotonic,
    dedup: NearDuplicates | None = None,
) -> LearnResult:
    """Learn a playbook from ``traces`` (all of one namespace) with ``config``; returns the final state.

    Raises ConfigError for an empty or mixed-namespace input; LLM-layer errors propagate (the endpoint is down).
    """
    if not traces:
        raise ConfigError("no traces to learn from")
    namespaces = sorted({t.namespace for t in traces})
    if len(namespaces) != 1:
        raise ConfigError(f"traces span several namespaces ({', '.join(namespaces[:5])}); learn one at a time")
    namespace = namespaces[0]
    current = playbook or Playbook(namespace=namespace)
    pending: tuple[PendingLesson, ...] = ()  # lessons waiting for corroboration (combee.corroborate)
    meter = Meter()
    records: list[IterationRecord] = []
    started = clock()
    method = config.method
    auto = config.batch_size == "auto" and method.method is not Method.SEQUENTIAL
    controller = (config.controller or BatchSizeController()) if auto else None
    decision: ControllerDecision | None = None
    total = len(traces) * config.epochs
    done = 0

    for epoch in range(config.epochs):
        i = 0
        while i < len(traces):
            trial = False
            if method.method is Method.SEQUENTIAL:
                size = 1
            elif controller is not None:
                nxt = controller.next_trial()
                if nxt is not None:
                    size, trial = nxt, True
                else:
                    if decision is None:
                        decision = controller.decide()
                    size = decision.batch_size
            else:
                assert isinstance(config.batch_size, int)
                size = config.batch_size
            chunk = tuple(traces[i : i + size])
            window = Window(namespace, f"file:e{epoch}", i, i + len(chunk) - 1, chunk)
            result = await run_window(
                window, current, llm, method, prompts=prompts, clock=clock, dedup=dedup, pending=pending
            )
            current, pending = result.playbook, result.pending
            meter.absorb(result.meter)
            records.append(_record(result, epoch, len(chunk), trial))
            if controller is not None and trial:
                controller.observe(len(chunk), result.wall_s)
            i += len(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, total, current)
    if controller is not None and decision is None:
        decision = controller.decide()
    return LearnResult(
        playbook=current, iterations=records, meter=meter, wall_s=clock() - started, decision=decision, pending=pending
    )


# --- evaluation -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalTask:
    task_id: str
    task: str
    ground_truth: str


@dataclass(frozen=True)
class EvalResult:
    accuracy: float
    correct: int
    total: int
    unparsed: int
    meter: Meter


def exact_match(answer: str, truth: str) -> bool:
    return answer.strip().casefold() == truth.strip().casefold()


async def evaluate(
    tasks: Sequence[EvalTask],
    playbook: Playbook,
    llm: LLM,
    *,
    prompts: PromptSet = DEFAULT_PROMPTS,
    grader: Callable[[str, str], bool] = exact_match,
    concurrency: int = 32,
) -> EvalResult:
    """Answer held-out tasks through the generator role with ``playbook`` as system prompt; grade each.

    An answer that does not parse counts as wrong (and as ``unparsed``).
    """
    from combee.llm import Role

    meter = Meter()
    gate = asyncio.Semaphore(concurrency)
    unparsed = 0

    async def one(task: EvalTask) -> bool:
        nonlocal unparsed
        async with gate:
            response = await llm.complete(generator_request(task.task, playbook, prompts))
        meter.record(Role.GENERATOR, response)
        try:
            return grader(parse_answer(response.text), task.ground_truth)
        except LLMParseError:
            unparsed += 1
            return False

    results = await asyncio.gather(*(one(t) for t in tasks))
    correct = sum(results)
    return EvalResult(
        accuracy=correct / len(tasks) if tasks else 0.0,
        correct=correct,
        total=len(tasks),
        unparsed=unparsed,
        meter=meter,
    )


def playbook_summary(playbook: Playbook) -> dict[str, int]:
    return {"playbook_entries": len(playbook.bullets), "playbook_tokens": playbook_tokens(playbook)}
