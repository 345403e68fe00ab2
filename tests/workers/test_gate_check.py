"""Worker tier: the owning worker's check (workers/promotion.py → workers/gate.py) under the ``gate`` policy, with
a scripted model that answers worse with a bad lesson in its playbook. A worse candidate is rejected (and the
combiner asked, once, for the live content), an equal one promoted, a set below the minimum waits without a
model call; a restarted worker, or one whose evaluation failed half-way, takes each decision once.

Redis is an in-memory stand-in with the decision script's semantics (recorded once; refused when the live version
moved, or when the version is rejected already); the real script is covered by tests/integration/test_gate.py.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from combee.forget import ForgetRule
from combee.holdout import holdout_position
from combee.llm import ChatRequest, Role
from combee.models import Playbook
from combee.promotion import GateRule
from combee.serving import Serving
from combee.validation import ValidationTask, validation_line
from streams.codec import decode
from streams.envelopes import Control
from tests.fakes import ScriptedLLM, block_lines, echo_script
from tests.unit.test_dedup import bullet
from tests.unit.test_gate import BAD_LESSON, numbered, per_playbook
from tests.workers.test_stages import Event, MemoryKafka, Msg, Stream, learner, run_until_quiet
from workers.context import StageContext
from workers.gate import validation_set
from workers.promotion import check_namespace
from workers.tenure import Tenure
from workers.window import handle_trace

NS = "gated"
GOOD = (bullet(1, "read the number carefully"),)


@dataclass
class MemoryPromotion:
    """The serving state and decisions of one namespace; ``decide`` does what DECIDE_SCRIPT does."""

    state: Serving
    head_version: int
    decisions_by_id: dict[str, dict] = field(default_factory=dict)
    own_validation: str | None = None
    kept: dict[str, str] = field(default_factory=dict)  # held-out traces: trace id -> task line

    async def hold_out(self, namespace: str, tasks: dict[str, str], *, cap: int) -> int:
        added = 0
        for trace_id, line in sorted(tasks.items()):
            if trace_id not in self.kept and len(self.kept) < cap:
                self.kept[trace_id], added = line, added + 1
        return added

    async def held_out(self, namespace: str) -> list[str]:
        return [self.kept[k] for k in sorted(self.kept)]

    async def serving(self, namespace: str) -> Serving:
        return self.state

    async def head(self, namespace: str) -> int | None:
        return self.head_version

    async def decision(self, namespace: str, decision_id: str) -> dict | None:
        return self.decisions_by_id.get(decision_id)

    async def decisions(self, namespace: str) -> list[dict]:
        return sorted(self.decisions_by_id.values(), key=lambda d: d["at"])

    async def validation(self, namespace: str) -> str | None:
        return self.own_validation

    async def decide(self, namespace: str, decision: dict, *, expect_live: Any = "*", new_live: int | None = None,
                     rejected_through: int | None = None, above_rejected: int | None = None) -> str:  # fmt: skip
        if decision["id"] in self.decisions_by_id:
            return "exists"
        if expect_live != "*" and expect_live != self.state.live:
            return "stale"
        if above_rejected is not None and above_rejected <= self.state.rejected_through:
            return "stale"
        s = self.state
        if new_live is not None:
            s = dataclasses.replace(s, live=new_live, previous=s.live)
        if rejected_through is not None:
            s = dataclasses.replace(s, rejected_through=rejected_through)
        self.state = dataclasses.replace(s, serial=s.serial + 1)
        self.decisions_by_id[decision["id"]] = decision
        return "done"


@dataclass
class MemoryStore:
    playbooks: dict[int, Playbook]

    async def history(self, namespace: str, limit: int) -> list[Any]:
        return [SimpleNamespace(version=v, meta={}) for v in sorted(self.playbooks, reverse=True)[:limit]]

    async def get_version(self, namespace: str, version: int) -> Any:
        pb = self.playbooks.get(version)
        return SimpleNamespace(playbook_json=pb.model_dump_json()) if pb is not None else None


class NoOutcomes:
    async def counts(self, namespace: str) -> dict:
        return {}


def versions(candidate_lesson: str) -> dict[int, Playbook]:
    live = Playbook(namespace=NS, version=3, bullets=GOOD, next_id=2)
    cand = Playbook(namespace=NS, version=4, bullets=(*GOOD, bullet(2, candidate_lesson)), next_id=3)
    return {3: live, 4: cand}


def worker(
    kafka: MemoryKafka, llm: Any, promotion: MemoryPromotion, store: MemoryStore,
    tasks: tuple[ValidationTask, ...] = numbered(30),
) -> tuple[StageContext, Any]:  # fmt: skip
    ctx = learner(kafka, llm)
    gate = GateRule(margin=0.05, min_pairs=20, alpha=0.05, concurrency=4)
    promo = dataclasses.replace(ctx.config.promotion, gate=gate, gate_tasks=tasks, gate_source="file:v.jsonl")
    ctx.config = dataclasses.replace(ctx.config, promotion=promo)
    ctx.serving, ctx.store = promotion, store  # type: ignore[assignment]
    ctx.outcomes = SimpleNamespace(store=NoOutcomes())  # type: ignore[assignment]
    tenure = Tenure(partition=0, epoch=0, owner=ctx.owner)
    ctx.tenures.claimed(tenure)
    return ctx, SimpleNamespace(namespace=NS, tenure=tenure, combining=tenure.combining(NS), partition=0)


def controls(kafka: MemoryKafka, ctx: StageContext) -> list[Control]:
    sent = [decode(m.value) for m in kafka.records(ctx.topics.partials) if m.value is not None]
    return [c for c in sent if isinstance(c, Control)]


def gated() -> MemoryPromotion:
    return MemoryPromotion(Serving(policy="gate", live=3, previous=2, serial=2), head_version=4)


async def test_a_worse_candidate_is_rejected_once_and_the_combiner_asked_for_the_live_content() -> None:
    kafka, promotion, llm = MemoryKafka(), gated(), ScriptedLLM(per_playbook)
    ctx, rt = worker(kafka, llm, promotion, MemoryStore(versions(BAD_LESSON)))
    decision = await check_namespace(ctx, rt, 10.0)
    assert decision is not None and (decision.action, decision.version, decision.serve) == ("reject", 4, 3)
    assert decision.decided_by == "gate" and decision.evidence["pairs"]["baseline_only"] == 27  # type: ignore[index]
    assert (promotion.state.live, promotion.state.rejected_through) == (3, 4)
    assert promotion.decisions_by_id["reject/v4"]["evidence"]["validation"] == {
        "source": "file:v.jsonl", "tasks": 30, "graders": {"numeric": 30},
    }  # fmt: skip
    assert [(c.kind, c.to_version, c.actor) for c in controls(kafka, ctx)] == [("reject", 4, "combee:gate")]
    assert len(llm.calls(Role.GENERATOR)) == 60
    assert await check_namespace(ctx, rt, 11.0) is None  # decided: nothing pending, nothing asked
    restarted, rt2 = worker(kafka, ScriptedLLM(per_playbook), promotion, MemoryStore(versions(BAD_LESSON)))
    assert await check_namespace(restarted, rt2, 12.0) is None
    assert len(llm.calls(Role.GENERATOR)) == 60 and len(controls(kafka, ctx)) == 1


async def test_an_equally_good_candidate_is_promoted_once() -> None:
    kafka, promotion = MemoryKafka(), gated()
    ctx, rt = worker(kafka, ScriptedLLM(per_playbook), promotion, MemoryStore(versions("say the unit as well")))
    decision = await check_namespace(ctx, rt, 10.0)
    assert decision is not None and (decision.action, decision.serve, decision.id) == ("promote", 4, "promote/v4")
    assert (promotion.state.live, promotion.state.previous) == (4, 3)
    assert controls(kafka, ctx) == []  # a promotion needs no new head
    assert await check_namespace(ctx, rt, 11.0) is None


async def test_an_evaluation_is_logged_when_it_starts_and_when_it_has_every_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The fault suite finds an evaluation in flight from these two lines (tests/faults/test_promotion_faults.py)."""
    kafka, promotion = MemoryKafka(), gated()
    ctx, rt = worker(kafka, ScriptedLLM(per_playbook), promotion, MemoryStore(versions(BAD_LESSON)))
    with caplog.at_level("INFO", logger="combee.worker.gate"):
        await check_namespace(ctx, rt, 10.0)
    lines = [r.getMessage() for r in caplog.records if r.name == "combee.worker.gate"]
    assert lines == [
        f"{NS}: gate: evaluating v4 against the live v3 on 30 tasks",
        f"{NS}: gate: evaluated v4 against the live v3: 3 of 30 tasks right with the candidate, 30 with the live",
    ]


async def test_a_validation_set_below_the_minimum_waits_without_asking_the_model() -> None:
    kafka, promotion, llm = MemoryKafka(), gated(), ScriptedLLM(per_playbook)
    ctx, rt = worker(kafka, llm, promotion, MemoryStore(versions(BAD_LESSON)), tasks=numbered(5))
    assert await check_namespace(ctx, rt, 10.0) is None
    assert await check_namespace(ctx, rt, 11.0) is None
    assert llm.requests == [] and promotion.decisions_by_id == {} and ctx.gate_waits == {NS: 4}


async def test_a_namespaces_own_validation_set_in_redis_wins_over_the_default() -> None:
    kafka, promotion, llm = MemoryKafka(), gated(), ScriptedLLM(per_playbook)
    promotion.own_validation = "\n".join(
        json.dumps({"task": f"What is {10 * (i + 1)}?", "truth": str(10 * (i + 1)), "grader": "numeric"})
        for i in range(25)
    )  # multiples of ten: the rounding lesson does no harm here
    ctx, rt = worker(kafka, llm, promotion, MemoryStore(versions(BAD_LESSON)), tasks=numbered(5))
    decision = await check_namespace(ctx, rt, 10.0)
    assert decision is not None and decision.action == "promote"
    assert decision.evidence["validation"]["source"] == "redis"  # type: ignore[index]


async def test_an_evaluation_that_fails_half_way_decides_nothing_and_the_next_check_decides_once() -> None:
    kafka, promotion = MemoryKafka(), gated()
    calls = {"n": 0}

    def flaky(request: ChatRequest) -> str:
        calls["n"] += 1
        if calls["n"] == 25:
            raise ConnectionError("the model went away")
        return per_playbook(request)

    ctx, rt = worker(kafka, ScriptedLLM(flaky), promotion, MemoryStore(versions(BAD_LESSON)))
    with pytest.raises(ConnectionError):
        await check_namespace(ctx, rt, 10.0)
    assert promotion.decisions_by_id == {} and controls(kafka, ctx) == []
    decision = await check_namespace(ctx, rt, 11.0)
    assert decision is not None and decision.action == "reject"
    assert await check_namespace(ctx, rt, 12.0) is None and len(controls(kafka, ctx)) == 1


async def test_an_owner_that_lost_the_namespace_during_the_evaluation_records_nothing() -> None:
    kafka, promotion = MemoryKafka(), gated()
    ctx, rt = worker(kafka, ScriptedLLM(per_playbook), promotion, MemoryStore(versions(BAD_LESSON)))

    def revoke_midway(request: ChatRequest) -> str:
        ctx.tenures.revoke(0)  # a rebalance hands the partition to another process
        return per_playbook(request)

    ctx.llm = ScriptedLLM(revoke_midway)
    assert await check_namespace(ctx, rt, 10.0) is None
    assert promotion.decisions_by_id == {} and controls(kafka, ctx) == []


async def test_the_first_version_is_promoted_without_an_evaluation() -> None:
    kafka, llm = MemoryKafka(), ScriptedLLM(per_playbook)
    promotion = MemoryPromotion(Serving(policy="gate", serial=1), head_version=1)
    store = MemoryStore({1: Playbook(namespace=NS, version=1, bullets=GOOD, next_id=2)})
    ctx, rt = worker(kafka, llm, promotion, store)
    decision = await check_namespace(ctx, rt, 10.0)
    assert decision is not None and (decision.action, decision.serve) == ("promote", 1) and llm.requests == []


# --- held-out traces ---


def with_truth(ns: str, i: int) -> bytes:
    body = {
        "namespace": ns,
        "trace_id": f"{ns}-{i}",
        "task": f"What is {100 + i}?",
        "feedback": {"ground_truth": str(100 + i)},
    }
    return json.dumps(body).encode()


async def test_held_out_traces_are_never_reflected_on_and_become_validation_tasks() -> None:
    kafka, stream, seen = MemoryKafka(), Stream(), set()
    llm = ScriptedLLM(echo_script)
    promotion = gated()
    ctx, _ = worker(kafka, llm, promotion, MemoryStore({}))
    promo = dataclasses.replace(ctx.config.promotion, gate_holdout=0.3, gate_holdout_max=100, gate_grader="numeric")
    ctx.config = dataclasses.replace(ctx.config, promotion=promo)
    ctx.outcomes = None  # outcomes are not this test's concern (tests/workers/test_outcomes_stage.py)
    part = ctx.home_partition(NS)
    for _ in range(2):  # the second pass is a redelivery of the same records
        for i in range(40):
            offset = await kafka.send(ctx.topics.traces, NS.encode(), with_truth(NS, i), part)
            await handle_trace(ctx, stream, Event(Msg(ctx.topics.traces, part, offset, NS.encode(), with_truth(NS, i))))
        await run_until_quiet(ctx, kafka, stream, seen)
    held = {f"{NS}-{i}" for i in range(40) if holdout_position(NS, f"{NS}-{i}") < 0.3}
    assert 0 < len(held) < 40 and set(promotion.kept) == held
    reflected = {block_lines(r, "trace")[0]["task"] for r in llm.calls(Role.REFLECTOR)}
    assert reflected == {f"What is {100 + i}?" for i in range(40) if f"{NS}-{i}" not in held}
    bullets = {b.content for b in ctx.snapshots.get(NS).playbook.bullets}  # type: ignore[union-attr]
    assert bullets and not bullets & {f"lesson: What is {100 + int(t.rsplit('-', 1)[1])}?" for t in held}
    tasks, source = await validation_set(ctx, NS)
    assert source == "file:v.jsonl+holdout" and len(tasks) == 30 + len(held)
    assert {(t.id, t.grader) for t in tasks[30:]} == {(f"trace:{t}", "numeric") for t in held}


async def test_a_rejection_whose_new_head_was_never_asked_for_is_asked_for_again_once() -> None:
    kafka, promotion = MemoryKafka(), gated()
    ctx, rt = worker(kafka, ScriptedLLM(per_playbook), promotion, MemoryStore(versions(BAD_LESSON)))
    decision = {"id": "reject/v4", "action": "reject", "version": 4, "decided_by": "gate", "at": 100.0}
    assert await promotion.decide(NS, decision, expect_live=3, rejected_through=4, above_rejected=4) == "done"
    # the process that recorded it stopped here, before its control record reached Kafka
    assert await check_namespace(ctx, rt, 110.0) is None and controls(kafka, ctx) == []  # within the grace time
    await check_namespace(ctx, rt, 140.0)
    await check_namespace(ctx, rt, 150.0)
    assert [(c.kind, c.to_version, c.actor) for c in controls(kafka, ctx)] == [("reject", 4, "combee:restore")]
    restarted, rt2 = worker(kafka, ScriptedLLM(per_playbook), promotion, MemoryStore(versions(BAD_LESSON)))
    rt2.tenure.snapshots[NS] = SimpleNamespace(applied={f"{NS}/reject/v4"})  # the combiner committed it since
    await check_namespace(restarted, rt2, 200.0)
    assert len(controls(kafka, ctx)) == 1


