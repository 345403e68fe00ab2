"""The closed loop (issue 24 item 4; ``combee demo --closed-loop``): a SIMULATED fleet learns through the real
pipeline, then a bad version is injected and each promotion policy answers it.

Everything here runs on the real Kafka and Redis with a real ``combee worker``; the model is the simulator
(:mod:`combee.sim.world`): the worker's reflector, curator and merger, the gate's generator *and the agents'
generator* are the same SIMULATED server. Per policy (one namespace each):

1. **learn** (policy ``direct``): the fleet answers tasks and publishes a trace per task, naming the version it ran
   with and whether the answer was right; the worker learns from them and counts outcomes per version.
2. The namespace's policy is set (``gate`` with a validation set of the same kind of tasks, ``canary`` with a
   fraction; ``direct`` stays), then a **bad version** is injected: one signed ``remove`` control record names
   every bullet that carries a lesson (a rule key), so the combiner commits, through the path every operator
   action takes, one version without them.
3. **decide**: the fleet goes on until the policy's answer is recorded (gate: reject; canary: reject; direct: a
   rollback on outcomes) or a cap on tasks. 4. **after**: a few more tasks.

An agent is one of ``agents`` ids, each with its own :class:`streams.client.AsyncPromptClient` (so a canary arm is
stable); tasks go round-robin over the ids. The simulated generator answers right with probability 0.88 when the
playbook holds the task's rule and 0.66 otherwise (common random numbers per task, :mod:`combee.sim.world`), so a
version's success rate is what its lessons are worth. Every figure in the result file comes from the agents' own
records (:mod:`combee.closedloop`) and the decisions recorded in Redis.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from combee.closedloop import (
    AgentRecord,
    Assessment,
    answering_decision,
    assess,
    counts_json,
    seq_at,
    text_chart,
    timeline,
)
from combee.closedloop import version_table as table_of
from combee.graders import make_grader
from combee.models import Playbook
from combee.outcomes import as_json
from combee.promotion import Decision
from combee.serving import Policy, arm_position
from combee.sim.world import DOCS, METRICS, WORLDS, expected_answer, insight_keys_in, seeded_pick
from combee.validation import ValidationTask, validation_line

__all__ = ["LABEL", "LoopConfig", "fleet_task", "lesson_bullets", "run_closed_loop", "summary_table", "worker_env"]

LABEL = "SIMULATED (Combee simulator; not a real model)"


@dataclass(frozen=True)
class LoopConfig:
    """The closed loop's sizes. ``rate``: tasks per second of the whole fleet; ``hot_rules``: how many of the
    formula world's rules the fleet's tasks hinge on (uniformly); ``window``: traces per learning window (the
    decision on the bad version has to come before the next window builds on it and relearns its lessons);
    ``before_tasks``: tasks on the live version before the injection (its evidence for a rollback);
    ``min_decided``, ``margin``: the outcome test of the canary and the rollback; ``fraction``: the canary's."""

    policies: tuple[Policy, ...] = ("gate", "canary", "direct")
    agents: int = 2000
    rate: float = 25.0
    concurrency: int = 8
    hot_rules: int = 12
    window: int = 1000
    max_wait_s: float = 60.0
    learn_tasks: int = 1000
    before_tasks: int = 150
    max_decide_tasks: int = 2000
    after_tasks: int = 150
    min_decided: int = 80
    margin: float = 0.05
    fraction: float = 0.1
    validation_tasks: int = 60
    gate_min_pairs: int = 40
    check_s: float = 1.0
    time_scale: float = 0.02
    seed: int = 1
    block: int = 100
    settle_timeout_s: float = 300.0


def worker_env(cfg: LoopConfig) -> dict[str, str]:
    """The worker's settings for the loop: windows of ``window`` traces, the outcome test's sizes, a fast check."""
    return {
        "COMBEE_PROMOTION_POLICY": "direct",
        "COMBEE_PROMOTION_MIN_DECIDED": str(cfg.min_decided),
        "COMBEE_PROMOTION_MARGIN": str(cfg.margin),
        "COMBEE_PROMOTION_CHECK_S": str(cfg.check_s),
        "COMBEE_PROMOTION_GATE_MIN_PAIRS": str(cfg.gate_min_pairs),
        "COMBEE_BS_CANDIDATES": f"[{cfg.window}]",
        "COMBEE_BS_MIN": str(cfg.window),
        "COMBEE_BS_MAX": str(cfg.window),
        "COMBEE_BS_DEFAULT": str(cfg.window),
    }


