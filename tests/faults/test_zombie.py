"""Issue 9, item 3: a zombie combiner's late write is refused and counted (real Kafka, Redis and workers).

Two learners share the partitions; model calls take seconds (the simulator's latency), so merges are in
flight for a while. The learner seen starting a window's last merge is paused (SIGSTOP) before the merge
returns, past its session timeout, until the other learner has taken its partition over — claimed it, redone
the window and applied it. Then it is resumed (SIGCONT): it does not know it lost the partition, finishes the
merge and logs the window. That record follows the new owner's claim: it must be fenced — counted in the
zombie's log and in the delta log, never snapshotted, published or counted as an application — and every
invariant of the suite must hold. If the zombie writes nothing, the test says so and fails: it passes only by
seeing the refusal happen.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.faults.conftest import record
from tests.faults.harness import PacedPublisher, PromptWatcher, Run, WorkerProc, wait_until
from tests.faults.invariants import Figures, check, observe, quality
from tests.faults.quiet import wait_quiet
from tests.faults.stack import PrivateStack
from tests.faults.suite import Settler, figure_lines, good_traces

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(900)]

#: Every model call takes ~2.5 s (time to first token), whatever its size: a merge is in flight long enough to
#: be caught, and the run stays short.
SLOW_SIM = {"time_scale": 1.0, "ttft_s": 2.5, "prefill_s_per_token": 0.0, "decode_tokens_per_s": 5000.0}
#: No model call of the paused learner may time out while it is stopped: after SIGCONT its merge's answer is
#: already in its socket, and it must finish the merge as a zombie would, not retry it.
#: The paper's reduce shape: the default (section-union) sends no merge call to be caught in flight.
WORKERS = {
    "COMBEE_LLM_TIMEOUT_S": "300",
    "COMBEE_BS_DEFAULT": "8",
    "COMBEE_BS_CANDIDATES": "[8]",
    "COMBEE_REDUCE_SHAPE": "none",
}
TRACES_PER_NAMESPACE = 40
STARTED = re.compile(r"merge (?P<node>(?P<wid>\S+)/\d+\.\d+) started \(\d+ inputs, the window's last\)")


def _log(w: WorkerProc) -> str:
    return w.log.read_text(errors="replace") if w.log.exists() else ""


def _merge_in_flight(w: WorkerProc) -> tuple[str, str] | None:
    """(node, window id) of a window's last merge that ``w`` started and has not finished, if any."""
    text = _log(w)
    for m in reversed(list(STARTED.finditer(text))):
        if f"merge {m['node']} done" not in text and f"merge {m['node']} failed" not in text:
            return m["node"], m["wid"]
    return None


def _takeover_report(other: WorkerProc, paused: WorkerProc, wid: str) -> str:
    """What the two learners logged, for a takeover that did not happen: CI keeps only what a test prints."""
    partition = wid.split("/")[-2].lstrip("p")
    about = re.compile(rf"/p{partition}/|partition {partition}\b|rebalanc|assigned|revoked|Recovery|WARNING|ERROR")
    lines = [line[:300] for line in _log(other).splitlines()]
    relevant = [line for line in lines if about.search(line)]
    return (
        f"--- {other.name}: lines about partition {partition}, rebalances, warnings and errors (last 40) ---\n"
        + "\n".join(relevant[-40:])
        + f"\n--- {other.name}: last 25 lines ---\n"
        + "\n".join(lines[-25:])
        + f"\n--- {paused.name} (stopped): last 15 lines ---\n"
        + "\n".join(line[:300] for line in paused.tail(15).splitlines())
    )


def test_a_paused_combiners_late_write_is_fenced(
    stack: PrivateStack, workdir: Path, api_key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = Run(stack, workdir / "zombie-1", "zombie", api_key=api_key, env_extra=dict(WORKERS))
    figures = Figures(scenario="zombie")
    started = time.monotonic()
    good, truths = good_traces(TRACES_PER_NAMESPACE)
    paused: WorkerProc | None = None
    watcher: PromptWatcher | None = None
    settler: Settler | None = None
    try:
        run.start_sim(**SLOW_SIM)
        run.ensure_topics()
        learners = [run.start_worker("learner"), run.start_worker("learner")]
        run.start_worker("curate")
        wait_until(lambda: all(w.joined() for w in learners), 90, "both learners to join", poll_s=0.3)
        watcher = PromptWatcher(run, truths)
        watcher.start()
        producer = run.producer()
        publisher = PacedPublisher(producer, good, rate=3.0)
        publisher.start()

        # 1. catch a learner with a window's last merge in flight, and stop it there
        node = wid = ""
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            run.check_no_crash()
            caught = next(((w, m) for w in learners if (m := _merge_in_flight(w)) is not None), None)
            if caught is None:
                time.sleep(0.05)
                continue
            victim, (node, wid) = caught
            os.kill(victim.pid, signal.SIGSTOP)
            if _merge_in_flight(victim) == (node, wid):
                paused = victim
                break
            os.kill(victim.pid, signal.SIGCONT)  # it finished just before the stop: wait for another merge
        assert paused is not None, "no learner was caught with a merge in flight"
        other = next(w for w in learners if w is not paused)
        stopped_at = time.monotonic()
        run.note(f"SIGSTOP {paused.name} (pid {paused.pid}) during merge {node}")

        # 2. the other learner takes the partition over: claims it, redoes the window and applies it
        try:
            wait_until(lambda: f"applied {wid} as v" in _log(other), 180, f"{other.name} to apply {wid}", poll_s=0.3)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_takeover_report(other, paused, wid)}") from None
        takeover_s = time.monotonic() - stopped_at
        run.note(f"{other.name} applied {wid} {takeover_s:.1f}s after the stop; SIGCONT {paused.name}")
        os.kill(paused.pid, signal.SIGCONT)
        resumed_at = time.monotonic()

        # 3. the zombie finishes its merge and logs the window: the write must be refused and counted
        fenced_line = f"fenced: {wid} v"
        try:
            wait_until(lambda: fenced_line in _log(paused), 120, "the zombie's late write to be fenced", poll_s=0.3)
        except AssertionError:
            tail = paused.tail(30)
            wrote = f"applied {wid} as v" in _log(paused)
            raise AssertionError(
                f"no zombie write was refused: {paused.name} "
                + ("APPLIED the window after resuming (not fenced!)" if wrote else "wrote nothing for it")
                + f" within 120 s of SIGCONT; its log ends:\n{tail}"
            ) from None
        refused_s = time.monotonic() - resumed_at
        zombie_counted = max(int(x) for x in re.findall(r"fenced writes: (\d+)", _log(paused)))
        run.note(f"{paused.name}'s write of {wid} fenced {refused_s:.1f}s after SIGCONT")
        figures.faults = {
            "paused": paused.name,
            "window": wid,
            "takeover_s": round(takeover_s, 1),
            "refused_after_resume_s": round(refused_s, 1),
            "fenced_writes_logged": zombie_counted,
        }

        # 4. everything settles; every invariant holds, and the log shows the fenced record apart
        publisher.hurry.set()  # the rate only spread traces over the pause and takeover, which are over
        publisher.join_checked()
        producer.close()
        settler = Settler(run)
        settler.wait(producer.sent, 420)
        wait_quiet(run, truths)
        obs = observe(run, list(truths), watcher)
        watcher = None
        finals = check(run, producer.sent, obs, figures)
        quality(run, obs, finals, truths, None, figures, require_equal=True)
        fenced_windows = [r.window_id for r in obs.fenced]
        if wid not in fenced_windows:
            figures.violations.append(f"the delta log holds no fenced record of {wid} (fenced: {fenced_windows})")
        if figures.fenced_records < zombie_counted:
            figures.violations.append(
                f"{paused.name} counted {zombie_counted} fenced writes, the log holds {figures.fenced_records}"
            )
        figures.seconds = round(time.monotonic() - started, 1)
        with capsys.disabled():
            print(f"\n=== zombie combiner: {paused.name} paused during {node}")
            for line in figure_lines(figures):
                print(line)
        record(figures.as_dict())
        assert not figures.violations, "\n".join(figures.violations)
        assert figures.fenced_records >= 1 and figures.windows_applied_twice == 0
    finally:
        if paused is not None and paused.alive():
            os.kill(paused.pid, signal.SIGCONT)
        if settler is not None:
            settler.close()
        if watcher is not None:
            watcher.stop()
        run.close()
        run.save("figures.json", figures.as_dict())
        run.save("events.json", run.events)
