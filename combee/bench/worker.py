"""One benchmark training run, executed in a worker process through the real OpenAI client.

:func:`train` is what the orchestrator submits to its process pool: it reads the run's trace file, learns
with :func:`combee.learner.learn` against the simulator's HTTP endpoint (``OpenAILLM``, as ``combee learn``
does) and returns a JSON-ready record: the learner's own wall time and critical path, calls and tokens,
the final playbook, and the plan checks (largest level-1 group, largest merge fan-in, tree depth) recomputed
from the plans the engine executed. Evaluation and ground-truth scoring happen later, in the orchestrator.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from combee.bench.spec import RunSpec
from combee.controller import BatchSizeController
from combee.corroborate import Corroboration
from combee.engine import Method, MethodConfig
from combee.learner import LearnConfig, LearnResult, learn
from combee.llm import LLM, ChatRequest, ChatResponse, Role
from combee.playbook import playbook_tokens
from combee.tracefile import read_traces
from combee.wiring import simulator_llm

__all__ = ["InFlightProbe", "SentCall", "exit_with_parent", "plan_checks", "sent_checks", "train"]

SIM_START_TIMEOUT_S = 180.0
"""How long a run waits for its simulator's ready line. Starting is a Python import, seconds on a quiet machine;
under a CPU-bound neighbour at ``nice 19`` one took over 30 s, and the run failed for nothing but that."""

_ITEM_BLOCKS = {Role.CURATOR: "reflections", Role.MERGER: "proposals"}


def exit_with_parent(parent_pid: int, poll_s: float = 1.0) -> None:
    """Pool initializer: the worker exits as soon as the orchestrator that started it is gone.

    ``combee bench`` stopped by SIGTERM (a CI timeout, ``kill``) does not unwind its process pool, and the spawned
    workers would go on with their runs, minutes long, for nobody, sharing the machine with whatever runs next
    (their simulators exit with them: they stop at the end of their stdin). Ctrl-C reaches the whole process
    group and needs none of this.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(1)  # no unwinding: there is nobody to report to

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


@dataclass(frozen=True)
class SentCall:
    """One consolidating request as it was sent: its role, how many items its data block held, and when it
    was in flight (client monotonic seconds)."""

    role: Role
    items: int
    started: float
    ended: float


def _items_in(request: ChatRequest) -> int:
    block = _ITEM_BLOCKS.get(request.role)
    if block is None:
        return 0
    user = "\n".join(m.content for m in request.messages if m.role == "user")
    found = re.search(rf"<{block}>\n(.*?)\n</{block}>", user, re.DOTALL)
    return sum(1 for line in found.group(1).splitlines() if line.strip()) if found else 0


class InFlightProbe:
    """An :class:`~combee.llm.LLM` wrapper that records how many calls were in flight at most, and every
    request as it was sent (with the item count of consolidating ones), for :func:`sent_checks`."""

    def __init__(self, inner: LLM, clock: Any = time.monotonic) -> None:
        self.inner = inner
        self.in_flight = 0
        self.max_in_flight = 0
        self.sent: list[SentCall] = []
        self._clock = clock

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        started = self._clock()
        try:
            return await self.inner.complete(request)
        finally:
            self.in_flight -= 1
            self.sent.append(SentCall(request.role, _items_in(request), started, self._clock()))


