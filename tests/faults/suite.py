"""The fault scenarios and how one is executed: publish, inject, settle, check, print the figures.

Each scenario runs the real pipeline — ``combee worker`` processes (one ``learner``: window + map + combine,
one ``curate``), the suite's private Kafka and password-protected Redis, and a SIMULATED model server — on
the same SIMULATED traces (two namespaces, two worlds), published at a steady rate by a plain Kafka client
while the scenario injects its fault. Then it waits until every valid trace is learned, every bad record is
dead-lettered and Redis holds each namespace's newest version, and checks the invariants
(:mod:`tests.faults.invariants`), printing one line of figures per invariant.

Two profiles: ``short`` (CI: a few kills, short outages) and ``full`` (≥ 10 SIGKILLs per worker kind, the
30 s LLM outage and 20 s Redis outage of issue #5). ``COMBEE_FAULTS`` picks one.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from combee.sim.world import generate_traces
from streams.codec import CodecError, decode, decode_trace
from streams.deltalog import LogJudge
from streams.envelopes import DeadLetter, DeltaRecord
from streams.topics import partition_for
from tests.faults.corpus import INJECTION_MARKER, hostile_corpus, interleave
from tests.faults.harness import PacedPublisher, PromptWatcher, Record, Run, Sent, TopicTail, wait_until
from tests.faults.invariants import Figures, check, observe, quality
from tests.faults.quiet import wait_quiet
from tests.faults.stack import PrivateStack

__all__ = ["PROFILES", "SCENARIOS", "Profile", "Scenario", "execute", "good_traces"]

NAMESPACES = (("fx-formula", "formula", 11), ("fx-finer", "finer", 12))


@dataclass(frozen=True)
class Profile:
    name: str
    traces_per_namespace: int
    rate: float  # traces per second, all namespaces together
    kills: int
    llm_outage_s: float
    redis_outage_s: float
    kafka_restarts: int
    rebalances: int
    settle_timeout_s: float = 420.0


PROFILES = {
    "short": Profile("short", 60, 24.0, kills=2, llm_outage_s=8, redis_outage_s=6, kafka_restarts=1, rebalances=1),
    "full": Profile("full", 200, 6.0, kills=10, llm_outage_s=30, redis_outage_s=20, kafka_restarts=2, rebalances=3),
}


def good_traces(n: int) -> tuple[list[Record], dict[str, list[str]]]:
    """The SIMULATED traces every scenario learns (interleaved namespaces) and each namespace's hidden insights."""
    per_ns: list[list[Record]] = []
    truths: dict[str, list[str]] = {}
    for ns, world, seed in NAMESPACES:
        traces, _, truth = generate_traces(n, seed, namespace=ns, world=world, test_n=0)
        per_ns.append([Record(ns.encode(), json.dumps(t).encode(), "good") for t in traces])
        truths[ns] = truth["insights"]
    records = [r for group in zip(*per_ns, strict=True) for r in group]
    return records, truths


# --------------------------------------------------------------------------------------------------------
# Progress and settling
# --------------------------------------------------------------------------------------------------------


class Progress:
    """Counts applied windows (valid delta log records; not claims, not fenced records) as they appear."""

    def __init__(self, run: Run) -> None:
        self.tail = TopicTail(run.stack.bootstrap, run.topics.deltas)
        self.judge = LogJudge()
        self.count = 0

    def poll(self) -> int:
        with contextlib.suppress(Exception):  # the broker may be restarting: progress is a sample
            for r in self.tail.poll(timeout_s=30):
                self.count += self.judge.judge(r.partition, r.offset, r.value)[0] == "valid"
        return self.count

    def wait_for_more(self, run: Run, timeout_s: float = 60) -> bool:
        """Wait until one more window is applied; False if none was within ``timeout_s`` (nothing left)."""
        start = self.poll()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run.check_no_crash()
            if self.poll() > start:
                return True
            time.sleep(0.3)
        run.note(f"no window applied for {timeout_s:.0f}s")
        return False

    def close(self) -> None:
        self.tail.close()


#: Liveness: once the last trace is published and the fault injection is over, every namespace must reach
#: its final version within this many seconds plus the critical path of the windows applied after that moment
#: (windows of a namespace are applied one after another, so their critical paths add up).
LIVENESS_SLACK_S = 60.0


