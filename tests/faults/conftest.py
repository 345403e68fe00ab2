"""Fixtures of the fault suite: a PRIVATE Kafka + Redis, an API key to keep secret, the figures table.

The suite is opt-in — it takes minutes and restarts its services on purpose — and is selected with the
``COMBEE_FAULTS`` environment variable (tests that need no services, marked otherwise, always run):

    COMBEE_FAULTS=short .venv/bin/python -m pytest tests/faults -q      # CI: a few minutes
    COMBEE_FAULTS=full  COMBEE_FAULTS_RUNS=3 .venv/bin/python -m pytest tests/faults -q   # issue #5, 3 runs
    COMBEE_FAULTS=full  .venv/bin/python -m pytest tests/faults/test_soak.py -q           # the 10-minute soak

It never touches the shared services (``deploy.local`` on the default ports): it starts its own broker and
redis-server with ``deploy.local.up`` under a temporary state directory, on free ports, and stops them by PID
at the end. ``COMBEE_FAULTS_STATE_DIR`` keeps them in a directory of your choice instead (and reuses them).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.stack import PrivateStack
from tests.faults.suite import PROFILES, Profile, output_dir

MODE = os.environ.get("COMBEE_FAULTS", "").strip().lower()
RESULTS: list[dict[str, Any]] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "faults: the fault-injection suite (opt-in: COMBEE_FAULTS=short|full)")
    if MODE in PROFILES:
        # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C: every run's finally stops its workers, the
        # simulator and the private Kafka + Redis.
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if MODE in PROFILES:
        return
    skip = pytest.mark.skip(reason="fault suite: set COMBEE_FAULTS=short or COMBEE_FAULTS=full to run it")
    for item in items:
        if item.get_closest_marker("faults") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def profile() -> Profile:
    return PROFILES[MODE]


@pytest.fixture(scope="session")
def api_key() -> str:
    """The LLM API key the workers get: a secret (the secrets test greps for it)."""
    return "sk-faults-" + secrets.token_urlsafe(24)


@pytest.fixture(scope="session")
def stack() -> Iterator[PrivateStack]:
    keep = os.environ.get("COMBEE_FAULTS_STATE_DIR")
    if keep:
        s = PrivateStack.from_state_dir(Path(keep)).up()
        yield s
        return
    with tempfile.TemporaryDirectory(prefix="combee-faults-") as tmp:
        s = PrivateStack(Path(tmp) / "state").up()
        try:
            yield s
        finally:
            s.down()


@pytest.fixture(scope="session")
def workdir() -> Path:
    out = output_dir()
    out.mkdir(parents=True, exist_ok=True)
    return out


def record(figures: dict[str, Any]) -> None:
    RESULTS.append(figures)
    path = output_dir() / "figures.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(figures, default=str) + "\n")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not RESULTS:
        return
    tr = terminalreporter
    tr.section("fault suite figures (SIMULATED model; real Kafka, Redis and workers)")
    head = (
        f"{'scenario':<14}{'run':>4}{'published':>10}{'learned':>8}{'dead-l.':>8}{'refused':>8}{'lost':>6}"
        f"{'twice':>6}{'regress':>8}{'half':>5}{'crash':>6}{'retention':>10}{'ratio':>7}{'equal':>7}"
        f"{'vs ctl':>7}{'secs':>7}"
    )
    tr.write_line(head)
    for f in RESULTS:

        def num(key: str, fmt: str, f: dict[str, Any] = f) -> str:
            return format(f[key], fmt) if f.get(key) is not None else "-"

        eq = {True: "yes", False: "no", None: "-"}[f.get("same_answers_equal")]
        tr.write_line(
            f"{f['scenario']:<14}{f['run']:>4}{f['published']:>10}{f['learned']:>8}{f['dead_lettered']:>8}"
            f"{f['refused_by_broker']:>8}{f['lost']:>6}{f['windows_applied_twice']:>6}"
            f"{f['version_regressions']:>8}{f['half_applied']:>5}{f['worker_crashes']:>6}"
            f"{num('retention', '.3f'):>10}{num('retention_ratio', '.2f'):>7}{eq:>7}"
            f"{num('ratio_vs_control', '.2f'):>7}{f['seconds']:>7}"
        )