def sent_checks(sent: list[SentCall]) -> dict[str, Any]:
    """The reduce's shape as the requests actually sent show it: items per curator call, proposals per merge
    call, and the depth (curator level + merge levels). Consolidating calls separated by other calls (a map
    stage) belong to different windows."""
    calls = sorted(sent, key=lambda c: c.started)
    curator = [c.items for c in calls if c.role is Role.CURATOR]
    merger = [c.items for c in calls if c.role is Role.MERGER]
    # Depth = 1 (the curator level) + merge levels, a new merge level starting with a merge call sent after every
    # merge call of the level before it had come back. Exact for one tree per window; for a keyed reduce, whose
    # sections run side by side, a section's merge that ends before another's starts counts as a deeper level.
    depth = 0
    levels = 0
    level_end = -1.0
    previous: Role | None = None
    for call in calls:
        if call.role not in _ITEM_BLOCKS:
            previous = call.role
            continue
        if call.role is Role.CURATOR:
            if previous not in (Role.CURATOR, Role.MERGER):
                levels, level_end = 1, -1.0  # a new window's reduce (after its map stage)
        elif call.started >= level_end:
            levels += 1
            level_end = call.ended
        else:
            level_end = max(level_end, call.ended)
        depth = max(depth, levels)
        previous = call.role
    return {
        "curator_calls_sent": len(curator),
        "merge_calls_sent": len(merger),
        "max_items_per_curator_call": max(curator, default=0),
        "max_proposals_per_merge_call": max(merger, default=0),
        "mean_items_per_curator_call": sum(curator) / len(curator) if curator else 0.0,
        "mean_proposals_per_merge_call": sum(merger) / len(merger) if merger else 0.0,
        "max_depth_sent": depth,
    }


def method_config(spec: RunSpec) -> MethodConfig:
    return MethodConfig(
        method=Method(spec.method),
        p=spec.p,
        max_group_items=spec.max_group_items,
        max_fan_in=spec.max_fan_in,
        group_factor=spec.group_factor,
        shuffle_key=spec.shuffle_key,
        corroboration=Corroboration(
            min_traces=spec.corroborate, trace_cap=spec.trace_cap, harmful_tags=spec.harmful_tags
        ),
    )


def plan_checks(spec: RunSpec, result: LearnResult) -> dict[str, Any]:
    """The shape of every reduce the run executed, recomputed from its (deterministic) plans.

    A plan depends only on the reflection count, the method knobs and the window id, all in the iteration
    records, so this is exactly what the engine ran. Also cross-checks the call counts against the plans.
    """
    config = method_config(spec)
    if spec.shuffle_key != "none":  # a keyed plan depends on the reflections' keys: see the sent checks
        return {"keyed": spec.shuffle_key}
    groups = merges = max_items = max_reflections = max_fan_in = depth = 0
    max_k = 0
    for it in result.iterations:
        if spec.method != "combee" or it.reflections == 0:
            continue
        plan = config.plan(it.reflections, it.window_id)
        groups += plan.groups.k
        merges += plan.tree.merge_calls
        max_k = max(max_k, plan.groups.k)
        max_items = max(max_items, *(len(g) for g in plan.groups.augmented))
        max_reflections = max(max_reflections, *(len(g) for g in plan.groups.groups))
        fan_ins = [len(node.children) for level in plan.tree.levels for node in level]
        max_fan_in = max(max_fan_in, *fan_ins, 0)
        depth = max(depth, plan.tree.depth)
    curator_calls = sum(it.group_calls for it in result.iterations)
    merger_calls = sum(it.merge_calls for it in result.iterations)
    return {
        "planned_group_calls": groups,
        "planned_merge_calls": merges,
        "max_level1_groups": max_k,
        "max_group_items_seen": max_items,
        "max_group_reflections_seen": max_reflections,
        "max_fan_in_seen": max_fan_in,
        "max_tree_depth": depth,
        # retries after unparsable answers add calls; without them calls equal the plan exactly
        "calls_cover_plan": spec.method != "combee" or (curator_calls >= groups and merger_calls >= merges),
    }


