"""Issue 24's fault item: a worker killed during a gate evaluation and during a canary loses nothing, counts
nothing twice and promotes no version twice (real Kafka, Redis and workers; SIMULATED model and agents).

Both scenarios run one learner (window + map + combine: it counts the outcomes and runs the promotion checks)
and one curate worker on one namespace, while SIMULATED agents read their prompt through ``PromptClient`` with
an agent id, as a fleet does, and publish traces that name the version they were served (``playbook_version``)
and how it went (``feedback.success``).

* **gate**: the namespace is under ``gate`` with a validation set of the simulated world's held-out tasks (the
  simulator's generator answers them; whatever the verdicts, it is the bookkeeping that is checked). The learner
  seen in the middle of an evaluation (its log says it started and not that it ended) is stopped, checked to be
  still evaluating, SIGKILLed and replaced; the run goes on until every candidate is decided.
* **canary**: the namespace is under ``canary`` (half the agents in the arm, a small minimum sample); agents of
  the arm succeed far more often (``better``: candidates promoted) or far less often (``worse``: candidates
  rejected, the full profile only), so the candidates' outcomes decide. The learner is SIGKILLed while a candidate
  is pending with part of its sample counted, and replaced.

Checked after each: every invariant of the suite (every trace learned exactly once, no window applied twice,
versions, prompts, no half-applied delta), the outcome counts per version equal to what the published traces say,
and the decisions (tests/faults/promotion_checks.py): each applied exactly once, no version promoted twice, no
rejected version promoted or live, none served after its rejection (under the gate agents are served promoted
versions only), nothing
left pending.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from combee.outcomes import OutcomeCounts
from combee.promotion import candidate_counts
from combee.serving import Serving, in_canary_arm, pending_candidate
from combee.sim.world import generate_traces
from streams.client import PromptClient, PromptUnavailable
from streams.redis_outcomes import parse_outcomes
from streams.redis_promotion import SERVING_FIELDS, parse_decisions, parse_serving
from tests.faults.conftest import record
from tests.faults.harness import REPO, Producer, PromptWatcher, Record, Run, WorkerProc, wait_until
from tests.faults.invariants import Figures, check, observe
from tests.faults.promotion_checks import (
    applied_decisions,
    decision_violations,
    decisions_on,
    expected_outcomes,
    outcome_violations,
)
from tests.faults.quiet import wait_quiet
from tests.faults.stack import PrivateStack
from tests.faults.suite import Profile, Settler, figure_lines

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(600)]

#: Windows of 8 traces; outcome-driven rollbacks off (the scenarios check the gate's and the canary's decisions).
WORKERS = {
    "COMBEE_BS_DEFAULT": "8",
    "COMBEE_BS_CANDIDATES": "[8]",
    "COMBEE_PROMOTION_CHECK_S": "0.5",
    "COMBEE_ROLLBACK_ON_OUTCOMES": "false",
}
AGENTS = 16
SETTLE_S = 240.0


def _log(w: WorkerProc) -> str:
    return w.log.read_text(errors="replace") if w.log.exists() else ""


class Fleet(threading.Thread):
    """SIMULATED agents: trace i is run by agent ``i % AGENTS``, which reads its prompt through PromptClient (its
    agent id picks its canary arm) and publishes the trace naming the version it was served (none while nothing
    is served), with ``feedback.success`` drawn with ``success(in_arm)``."""

    def __init__(
        self, run: Run, producer: Producer, ns: str, traces: list[dict[str, Any]], rate: float,
        success: Callable[[bool], float], fraction: float = 0.0,
    ) -> None:  # fmt: skip
        super().__init__(daemon=True, name="fleet")
        self.run_, self.producer, self.ns, self.traces, self.rate = run, producer, ns, traces, rate
        self.success, self.fraction = success, fraction
        self.served: list[tuple[float, int]] = []  # (wall time the agent asked, the version it was served)
        self.done = 0
        self.error: BaseException | None = None
        self.hurry = threading.Event()

    def run(self) -> None:
        redis_client = self.run_.redis()
        clients = [
            PromptClient(redis_client, self.ns, keys=self.run_.keys, max_age_s=0, agent_id=f"agent-{i}")
            for i in range(AGENTS)
        ]
        rng = random.Random(24)
        try:
            started = time.monotonic()
            for i, base in enumerate(self.traces):
                due = started + i / self.rate
                while not self.hurry.is_set() and time.monotonic() < due:
                    time.sleep(0.02)
                agent = i % AGENTS
                trace = dict(base)
                try:
                    asked = time.time()
                    trace["playbook_version"] = clients[agent].get().version
                    self.served.append((asked, trace["playbook_version"]))
                except PromptUnavailable:
                    pass  # nothing served yet: the agent runs without a prompt and says so by naming none
                arm = in_canary_arm(self.ns, f"agent-{agent}", self.fraction)
                ok = rng.random() < self.success(arm)
                trace["feedback"] = {**trace["feedback"], "success": ok, "score": 1.0 if ok else 0.0}
                self.producer.send(Record(self.ns.encode(), json.dumps(trace).encode(), "good"))
                self.done = i + 1
            self.producer.flush()
        except BaseException as exc:  # surfaced by join_checked
            self.error = exc
        finally:
            for c in clients:
                c.close()
            redis_client.close()

    def join_checked(self, timeout_s: float = 300) -> None:
        self.join(timeout_s)
        if self.is_alive():
            raise AssertionError("the fleet did not finish publishing in time")
        if self.error is not None:
            raise AssertionError(f"publishing failed: {self.error!r}")


def _state(run: Run, ns: str) -> tuple[Serving, int, dict[str, OutcomeCounts]]:
    client = run.redis()
    try:
        state = parse_serving(client.hmget(run.keys.serving(ns), SERVING_FIELDS))
        head = int(client.hget(run.keys.current(ns), "version") or 0)
        return state, head, parse_outcomes(client.hgetall(run.keys.outcomes(ns)))
    finally:
        client.close()


def _set_policy(run: Run, ns: str, *args: str) -> None:
    """``combee prompt policy NS ARGS``, as an operator sets it (the policy and a gate's validation set go to Redis)."""
    done = subprocess.run(
        [sys.executable, "-m", "combee.cli", "prompt", "policy", ns, *args, "--actor", "faults"],
        env=run.env(), cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"combee prompt policy {ns} {' '.join(args)}: {done.stdout}{done.stderr}"


def _decisions(run: Run, ns: str) -> list[dict[str, Any]]:
    client = run.redis()
    try:
        return parse_decisions(client.hgetall(run.keys.decisions(ns)))
    finally:
        client.close()


def _settle_and_check(
    run: Run, ns: str, fleet: Fleet, producer: Producer, watcher: PromptWatcher, figures: Figures,
    *, decided: Callable[[], bool], gated: bool, by: str,
) -> dict[str, Any]:  # fmt: skip
    """Finish publishing, wait until every trace is learned and ``decided()`` (the decisions the scenario waits
    for are taken), then check everything; the figures' violations say what failed. Returns the promotion
    figures. ``gated``: agents are served promoted versions only, and every candidate must be decided at the end
    (a canary's last candidates cannot be: no outcomes come after the last trace)."""
    fleet.join_checked()  # at its pace: agents go on reading what they are served while the replacement starts
    producer.close()
    settler = Settler(run)
    try:
        settler.wait(producer.sent, SETTLE_S)
    finally:
        settler.close()

    def done() -> bool:
        run.check_no_crash()
        return decided()

    try:
        wait_until(done, 120, "the decisions to be taken", poll_s=0.5)
    except AssertionError as exc:
        figures.violations.append(str(exc))
    wait_quiet(run, [ns])
    obs = observe(run, [ns], watcher)
    check(run, producer.sent, obs, figures)
    state, head, counted = _state(run, ns)
    decisions = _decisions(run, ns)
    published = [json.loads(s.record.value or b"{}") for s in producer.sent if s.offset is not None]
    expected = expected_outcomes(published)
    applied = applied_decisions((_log(w) for w in run.workers), ns)
    figures.violations += outcome_violations(expected, counted)
    figures.violations += decision_violations(
        decisions, state, head, applied, served=fleet.served, served_only_live=gated, settled=gated, by=by
    )
    return {
        "head": head,
        "live": state.live,
        "decisions": [f"{d['id']} by {d['decided_by']}" for d in decisions if d.get("action") != "policy"],
        "outcomes": {k: [c.success, c.failure, c.unknown] for k, c in sorted(counted.items())},
        "traces_naming_a_version": sum(c.n for c in expected.values()),
        "served": sorted({version for _, version in fleet.served}),
    }


def _once(figures: Figures, promotion: dict[str, Any], decided: Sequence[Mapping[str, Any]], version: int) -> None:
    promotion["decisions_of_the_killed_candidate"] = [d["id"] for d in decided]
    if len(decided) != 1:
        figures.violations.append(
            f"the candidate of the kill (v{version}) has {len(decided)} decisions: {[d['id'] for d in decided]}"
        )


def _report(figures: Figures, promotion: dict[str, Any], started: float, title: str, capsys: Any) -> None:
    figures.faults["promotion"] = promotion
    figures.seconds = round(time.monotonic() - started, 1)
    with capsys.disabled():
        print(f"\n=== {title}")
        for line in figure_lines(figures):
            print(line)
        for key, value in promotion.items():
            print(f"  {key}: {value}")
    record(figures.as_dict())


# --------------------------------------------------------------------------------------------------------
# gate
# --------------------------------------------------------------------------------------------------------

GATE_NS = "fx-gate"
GATE_TRACES = 64
GATE_TASKS = 30
#: A generator call takes ~0.1 s and the gate asks one at a time: an evaluation (2 × 30 answers) lasts seconds.
GATE_SIM = {"time_scale": 0.1}
#: A margin this small lets the simulated candidates' one-answer differences go either way, so the run takes both
#: verdicts: rejections (and the live content committed again as the next head) as well as promotions.
GATE_WORKERS = {
    "COMBEE_PROMOTION_GATE_CONCURRENCY": "1",
    "COMBEE_PROMOTION_GATE_MIN_PAIRS": "20",
    "COMBEE_PROMOTION_GATE_MARGIN": "0.02",
}


def _evaluating(w: WorkerProc) -> str | None:
    """The candidate ``w`` is evaluating now, from its log: an evaluation started and not ended (None: none)."""
    text = _log(w)
    start = text.rfind("gate: evaluating v")
    if start < 0 or start < text.rfind("gate: evaluated v"):
        return None
    return text[start:].split()[2]


def test_a_learner_killed_during_a_gate_evaluation(
    stack: PrivateStack, workdir: Path, api_key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = Run(stack, workdir / "gate-kill-1", "gate-kill", api_key=api_key, env_extra={**WORKERS, **GATE_WORKERS})
    figures = Figures(scenario="gate-kill")
    started = time.monotonic()
    traces, tests, _ = generate_traces(GATE_TRACES, 24, namespace=GATE_NS, world="formula", test_n=GATE_TASKS)
    validation = run.workdir / "validation.jsonl"
    validation.write_text("".join(json.dumps({"task": t.task, "truth": t.ground_truth}) + "\n" for t in tests))
    watcher: PromptWatcher | None = None
    try:
        run.start_sim(**GATE_SIM)
        run.ensure_topics()
        _set_policy(run, GATE_NS, "gate", "--validation", str(validation))
        learner = run.start_worker("learner")
        run.start_worker("curate")
        wait_until(learner.joined, 120, "the learner to join", poll_s=0.3)
        watcher = PromptWatcher(run, [GATE_NS])
        watcher.start()
        producer = run.producer()
        fleet = Fleet(run, producer, GATE_NS, traces, rate=2.0, success=lambda arm: 0.5)
        fleet.start()

        # 1. catch the learner in the middle of an evaluation: stop it, make sure, kill it, replace it
        victim, candidate = None, None
        deadline = time.monotonic() + 180
        while victim is None and time.monotonic() < deadline:
            run.check_no_crash()
            if _evaluating(learner) is None:
                time.sleep(0.05)
                continue
            os.kill(learner.pid, signal.SIGSTOP)
            candidate = _evaluating(learner)
            if candidate is not None:
                victim = learner
            else:
                os.kill(learner.pid, signal.SIGCONT)  # it ended just before the stop: wait for the next one
        assert victim is not None, f"the learner was never seen evaluating a candidate:\n{learner.tail(30)}"
        at = fleet.done
        victim.kill()
        run.note(f"SIGKILL {victim.name} (pid {victim.pid}) while it evaluated {candidate}, {at} traces published")
        run.start_worker("learner", **victim.env)
        figures.faults = {"killed": victim.name, "evaluating": candidate, "traces_published_before": at}

        # 2. the run goes on; every trace learned, every candidate decided; then every check
        def settled() -> bool:  # every candidate decided: the head is live
            state, head, _ = _state(run, GATE_NS)
            return head > 0 and state.live == head

        promotion = _settle_and_check(
            run, GATE_NS, fleet, producer, watcher, figures, decided=settled, gated=True, by="gate"
        )
        watcher = None
        assert candidate is not None
        _once(
            figures,
            promotion,
            decisions_on(_decisions(run, GATE_NS), int(candidate.lstrip("v")), "gate"),
            int(candidate.lstrip("v")),
        )
        evaluations = sum(_log(w).count("gate: evaluated v") for w in run.workers)
        promotion["evaluations_completed"] = evaluations
        if evaluations == 0:
            figures.violations.append("no gate evaluation completed: the scenario decided nothing by the gate")
        _report(figures, promotion, started, f"gate: {victim.name} SIGKILLed evaluating {candidate}", capsys)
        assert not figures.violations, "\n".join(figures.violations)
    finally:
        for w in run.workers:
            if w.alive():
                os.kill(w.pid, signal.SIGCONT)
        if watcher is not None:
            watcher.stop()
        run.close()
        run.save("figures.json", figures.as_dict())
        run.save("events.json", run.events)


# --------------------------------------------------------------------------------------------------------
# canary
# --------------------------------------------------------------------------------------------------------

CANARY_NS = "fx-canary"
CANARY_TRACES = 120
CANARY_FRACTION = 0.5
#: The success rates of (the arm, the other agents). ``better``: the candidates are clearly not worse, and are
#: promoted. ``worse``: they are rejected, again and again (each rejection commits the live content as the next
#: head, which the arm is served next); run by the full profile only, to keep the short one (CI) within its time.
ARMS = {"better": (0.9, 0.3), "worse": (0.2, 0.8)}
MIN_DECIDED = 20
CANARY_WORKERS = {"COMBEE_PROMOTION_MIN_DECIDED": str(MIN_DECIDED)}


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_a_learner_killed_during_a_canary(
    arm: str, stack: PrivateStack, workdir: Path, api_key: str, profile: Profile, capsys: pytest.CaptureFixture[str]
) -> None:
    if arm == "worse" and profile.name != "full":
        pytest.skip("the canary whose arm is worse runs in the full profile (COMBEE_FAULTS=full)")
    p_arm, p_live = ARMS[arm]
    name = f"canary-{arm}"
    run = Run(stack, workdir / f"{name}-1", name, api_key=api_key, env_extra={**WORKERS, **CANARY_WORKERS})
    figures = Figures(scenario=name)
    started = time.monotonic()
    traces, _, _ = generate_traces(CANARY_TRACES, 25, namespace=CANARY_NS, world="formula", test_n=0)
    arms = sum(in_canary_arm(CANARY_NS, f"agent-{i}", CANARY_FRACTION) for i in range(AGENTS))
    assert 3 <= arms <= AGENTS - 3, f"{arms} of {AGENTS} agents in the arm: both arms need agents"
    watcher: PromptWatcher | None = None
    try:
        run.start_sim()
        run.ensure_topics()
        _set_policy(run, CANARY_NS, "canary", "--fraction", str(CANARY_FRACTION))
        learner = run.start_worker("learner")
        run.start_worker("curate")
        wait_until(learner.joined, 120, "the learner to join", poll_s=0.3)
        watcher = PromptWatcher(run, [CANARY_NS])
        watcher.start()
        producer = run.producer()
        fleet = Fleet(
            run, producer, CANARY_NS, traces, rate=3.0, fraction=CANARY_FRACTION,
            success=lambda in_arm: p_arm if in_arm else p_live,
        )  # fmt: skip
        fleet.start()

        # 1. kill the learner while a candidate is pending with part of its sample counted
        caught: tuple[int, int] | None = None
        deadline = time.monotonic() + 180
        while caught is None and time.monotonic() < deadline:
            run.check_no_crash()
            state, head, counts = _state(run, CANARY_NS)
            pending = pending_candidate(state, head)
            sample = candidate_counts(state, head, counts).n if pending is not None else 0
            if pending is not None and state.live is not None and 3 <= sample < MIN_DECIDED:
                caught = pending, sample
            else:
                time.sleep(0.1)
        assert caught is not None, f"no candidate was seen gathering its sample:\n{learner.tail(30)}"
        at = fleet.done
        learner.kill()
        run.note(f"SIGKILL {learner.name} (pid {learner.pid}): candidate v{caught[0]} pending, {caught[1]} arm "
                 f"outcomes counted, {at} traces published")  # fmt: skip
        run.start_worker("learner", **learner.env)
        figures.faults = {"killed": learner.name, "pending": caught[0], "arm_counted": caught[1], "traces_before": at}

        # 2. the run goes on; every trace learned, the candidate of the kill decided; then every check
        promotion = _settle_and_check(
            run, CANARY_NS, fleet, producer, watcher, figures,
            decided=lambda: bool(decisions_on(_decisions(run, CANARY_NS), caught[0], "canary")), gated=False,
            by="canary",
        )  # fmt: skip
        watcher = None
        _once(figures, promotion, decisions_on(_decisions(run, CANARY_NS), caught[0], "canary"), caught[0])
        _report(figures, promotion, started, f"canary ({arm} arm): learner SIGKILLed, v{caught[0]} pending", capsys)
        assert not figures.violations, "\n".join(figures.violations)
    finally:
        if watcher is not None:
            watcher.stop()
        run.close()
        run.save("figures.json", figures.as_dict())
        run.save("events.json", run.events)