def _h(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "big")


def hot_rules(cfg: LoopConfig) -> list[str]:
    """The rules of the formula world the fleet's tasks hinge on (a seeded choice)."""
    world = WORLDS["formula"]
    keys = sorted((world.key(i) for i in range(world.universe)), key=lambda k: _h("hot", cfg.seed, k))
    return keys[: cfg.hot_rules]


def fleet_task(rules: Sequence[str], j: int, seed: int, kind: str = "task") -> tuple[str, str]:
    """Task ``j`` of the fleet (``kind`` "task") or of the validation set ("val"): its text, naming its rule as the
    simulator's tasks do, and its ground truth (SIMULATED)."""
    key = rules[_h(kind, seed, j) % len(rules)]
    metric, doc = seeded_pick(METRICS, "metric", key), seeded_pick(DOCS, "doc", key)
    year = 2015 + _h("year", kind, seed, j) % 10
    task = (f"From the {doc} of company C{_h('co', kind, seed, j) % 97:02d}, compute the {metric} for FY{year}. "
            f"Give the value to two decimals. (case {key}, {kind} {j})")  # fmt: skip
    return task, expected_answer(task)


def lesson_bullets(playbook: Playbook) -> tuple[str, ...]:
    """The bullets that carry a lesson of the simulated world (a rule key): what the bad version removes."""
    return tuple(b.id for b in playbook.bullets if insight_keys_in(b.content))


def validation_text(cfg: LoopConfig, rules: Sequence[str]) -> str:
    """The gate's validation set: tasks of the fleet's kind (never asked by the fleet), graded exactly."""
    lines = []
    for j in range(cfg.validation_tasks):
        task, truth = fleet_task(rules, j, cfg.seed, "val")
        lines.append(validation_line(ValidationTask(f"val-{j}", task, truth, "exact")))
    return "\n".join(lines) + "\n"


def _say(text: str) -> None:
    print(f"[closed-loop] {text}", flush=True)


@dataclass
class Fleet:
    """The SIMULATED agents of one namespace: read the prompt through their own AsyncPromptClient, answer with the
    simulator's generator, publish a trace naming the version, and keep a record of each task."""

    namespace: str
    redis: Any  # redis.asyncio.Redis
    prefix: str
    llm: Any
    publisher: Any
    cfg: LoopConfig
    rules: Sequence[str]
    records: list[AgentRecord] = field(default_factory=list)
    clients: dict[str, Any] = field(default_factory=dict)
    playbooks: dict[int, Playbook] = field(default_factory=dict)
    seq: int = 0

    def __post_init__(self) -> None:
        ids = [f"agent-{i:04d}" for i in range(self.cfg.agents)]
        random.Random(self.cfg.seed).shuffle(ids)
        self.ids = ids
        self.grader = make_grader("exact", {})

    def client(self, agent: str) -> Any:
        from streams.client import AsyncPromptClient

        if agent not in self.clients:
            self.clients[agent] = AsyncPromptClient(self.redis, self.namespace, key_prefix=self.prefix,
                                                    max_age_s=0.5, agent_id=agent)  # fmt: skip
        return self.clients[agent]

    async def playbook(self, version: int) -> Playbook:
        from streams.keys import RedisKeys
        from streams.redis_store import RedisPromptStore

        if version not in self.playbooks:
            found = await RedisPromptStore(self.redis, RedisKeys(self.prefix)).get_version(self.namespace, version)
            empty = Playbook(namespace=self.namespace)
            self.playbooks[version] = Playbook.model_validate_json(found.playbook_json) if found else empty
        return self.playbooks[version]

    async def one(self, seq: int, phase: str) -> None:
        from combee.tasks.agent import answer_one
        from streams.client import PromptUnavailable

        agent = self.ids[seq % len(self.ids)]
        try:
            version = (await self.client(agent).get()).version
        except PromptUnavailable:
            version = 0  # nothing served yet: the agent runs with an empty playbook
        playbook = await self.playbook(version) if version else Playbook(namespace=self.namespace)
        task, truth = fleet_task(self.rules, seq, self.cfg.seed)
        response, extracted = await answer_one(self.llm, task, playbook, context_tokens=None)
        ok = extracted.answer is not None and self.grader(extracted.answer, truth).success
        self.records.append(AgentRecord(time.time(), seq, phase, agent, version, ok))
        message = "Correct." if ok else f"Incorrect: expected {truth}."
        self.publisher.publish({
            "schema_version": 1, "trace_id": f"{self.namespace}-{seq:06d}", "namespace": self.namespace,
            "task": task, "steps": [{"kind": "thought", "content": response.text[:400]}],
            "output": extracted.answer or "", "playbook_version": version,
            "feedback": {"score": float(ok), "success": ok, "ground_truth": truth, "message": message},
            "metadata": {"simulated": True},
        })  # fmt: skip

    async def run(self, n: int, phase: str, stop: Callable[[], bool] = lambda: False) -> int:
        """Answer ``n`` tasks at the configured rate (fewer when ``stop`` says so); returns how many ran."""
        start, first = time.monotonic(), self.seq
        done = 0
        pending: set[asyncio.Task[None]] = set()
        while done < n and not stop():
            delay = start + done / self.cfg.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            while len(pending) >= self.cfg.concurrency:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending.add(asyncio.create_task(self.one(first + done, phase)))
            done += 1
        if pending:
            await asyncio.gather(*pending)
        self.seq = first + done
        self.publisher.flush(30)
        return done

    async def close(self) -> None:
        for c in self.clients.values():
            await c.aclose()