class Rules:
    async def rules(self) -> tuple[ForgetRule, ...]:
        return (ForgetRule(producer="forgotten-agent"),)


async def test_held_out_tasks_of_a_producer_forgotten_since_are_left_out() -> None:
    promotion = gated()
    ctx, _ = worker(MemoryKafka(), ScriptedLLM(per_playbook), promotion, MemoryStore({}))
    for i, producer in enumerate(("kept-agent", "forgotten-agent", None)):
        task = ValidationTask(f"trace:t{i}", f"What is {i}?", str(i), producer=producer)
        promotion.kept[f"t{i}"] = validation_line(task)
    ctx.forget_rules = Rules()  # type: ignore[assignment]
    tasks, _ = await validation_set(ctx, NS)
    assert [t.id for t in tasks[30:]] == ["trace:t0", "trace:t2"]


async def test_a_candidate_with_the_live_lessons_is_promoted_without_asking_the_model() -> None:
    kafka, promotion, llm = MemoryKafka(), gated(), ScriptedLLM(per_playbook)
    live = Playbook(namespace=NS, version=3, bullets=GOOD, next_id=2)
    restored = Playbook(namespace=NS, version=4, bullets=GOOD, next_id=5)  # a rejection's head: the live content
    ctx, rt = worker(kafka, llm, promotion, MemoryStore({3: live, 4: restored}))
    decision = await check_namespace(ctx, rt, 10.0)
    assert decision is not None and (decision.action, decision.serve) == ("promote", 4)
    assert decision.evidence == {"same_lessons_as": 3, "candidate_version": 4, "baseline_version": 3}
    assert llm.requests == []


async def test_an_older_rejection_is_not_asked_for_again_when_a_rollback_moved_the_state_since() -> None:
    kafka, promotion = MemoryKafka(), gated()
    ctx, rt = worker(kafka, ScriptedLLM(per_playbook), promotion, MemoryStore(versions(BAD_LESSON)))
    older = {"id": "reject/v2", "action": "reject", "version": 2, "decided_by": "gate", "at": 50.0}
    rollback = {"id": "rollback/v3-to-v2", "action": "rollback", "version": 3, "decided_by": "operator:ana",
                "at": 100.0}  # fmt: skip
    promotion.decisions_by_id = {d["id"]: d for d in (older, rollback)}
    promotion.state = dataclasses.replace(promotion.state, rejected_through=4)
    await check_namespace(ctx, rt, 500.0)
    assert controls(kafka, ctx) == []


async def test_a_long_gate_evaluation_delays_only_its_own_namespaces_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop runs each namespace's check as its own task, one at a time per namespace: the fast namespace is
    checked at every tick while the slow one's evaluation (blocked here) is still running, and the slow one is
    not started again beside itself."""
    import asyncio

    from workers import promotion

    kafka = MemoryKafka()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    ctx.config = dataclasses.replace(ctx.config, promotion=dataclasses.replace(ctx.config.promotion, check_s=0.01))
    for ns in ("slow", "fast"):
        ctx.runtime(ns)
    release = asyncio.Event()
    calls: list[str] = []

    async def check(c: StageContext, rt: Any, now: float) -> None:
        calls.append(rt.namespace)
        if rt.namespace == "slow":
            await release.wait()

    monkeypatch.setattr(promotion, "check_namespace", check)
    loop = asyncio.create_task(promotion.promotion_loop(ctx))
    for _ in range(200):
        await asyncio.sleep(0.01)
        if calls.count("fast") >= 5:
            break
    assert calls.count("fast") >= 5 and calls.count("slow") == 1
    release.set()
    await asyncio.sleep(0.1)
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop
    assert calls.count("slow") >= 2  # checked again once its evaluation ended