async def _train(
    spec: RunSpec, base_url: str, traces_path: str, concurrency: int, timeout_s: float, sim_config: dict[str, Any]
) -> dict:
    traces = read_traces(Path(traces_path)).traces[: spec.n_traces]
    client = simulator_llm(base_url, max_concurrency=concurrency, timeout_s=timeout_s)
    probe = InFlightProbe(client)
    controller = (
        BatchSizeController(candidates=spec.auto_grid, bs_max=spec.auto_max) if spec.batch_size == "auto" else None
    )
    config = LearnConfig(method=method_config(spec), batch_size=spec.batch_size, controller=controller)
    cpu_started = time.process_time()
    try:
        result = await learn(traces, probe, config)
    finally:
        await client.aclose()
    cpu_s = time.process_time() - cpu_started
    meter = result.meter
    roles = {
        role: {
            "calls": s.calls,
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens,
            "parse_failures": s.parse_failures,
            "max_prompt_tokens": s.max_prompt_tokens,
            "cached_prompt_tokens": s.cached_prompt_tokens,
        }
        for role, s in sorted(meter.roles.items())
    }
    cached_prompt_tokens = meter.usage.cached_prompt_tokens
    return {
        "key": spec.key,
        "config_key": spec.config_key,
        **asdict(spec),
        "sim_config": sim_config,
        "wall_s": result.wall_s,
        "critical_path_s": result.critical_path_s,
        "llm_calls": meter.calls,
        "prompt_tokens": meter.usage.prompt_tokens,
        "completion_tokens": meter.usage.completion_tokens,
        "cached_prompt_tokens": cached_prompt_tokens,
        "cached_share": cached_prompt_tokens / meter.usage.prompt_tokens if meter.usage.prompt_tokens else 0.0,
        "paced_s": client.stats.paced_s,
        "rate_limited_retries": client.stats.retries.get("rate_limited", 0),
        "roles": roles,
        "playbook_entries": len(result.playbook.bullets),
        "playbook_tokens": playbook_tokens(result.playbook),
        "iterations": len(result.iterations),
        "windows": sorted(set(result.batch_sizes)),
        "parse_failures": sum(s.parse_failures for s in meter.roles.values()),
        "skipped_traces": meter.skipped_traces,
        "skipped_groups": meter.skipped_groups,
        "held": dict(sorted(meter.held.items())),  # what corroboration held back, by reason
        "pending_at_end": len(result.pending),
        "merge_fallbacks": meter.merge_fallbacks,
        "redundant_combines": meter.redundant_combines,
        "unknown_proposal_ids": meter.unknown_proposal_ids,
        "simulated": bool(meter.simulated and not meter.real),
        "client_cpu_s": cpu_s,
        "max_in_flight": probe.max_in_flight,
        "plan": {**plan_checks(spec, result), **sent_checks(probe.sent)},
        "controller": result.decision.as_dict() if result.decision is not None else None,
        "per_iteration": [
            {
                "batch_size": it.batch_size,
                "reflections": it.reflections,
                "wall_s": round(it.wall_s, 5),
                "critical_path_s": round(it.critical_path_s, 5),
                "llm_calls": it.llm_calls,
                "playbook_entries": it.playbook_entries,
                "trial": it.trial,
            }
            for it in result.iterations
        ],
        "playbook_json": result.playbook.model_dump_json(),
    }


def train(
    spec: RunSpec,
    base_url: str | None,
    traces_path: str,
    concurrency: int = 256,
    timeout_s: float = 600.0,
    sim_config_json: str | None = None,
) -> dict:
    """Run ``spec`` against the OpenAI-compatible endpoint at ``base_url``; see the module docstring.

    With ``base_url`` None, the run starts a simulator of its own (``sim_config_json``, the Combee world) for
    its duration, so no other run shares its server (throughput, rate limits, prefix cache). The record's
    ``sim_config`` is the simulator's profile, merge capacity factor and time scale.

    Raises the LLM layer's errors if the endpoint stays down (the orchestrator reports the run as failed).
    """
    from combee.sim.config import SimConfig
    from combee.sim.runner import SimProcess

    with contextlib.ExitStack() as stack:
        described: dict[str, Any] = {}
        if sim_config_json is not None:
            config = SimConfig.model_validate_json(sim_config_json)
            described = {
                "profile": config.profile,
                "merge_capacity_factor": config.merge_capacity_factor,
                "time_scale": config.time_scale,
                "requests_per_minute": config.requests_per_minute,
                "tokens_per_minute": config.tokens_per_minute,
                "shared_throughput": config.shared_throughput,
                "labels": config.labels,
            }
        if base_url is None:
            if sim_config_json is None:
                raise ValueError("train() needs a base_url or a simulator config")
            sim = SimProcess(config, world="combee", quiet=True).start(timeout=SIM_START_TIMEOUT_S)
            stack.callback(sim.stop)
            base_url = sim.base_url
        return asyncio.run(_train(spec, base_url, traces_path, concurrency, timeout_s, described))