class Settler:
    """Decides when a run has settled: every valid trace published is covered by an applied window, every
    bad record has a dead letter, and Redis's current version of each namespace is the log's newest. Records,
    per namespace, when it first reached that state (the liveness figure)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.traces = TopicTail(run.stack.bootstrap, run.topics.traces)
        self.deltas = TopicTail(run.stack.bootstrap, run.topics.deltas)
        self.judge = LogJudge()
        self.letters = TopicTail(run.stack.bootstrap, run.topics.deadletter)
        self.home_ids: dict[tuple[int, int], tuple[str, str]] = {}  # (partition, offset) -> (namespace, trace id)
        self.covered: set[tuple[int, int]] = set()
        self.last_version: dict[str, int] = {}
        self.applied: dict[str, list[tuple[float, float]]] = {}  # ns -> (applied_at, critical path s) per window
        self.lettered: set[tuple[int, int]] = set()
        self.reached: dict[str, float] = {}  # ns -> wall time its final state was first seen

    def poll(self) -> None:
        parts = self.run.partitions
        for r in self.traces.poll():
            try:
                t = decode_trace(r.value, r.key)
            except CodecError:
                continue
            if partition_for(t.namespace.encode(), parts) == r.partition:
                self.home_ids[(r.partition, r.offset)] = (t.namespace, t.trace_id)
        for r in self.deltas.poll():
            verdict, rec = self.judge.judge(r.partition, r.offset, r.value)
            if verdict != "valid":
                continue  # a claim, or a fenced record: it counts for nobody
            assert isinstance(rec, DeltaRecord)
            self.last_version[rec.namespace] = max(self.last_version.get(rec.namespace, 0), rec.version)
            if rec.source is not None:
                p = int(rec.source.removeprefix("p"))
                self.covered.update((p, o) for o in rec.offsets)
                self.applied.setdefault(rec.namespace, []).append((rec.applied_at, rec.critical_path_s or 0.0))
        for r in self.letters.poll():
            d = decode(r.value or b"")
            assert isinstance(d, DeadLetter)
            if d.topic == self.run.topics.traces:
                self.lettered.add((d.partition, d.offset))

    def missing(
        self, expected: dict[str, set[str]], bad_at: set[tuple[int, int]]
    ) -> tuple[dict[str, int], int, list[str]]:
        """Per namespace the valid traces not yet learned; bad records without a dead letter; namespaces whose
        Redis version is behind the log."""
        learned: dict[str, set[str]] = {}
        for at, (ns, tid) in self.home_ids.items():
            if at in self.covered:
                learned.setdefault(ns, set()).add(tid)
        unlearned = {ns: len(ids - learned.get(ns, set())) for ns, ids in expected.items()}
        stale = []
        client = self.run.redis(socket_timeout=2)
        try:
            for ns, version in self.last_version.items():
                raw = client.hget(self.run.keys.current(ns), "version")
                if raw is None or int(raw) < version:
                    stale.append(ns)
        except Exception:  # Redis is down in some scenarios: not settled yet
            stale.append("(redis unreachable)")
        finally:
            client.close()
        return unlearned, len(bad_at - self.lettered), stale

    def wait(self, sent: list[Sent], timeout_s: float) -> None:
        expected: dict[str, set[str]] = {}
        bad_at: set[tuple[int, int]] = set()
        for s in sent:
            if s.refused is not None or s.partition is None or s.offset is None:
                continue
            try:
                t = decode_trace(s.record.value, s.record.key)
                expected.setdefault(t.namespace, set()).add(t.trace_id)
            except CodecError:
                bad_at.add((s.partition, s.offset))
        self.reached.clear()
        deadline = time.monotonic() + timeout_s
        state: tuple[dict[str, int], int, list[str]] = ({ns: len(ids) for ns, ids in expected.items()}, len(bad_at), [])
        error = ""
        while time.monotonic() < deadline:
            self.run.check_no_crash()
            try:
                self.poll()
            except Exception as exc:  # a broker restart interrupts a read: try again
                error = f"{type(exc).__name__}: {exc}"
                time.sleep(1)
                continue
            state = self.missing(expected, bad_at)
            now = time.time()
            for ns, left in state[0].items():
                if left == 0 and ns not in state[2] and "(redis unreachable)" not in state[2]:
                    self.reached.setdefault(ns, now)
            if not any(state[0].values()) and state[1] == 0 and not state[2]:
                return
            time.sleep(0.5)
        logs = "\n".join(f"--- {w.name} ---\n{w.tail(25)}" for w in self.run.workers[-2:])
        raise AssertionError(
            f"not settled after {timeout_s:.0f}s: {sum(state[0].values())} traces unlearned {state[0]}, {state[1]} bad "
            f"records without a dead letter, Redis behind for {state[2]}; last read error: {error or 'none'}\n{logs}"
        )

    def liveness(self, quiet_at: float) -> dict[str, dict[str, float]]:
        """Per namespace: seconds from ``quiet_at`` (last trace published, faults over) to its final version,
        and the bound it must meet."""
        out: dict[str, dict[str, float]] = {}
        for ns, at in sorted(self.reached.items()):
            path = sum(cp for applied_at, cp in self.applied.get(ns, []) if applied_at >= quiet_at)
            out[ns] = {"final_after_s": round(max(0.0, at - quiet_at), 1), "bound_s": round(LIVENESS_SLACK_S + path, 1)}
        return out

    def close(self) -> None:
        for tail in (self.traces, self.deltas, self.letters):
            tail.close()


# --------------------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------------------

Driver = Callable[[Run, Profile, Progress, random.Random], dict[str, Any]]


@dataclass(frozen=True)
class Scenario:
    name: str
    doc: str
    drive: Driver
    sim_faults: dict[str, Any] = field(default_factory=dict)
    hostile: bool = False
    require_equal: bool = True  # same windows + same answers ⇒ the same playbook (false when answers change)
    # traces per second while the fault is injected: kill scenarios publish slowly enough that traces keep
    # arriving until the last kill (each kill costs about a session timeout)
    rate: Callable[[Profile], float] = lambda p: p.rate
    # a fault injected once everything is learned (then the run must settle again)
    after_settle: Driver | None = None
    # environment of the first learner (kill_and_restart keeps a worker's environment)
    learner_env: dict[str, str] = field(default_factory=dict)
    # checks of the scenario's own, after settling (e.g. that the fault took the path it is meant to force)
    verify: Callable[[Run, Figures], None] | None = None


def _no_fault(run: Run, profile: Profile, progress: Progress, rng: random.Random) -> dict[str, Any]:
    return {}


def _kill(role: str) -> Driver:
    def drive(run: Run, profile: Profile, progress: Progress, rng: random.Random) -> dict[str, Any]:
        gaps, busy = [], 0
        for _ in range(profile.kills):
            busy += progress.wait_for_more(run)  # the victim is doing real work…
            gap = rng.uniform(0.0, 3.0)  # …and dies at a random moment of it
            time.sleep(gap)
            gaps.append(round(gap, 2))
            victim = run.live(role)[0]
            run.kill_and_restart(victim)
        return {"sigkill": profile.kills, "role": role, "kills_while_learning": busy, "delays_after_progress_s": gaps}

    return drive


def _llm_outage(run: Run, profile: Profile, progress: Progress, rng: random.Random) -> dict[str, Any]:
    assert run.sim is not None
    progress.wait_for_more(run)
    run.sim.set_faults(outage=True)
    run.note(f"LLM outage: every request gets 503 for {profile.llm_outage_s:.0f}s")
    time.sleep(profile.llm_outage_s)
    run.sim.set_faults(outage=False)
    run.note("LLM back")
    return {"llm_outage_s": profile.llm_outage_s, "503s": run.sim.stats()["by_status"].get("503", 0)}


def _llm_rates(run: Run, profile: Profile, progress: Progress, rng: random.Random) -> dict[str, Any]:
    progress.wait_for_more(run)
    return {}


def _redis_restart(run: Run, profile: Profile, progress: Progress, rng: random.Random) -> dict[str, Any]:
    # First a restart that loses everything (a Redis without persistence), early, while traces still arrive:
    # the next version of each namespace lands on the empty Redis. Then one that keeps its data (SHUTDOWN SAVE).
    restarts = []
    for keep in (False, True):
        progress.wait_for_more(run)
        time.sleep(rng.uniform(0, 1.5))
        run.stack.stop_redis(keep_data=keep)
        run.note(f"Redis stopped ({'SHUTDOWN SAVE' if keep else 'data lost'})")
        run.stack.start_redis()
        run.note("Redis started again")
        restarts.append("kept data" if keep else "lost data")
    return {"redis_restarts": restarts}


def _redis_wipe(run: Run, profile: Profile, progress: Progress, rng: random.Random) -> dict[str, Any]:
    # Once everything is learned, nothing new will be published: the owners must notice by themselves that
    # Redis lost the newest versions and publish them again.
    run.stack.stop_redis(keep_data=False)
    run.stack.start_redis()
    run.note("Redis restarted without its data after the last version; waiting for the versions to come back")
    return {"redis_restarts_after_settling": ["lost data"]}


def _redis_outage(run: Run, profile: Profile, progress: Progress, rng: random.Random) -> dict[str, Any]:
    progress.wait_for_more(run)
    run.stack.stop_redis(keep_data=True)
    run.note(f"Redis unavailable for {profile.redis_outage_s:.0f}s")
    before = progress.poll()
    time.sleep(profile.redis_outage_s)
    during = progress.poll() - before
    run.stack.start_redis()
    run.note(f"Redis back ({during} windows applied while it was away)")
    return {"redis_outage_s": profile.redis_outage_s, "windows_applied_without_redis": during}


def _kafka_restart(run: Run, profile: Profile, progress: Progress, rng: random.Random) -> dict[str, Any]:
    away = []
    for i in range(profile.kafka_restarts):
        progress.wait_for_more(run)
        time.sleep(rng.uniform(0, 1.5))
        kill = i % 2 == 1
        run.note(f"Kafka broker {'SIGKILL' if kill else 'SIGTERM'} + restart")
        away.append(round(run.stack.restart_kafka(kill=kill), 1))
        run.note(f"Kafka broker back after {away[-1]}s")
    return {"kafka_restarts": profile.kafka_restarts, "broker_away_s": away}


def _rebalance(run: Run, profile: Profile, progress: Progress, rng: random.Random) -> dict[str, Any]:
    joins = []
    for i in range(profile.rebalances):
        role = "learner" if i % 2 == 0 else "curate"
        progress.wait_for_more(run)
        extra = run.start_worker(role)
        wait_until(lambda w=extra: w.joined() or not w.alive(), 60, "the extra worker to join", poll_s=0.3)
        time.sleep(rng.uniform(2.0, 5.0))  # windows in flight on both
        run.note(f"extra {role} worker {extra.name} leaves (SIGTERM)")
        extra.stop()
        joins.append(role)
    return {"joined_and_left": joins}


#: A learner that never commits its consumed offsets: whatever it read is read again after a crash.
NEVER_COMMIT = {"COMBEE_KAFKA_COMMIT_INTERVAL_S": "86400", "COMBEE_KAFKA_COMMIT_EVERY": "1000000000"}
#: Its successors cut one-trace windows, so a trace re-read from an applied window of two or more traces is
#: necessarily offered in a window the map stage has never seen and must drop as a duplicate (issue 9).
ONE_TRACE_WINDOWS = {
    "COMBEE_BS_MIN": "1",
    "COMBEE_BS_MAX": "1",
    "COMBEE_BS_DEFAULT": "1",
    "COMBEE_BS_CANDIDATES": "[1]",
}


def _kill_uncommitted(run: Run, profile: Profile, progress: Progress, rng: random.Random) -> dict[str, Any]:
    kills = max(2, profile.kills // 3)
    done = 0
    for _ in range(kills):
        if not progress.wait_for_more(run):  # a window was applied; its traces' offsets are not committed
            break
        victim = run.live("learner")[0]
        victim.kill()
        run.note(f"SIGKILL learner {victim.name} (pid {victim.pid}) right after a window was applied")
        run.start_worker("learner", **{**NEVER_COMMIT, **ONE_TRACE_WINDOWS})
        done += 1
    return {"sigkill_after_apply": done, "offsets_committed": "never"}


def _dropped_duplicates(run: Run, figures: Figures) -> None:
    """The restarted learners must have dropped re-read windows as duplicates: the path the scenario forces."""
    restarted = [w for w in run.workers if w.role == "learner" and w.env.get("COMBEE_BS_MAX") == "1"]
    dropped = sum(w.log.read_text(errors="replace").count("already windowed") for w in restarted)
    figures.faults["duplicate_windows_dropped"] = dropped
    if dropped == 0:
        figures.violations.append("kill-uncommitted: no restarted learner dropped a duplicate window (path not forced)")


def _kill_rate(p: Profile) -> float:
    return min(p.rate, 2 * p.traces_per_namespace / (p.kills * 9.0))


LLM_RATES = {"fault_500_rate": 0.10, "fault_429_rate": 0.05, "fault_timeout_rate": 0.05, "fault_malformed_rate": 0.05}

SCENARIOS = {
    s.name: s
    for s in (
        Scenario("control", "no fault: the fault-free streaming run", _no_fault),
        Scenario(
            "kill-learner",
            "SIGKILL the learner (window+map+combine) at random moments",
            _kill("learner"),
            rate=_kill_rate,
        ),
        Scenario("kill-curate", "SIGKILL the curate worker at random moments", _kill("curate"), rate=_kill_rate),
        Scenario(
            "kill-uncommitted",
            "SIGKILL the learner right after a window is applied, its traces' offsets never committed: the "
            "restarted learner re-reads traces already windowed (cut differently) and must not stall",
            _kill_uncommitted,
            rate=_kill_rate,
            learner_env=NEVER_COMMIT,
            verify=_dropped_duplicates,
        ),
        Scenario(
            "llm-faults",
            "10% HTTP 500, 5% 429 + Retry-After, 5% timeouts, 5% malformed/schema-violating JSON",
            _llm_rates,
            sim_faults=LLM_RATES,
        ),
        Scenario("llm-outage", "every LLM request fails (503) for 30 s (short: 8 s)", _llm_outage),
        Scenario(
            "redis-restart",
            "Redis restarted mid-run (losing its data, then keeping it) and once more after the last version",
            _redis_restart,
            after_settle=_redis_wipe,
        ),
        Scenario("redis-outage", "Redis unavailable for 20 s (short: 6 s)", _redis_outage),
        Scenario("kafka-restart", "the Kafka broker restarted mid-run (SIGTERM; full: then SIGKILL)", _kafka_restart),
        Scenario("rebalance", "a second worker joins and leaves while windows are in flight", _rebalance),
        Scenario("hostile", "1,000+ bad records interleaved with the good traces", _no_fault, hostile=True),
    )
}


# --------------------------------------------------------------------------------------------------------
# Execution
# --------------------------------------------------------------------------------------------------------


def _line(label: str, text: str, ok: bool) -> str:
    return f"  {label:<9} {text}  {'PASS' if ok else 'FAIL'}"


def figure_lines(f: Figures) -> list[str]:
    ratio = f"{f.retention_ratio:.2f}" if f.retention_ratio is not None else "n/a"
    ref = f"{f.reference_retention:.3f}" if f.reference_retention is not None else "n/a"
    control = (
        f"; fault-free streaming run (other cuts) {f.control_retention:.3f}, ratio {f.ratio_vs_control:.2f}"
        if f.control_retention is not None and f.ratio_vs_control is not None
        else ""
    )
    equal = {True: "equal", False: f"differs in {f.same_answers_diff} bullets", None: "n/a"}[f.same_answers_equal]
    return [
        _line(
            "traces",
            f"published {f.published} / learned {f.learned} / dead-lettered {f.dead_lettered} / refused by broker "
            f"{f.refused_by_broker} / lost {f.lost} / learned twice {f.learned_twice} / phantom {f.phantom} / "
            f"bad unaccounted {f.bad_unaccounted}",
            f.lost == f.learned_twice == f.phantom == f.bad_unaccounted == 0,
        ),
        _line(
            "windows",
            f"applied {f.windows_applied} / applied twice {f.windows_applied_twice} / given up {f.windows_given_up}"
            f" / fenced {f.fenced_records} (claims {f.claims})",
            f.windows_applied_twice == f.windows_given_up == 0,
        ),
        _line(
            "versions",
            f"{f.versions} in the log, {f.versions_published} in Redis, reader saw {f.reader_versions_seen} / "
            f"regressions {f.version_regressions} / gaps {f.version_gaps}",
            f.version_regressions == f.version_gaps == 0,
        ),
        _line(
            "prompts",
            f"published prompt != rendering of its playbook: {f.prompt_mismatches} / torn reads {f.torn_reads}",
            f.prompt_mismatches == f.torn_reads == 0,
        ),
        _line("deltas", f"half-applied {f.half_applied}", f.half_applied == 0),
        _line(
            "quality",
            f"retention {'n/a' if f.retention is None else format(f.retention, '.3f')} vs fault-free same windows "
            f"{ref} (ratio {ratio}), same answers ⇒ "
            f"{equal}{control}",
            not any("retention" in x or "bullets differ" in x for x in f.violations),
        ),
        _line(
            "liveness",
            "final version after the last trace: "
            + (
                ", ".join(f"{ns} {v['final_after_s']}s (bound {v['bound_s']}s)" for ns, v in f.liveness.items())
                or "n/a"
            )
            + f" / stalls {f.stalls}",
            f.stalls == 0,
        ),
        _line("workers", f"crashes {f.worker_crashes}; faults {json.dumps(f.faults)}", f.worker_crashes == 0),
    ]


def execute(
    stack: PrivateStack,
    workdir: Path,
    scenario: Scenario,
    profile: Profile,
    *,
    api_key: str,
    control: dict[str, float] | None,
    run_index: int = 1,
    seed: int = 0,
) -> Figures:
    rng = random.Random(f"{scenario.name}/{run_index}/{seed}")
    run = Run(
        stack, workdir / f"{scenario.name}-{run_index}", scenario.name, api_key=api_key, env_extra=stack.worker_env()
    )
    figures = Figures(scenario=scenario.name, run=run_index)
    started = time.monotonic()
    good, truths = good_traces(profile.traces_per_namespace)
    records = good
    if scenario.hostile:
        records = interleave(good, hostile_corpus([ns for ns, _, _ in NAMESPACES]))
    progress: Progress | None = None
    settler: Settler | None = None
    watcher: PromptWatcher | None = None
    try:
        run.start_sim(**scenario.sim_faults)
        stack.ensure_topics(run.topics)  # replicated as the stack replicates (a cluster: on every node)
        run.start_worker("learner", **scenario.learner_env)
        run.start_worker("curate")
        watcher = PromptWatcher(run, truths)
        watcher.start()
        producer = run.producer()
        rate = scenario.rate(profile) * (len(records) / len(good))
        publisher = PacedPublisher(producer, records, rate)
        publisher.start()
        progress = Progress(run)
        figures.faults = scenario.drive(run, profile, progress, rng)
        if scenario.rate(profile) < profile.rate:
            # a slowed rate only keeps traces arriving until the last fault: the faults are over, send the rest
            publisher.hurry.set()
        publisher.join_checked()
        producer.close()
        quiet_at = time.time()  # the last trace is published and the fault injection is over
        run.note(f"published {len(records)} records; settling")
        settler = Settler(run)
        settler.wait(producer.sent, profile.settle_timeout_s)
        _check_liveness(settler.liveness(quiet_at), figures)
        if scenario.after_settle is not None:
            figures.faults.update(scenario.after_settle(run, profile, progress, rng))
            started_again = time.monotonic()
            settler.wait(producer.sent, profile.settle_timeout_s)
            figures.faults["settled_again_s"] = round(time.monotonic() - started_again, 1)
        wait_quiet(run, truths)  # anything late (a duplicate application, a stale publish) shows up now
        obs = observe(run, list(truths), watcher)
        finals = check(run, producer.sent, obs, figures)
        quality(run, obs, finals, truths, control, figures, require_equal=scenario.require_equal)
        if scenario.hostile:
            _check_injection(obs, figures)
        if scenario.verify is not None:
            scenario.verify(run, figures)
        if scenario.sim_faults:
            assert run.sim is not None
            figures.faults["simulator"] = {
                k: v for k, v in run.sim.stats().items() if k in ("requests", "by_status", "faults")
            }
        figures.seconds = round(time.monotonic() - started, 1)
        return figures
    finally:
        for closer in (progress, settler):
            if closer is not None:
                closer.close()
        if watcher is not None:
            watcher.stop()
        run.close()
        run.save("figures.json", figures.as_dict())
        run.save("events.json", run.events)


def _check_liveness(liveness: dict[str, dict[str, float]], figures: Figures) -> None:
    figures.liveness = liveness
    figures.stalls = sum(1 for v in liveness.values() if v["final_after_s"] > v["bound_s"])
    for ns, v in liveness.items():
        if v["final_after_s"] > v["bound_s"]:
            figures.violations.append(
                f"{ns} reached its final version {v['final_after_s']}s after the last trace (bound {v['bound_s']}s)"
            )


def _check_injection(obs: Any, figures: Figures) -> None:
    """No published prompt (any retained version, or any the reader saw) carries injected text."""
    leaked = 0
    for versions in obs.redis_versions.values():
        leaked += sum(INJECTION_MARKER in prompt for prompt, _ in versions.values())
    for seen in obs.seen.values():
        leaked += sum(INJECTION_MARKER in s.prompt for s in seen)
    figures.faults["injected_text_in_prompts"] = leaked
    if leaked:
        figures.violations.append(f"injected text reached {leaked} published prompts")


def output_dir() -> Path:
    return Path(os.environ.get("COMBEE_FAULTS_OUT", Path(__file__).resolve().parents[2] / "var" / "faults"))
