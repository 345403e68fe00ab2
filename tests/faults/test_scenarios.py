"""Issue #5, part 1–3: each fault scenario drives the real pipeline, then every invariant is checked.

``COMBEE_FAULTS_RUNS=N`` runs the whole list N times in a row (run 1 of every scenario, then run 2, …);
``COMBEE_FAULTS_ONLY=a,b`` restricts it to some scenarios (the fault-free ``control`` run always runs first).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.faults.conftest import record
from tests.faults.stack import PrivateStack
from tests.faults.suite import SCENARIOS, Profile, execute, figure_lines

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(1800)]

RUNS = int(os.environ.get("COMBEE_FAULTS_RUNS", "1"))
ONLY = [s for s in os.environ.get("COMBEE_FAULTS_ONLY", "").split(",") if s]
CASES = [
    (run, name) for run in range(1, RUNS + 1) for name in SCENARIOS if name != "control" and (not ONLY or name in ONLY)
]

_control: dict[str, float] = {}


@pytest.fixture(scope="session")
def control(stack: PrivateStack, workdir: Path, profile: Profile, api_key: str) -> dict[str, float]:
    """Retention per namespace of the fault-free streaming run on the same traces (scenario ``control``)."""
    if not _control:
        figures = _run(stack, workdir, profile, api_key, "control", 1, None)
        _control.update(figures.retention_by_namespace)
    return dict(_control)


def _run(stack: PrivateStack, workdir: Path, profile: Profile, api_key: str, name: str, run: int, ref: Any) -> Any:
    print(f"\n=== scenario {name} (run {run}, profile {profile.name}): {SCENARIOS[name].doc}")
    figures = execute(stack, workdir, SCENARIOS[name], profile, api_key=api_key, control=ref, run_index=run)
    for line in figure_lines(figures):
        print(line)
    record(figures.as_dict())
    assert not figures.violations, "\n".join(figures.violations)
    return figures


def test_control(control: dict[str, float]) -> None:
    assert control and all(v > 0 for v in control.values())


@pytest.mark.parametrize(("run", "name"), CASES, ids=[f"{n}-run{r}" for r, n in CASES])
def test_scenario(
    stack: PrivateStack, workdir: Path, profile: Profile, api_key: str, control: dict[str, float], run: int, name: str
) -> None:
    _run(stack, workdir, profile, api_key, name, run, control)