async def _learned(redis: Any, prefix: str, namespace: str) -> int:
    from streams.client import AsyncPromptClient

    client = AsyncPromptClient(redis, namespace, key_prefix=prefix)
    return sum(int((h.meta or {}).get("traces") or 0) for h in await client.history(limit=10_000))


async def _wait(what: str, check: Callable[[], Any], timeout_s: float, every_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(every_s)
    raise TimeoutError(f"timed out after {timeout_s:g}s waiting for {what}")


async def _set_policy(promotion: Any, ns: str, policy: Policy, fraction: float) -> None:
    now = time.time()
    decision = Decision("policy", 0, "operator:closed-loop", policy, f"policy {policy} (closed loop)", at=now)
    await promotion.set_policy(ns, policy, fraction if policy == "canary" else 0.0, decision.as_json(),
                               set_by="closed-loop", at=now)  # fmt: skip


async def run_policy(
    policy: Policy, cfg: LoopConfig, *, redis: Any, prefix: str, llm: Any, publisher: Any, settings: Any
) -> tuple[dict[str, Any], list[AgentRecord]]:
    """One policy's run in its own namespace (see the module docstring): its part of the result file, and the
    agents' records."""
    from streams.control import send_control
    from streams.envelopes import Control
    from streams.keys import RedisKeys
    from streams.redis_outcomes import RedisOutcomes
    from streams.redis_promotion import RedisPromotion

    ns = f"loop-{policy}"
    keys = RedisKeys(prefix)
    promotion = RedisPromotion(redis, keys)
    rules = hot_rules(cfg)
    fleet = Fleet(ns, redis, prefix, llm, publisher, cfg, rules)
    try:
        await _set_policy(promotion, ns, "direct", 0.0)
        _say(f"{ns}: learning from {cfg.learn_tasks} tasks under direct")
        await fleet.run(cfg.learn_tasks, "learn")

        async def caught_up() -> bool:
            return await _learned(redis, prefix, ns) >= fleet.seq

        await _wait(f"{ns} to learn from every trace", caught_up, cfg.settle_timeout_s)
        await fleet.run(cfg.before_tasks, "before")  # evidence on the live version; its window stays open
        if policy == "gate":
            await promotion.set_validation(ns, validation_text(cfg, rules))
        if policy != "direct":
            await _set_policy(promotion, ns, policy, cfg.fraction)
        head = await promotion.head(ns) or 0
        live = (await promotion.serving(ns)).live if policy != "direct" else head
        live_before = live if live is not None else head
        good = await fleet.playbook(head)
        doomed = lesson_bullets(good)
        _say(f"{ns}: policy {policy}, live v{live_before}; injecting a version without its {len(doomed)} lessons")
        injected_at = time.time()  # the fleet is idle: every later record comes after the injection
        send_control(settings, Control(namespace=ns, kind="remove", bullet_ids=doomed, actor="closed-loop",
                                       requested_at=time.time()))  # fmt: skip

        async def bad_published() -> int | None:
            now = await promotion.head(ns) or 0
            return now if now > head else None

        bad = await _wait(f"{ns}'s injected version", bad_published, 120)
        _say(f"{ns}: bad version v{bad} published; the fleet goes on until {policy} answers it")
        found: dict[str, Any] = {}

        async def watch() -> None:
            while not found:
                d = answering_decision(await promotion.decisions(ns), policy, after=injected_at)
                if d is not None:
                    found.update(d)
                    return
                await asyncio.sleep(0.25)

        watcher = asyncio.create_task(watch())
        decide_start = fleet.seq
        await fleet.run(cfg.max_decide_tasks, "decide", stop=lambda: bool(found))
        watcher.cancel()
        state = await promotion.serving(ns)
        last_bad = state.rejected_through if policy != "direct" else int(found.get("version") or bad)
        if found:
            seen = fleet.seq - decide_start
            _say(f"{ns}: {found['action']} v{found['version']} by {found['decided_by']}, seen {seen} tasks after the "
                 f"injection: {found['reason']}")  # fmt: skip
        else:
            _say(f"{ns}: no {policy} decision within {cfg.max_decide_tasks} tasks")
        await asyncio.sleep(2 * cfg.check_s)  # the combiner commits the restored head
        await fleet.run(cfg.after_tasks, "after")
        decisions = await promotion.decisions(ns)
        result = assess(policy, fleet.records, decisions, injected_at=injected_at, live_before=live_before,
                        bad_version=bad, last_bad=max(last_bad, bad), fraction=cfg.fraction if policy == "canary"
                        else None)  # fmt: skip
        outcomes = RedisOutcomes(redis, keys)

        async def all_counted() -> bool:
            return sum(c.n for c in (await outcomes.counts(ns)).values()) >= fleet.seq

        try:  # the worker counts a trace when its window stage takes it in: wait for the last ones
            await _wait(f"{ns}'s outcomes to be counted", all_counted, 60)
        except TimeoutError as exc:
            _say(str(exc))
        worker_counts = {k: as_json(v) for k, v in (await outcomes.counts(ns)).items()}
        arm_ids = sum(arm_position(ns, a) < cfg.fraction for a in fleet.ids) / len(fleet.ids)
        doc = _policy_doc(result, injected_at, fleet.records, decisions, worker_counts, cfg, len(doomed), arm_ids)
        return doc, fleet.records
    finally:
        await fleet.close()


def _policy_doc(
    result: Assessment,
    injected_at: float,
    records: Sequence[AgentRecord],
    decisions: Sequence[Mapping[str, Any]],
    worker_counts: Mapping[str, Any],
    cfg: LoopConfig,
    removed: int,
    arm_ids: float,
) -> dict[str, Any]:
    phases = {p: counts_json([r for r in records if r.phase == p]) for p in ("learn", "decide", "after")}
    return {
        "assessment": result.as_json(),
        "removed_bullets": removed,
        "agents_per_version": counts_json(records),
        "agents_per_version_by_phase": phases,
        "worker_outcomes": dict(worker_counts),
        "timeline": [asdict(row) for row in timeline(records, cfg.block)],
        "arm_share_of_agent_ids": arm_ids if result.policy == "canary" else None,
        "marks": {
            "injected": seq_at(records, injected_at),
            "decided": seq_at(records, float(result.decision["at"])) if result.decision else None,
        },
        "decisions": list(decisions),
        "tasks": len(records),
    }


def evidence_sample(decision: Mapping[str, Any] | None) -> int | None:
    """The sample the deciding test saw: the candidate side's decided traces (canary, rollback), or the validation
    tasks answered by both versions (gate)."""
    if not decision:
        return None
    evidence = decision.get("evidence") or {}
    if decision.get("decided_by") == "gate":
        return int((evidence.get("comparison") or {}).get("sample") or 0)
    side = evidence.get("candidate") or {}
    return int(side.get("success", 0)) + int(side.get("failure", 0))


def summary_table(doc: Mapping[str, Any]) -> str:
    """The per-policy table printed at the end and kept in the result file (SIMULATED)."""
    lines = [f"{LABEL}", "policy  bad  answer                    traces to decide  of them bad  served bad  "
             "share  test n  checks"]  # fmt: skip
    for policy, part in doc["policies"].items():
        a = part["assessment"]
        d = a["decision"] or {}
        answer = f"{d.get('action', 'none')} v{d.get('version', '-')} by {d.get('decided_by', '-')}"
        share = f"{a['served_share']:.3f}" if a["served_share"] is not None else "-"
        checks = ", ".join(f"{k}={'ok' if v else 'FAILED'}" for k, v in a["checks"].items())
        counts = f"{a['traces_to_decide']!s:>16}  {a['bad_traces_to_decide']!s:>11}  {a['served_bad_total']:>10}"
        tested = evidence_sample(a["decision"])
        lines.append(f"{policy:<7} v{a['bad_version']:<3} {answer:<25} {counts}  {share:>5}  {tested!s:>6}  {checks}")
    return "\n".join(lines)


def write_plot(doc: Mapping[str, Any], path: Path) -> bool:
    """Success rate per version over time, one panel per policy (PNG; False when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    policies = list(doc["policies"])
    fig, axes = plt.subplots(len(policies), 1, figsize=(9, 3.2 * len(policies)), squeeze=False)
    for ax, policy in zip(axes[:, 0], policies, strict=True):
        part = doc["policies"][policy]
        rows = part["timeline"]
        bad = range(part["assessment"]["bad_versions"][0], part["assessment"]["bad_versions"][1] + 1)
        for version in sorted({r["version"] for r in rows}):
            pts = [r for r in rows if r["version"] == version]
            ax.scatter([r["start"] + r["size"] / 2 for r in pts], [r["success"] / r["n"] for r in pts],
                       s=[8 + r["n"] for r in pts], color="#d62728" if version in bad else None,
                       label=f"v{version}" + (" (bad)" if version in bad else ""), alpha=0.8)  # fmt: skip
        for name, style in (("injected", ":"), ("decided", "--")):
            if part["marks"][name] is not None:
                ax.axvline(part["marks"][name], color="#555555", linestyle=style, linewidth=1, label=name)
        ax.set_title(f"{policy}: success rate per version over time (SIMULATED)")
        ax.set_ylabel("success rate")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=6, ncol=6, loc="lower left")
    axes[-1, 0].set_xlabel(f"task number (blocks of {doc['config']['block']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_results(doc: dict[str, Any], records: Mapping[str, Sequence[AgentRecord]], out: Path) -> None:
    """``closed-loop.json`` (every figure), ``records.jsonl.gz`` (every agent's task), ``closed-loop.png`` (or, without
    matplotlib, ``closed-loop.txt`` only) and ``closed-loop.txt`` (the tables and text charts)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "closed-loop.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    with gzip.open(out / "records.jsonl.gz", "wt") as fh:
        for policy, rs in records.items():
            for r in rs:
                fh.write(json.dumps({"policy": policy, **r.as_json()}) + "\n")
    text = [summary_table(doc), ""]
    for policy, rs in records.items():
        text += [f"== {policy}: success per version (agents' records, {LABEL})", table_of(rs), "",
                 text_chart(timeline(rs, doc["config"]["block"])), ""]  # fmt: skip
    (out / "closed-loop.txt").write_text("\n".join(text))
    doc["plot"] = "closed-loop.png" if write_plot(doc, out / "closed-loop.png") else None


async def _run(
    cfg: LoopConfig, *, bootstrap: str, redis_url: str, prefix: str, base_url: str
) -> tuple[dict[str, Any], dict[str, list[AgentRecord]]]:
    import redis.asyncio

    from combee.settings import Settings
    from combee.wiring import build_llm
    from streams.publisher import TracePublisher
    from streams.settings import StreamSettings
    from streams.topics import Topics

    settings = StreamSettings(kafka_bootstrap=bootstrap, topic_prefix=prefix, redis_url=redis_url, key_prefix=prefix)
    llm = build_llm(Settings(openai_base_url=base_url, model="combee-sim", llm_max_concurrency=cfg.concurrency))
    client = redis.asyncio.from_url(redis_url)
    records: dict[str, list[AgentRecord]] = {}
    parts: dict[str, Any] = {}
    try:
        with TracePublisher(bootstrap, Topics(prefix=prefix)) as publisher:
            for policy in cfg.policies:
                parts[policy], records[policy] = await run_policy(
                    policy, cfg, redis=client, prefix=prefix, llm=llm, publisher=publisher, settings=settings
                )
        return parts, records
    finally:
        await client.aclose()
        await llm.aclose()


def run_closed_loop(
    cfg: LoopConfig, out: Path, *, bootstrap: str, redis_url: str, prefix: str, base_url: str
) -> dict[str, Any]:
    """Run every policy of ``cfg`` against the running services and a worker started with :func:`worker_env`'s
    settings; write the result files under ``out`` (:func:`write_results`); return the result document."""
    started = time.time()
    parts, records = asyncio.run(_run(cfg, bootstrap=bootstrap, redis_url=redis_url, prefix=prefix, base_url=base_url))
    doc: dict[str, Any] = {
        "simulated": True, "label": LABEL, "config": asdict(cfg), "rules": hot_rules(cfg),
        "wall_s": round(time.time() - started, 1), "policies": parts,
    }  # fmt: skip
    write_results(doc, records, out)
    (out / "closed-loop.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc
