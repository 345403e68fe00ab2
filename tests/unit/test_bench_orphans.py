"""A benchmark worker does not outlive the orchestrator that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

ORCHESTRATOR = textwrap.dedent(
    """
    import multiprocessing, os, sys, time
    from concurrent.futures import ProcessPoolExecutor
    from combee.bench.worker import exit_with_parent

    def run(path):
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(path + ".tmp", path)
        time.sleep(120)  # a long training run

    if __name__ == "__main__":
        init = exit_with_parent if sys.argv[2] == "watch" else None
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=init,
                                   initargs=(os.getpid(), 0.1) if init else ())
        pool.submit(run, sys.argv[1])
        time.sleep(120)
    """
)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # exited; a zombie waits for whoever adopted it to reap it


def _orphan_lives_s(tmp_path: Path, mode: str, wait_s: float) -> float | None:
    """Kill the orchestrator while its worker runs: seconds until the worker exits, None if it outlives ``wait_s``."""
    script = tmp_path / "orchestrator.py"
    script.write_text(ORCHESTRATOR)
    pidfile = tmp_path / f"worker-{mode}.pid"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    orchestrator = subprocess.Popen([sys.executable, str(script), str(pidfile), mode], env=env, cwd=tmp_path)
    worker = None
    try:
        deadline = time.monotonic() + 60
        while not pidfile.exists():
            assert time.monotonic() < deadline and orchestrator.poll() is None, "the worker never started"
            time.sleep(0.05)
        worker = int(pidfile.read_text())
        orchestrator.send_signal(signal.SIGKILL)  # no chance to unwind, like an unhandled SIGTERM
        orchestrator.wait()
        killed = time.monotonic()
        while time.monotonic() - killed < wait_s:
            if _gone(worker):
                return time.monotonic() - killed
            time.sleep(0.05)
        return None
    finally:
        orchestrator.kill()
        if worker is not None and not _gone(worker):
            os.kill(worker, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_a_worker_exits_when_its_orchestrator_is_killed(tmp_path: Path) -> None:
    assert _orphan_lives_s(tmp_path, "plain", 2.0) is None  # without the watch the orphan runs on
    lived = _orphan_lives_s(tmp_path, "watch", 10.0)
    assert lived is not None and lived < 5.0
