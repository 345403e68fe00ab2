"""Compatibility probes: small scripts that exercise each Kafka client the project uses against the real
broker started by deploy/local/. Results are recorded in docs/infrastructure.md. Run all of them with

    .venv/bin/python -m deploy.local exec -- .venv/bin/python -m deploy.probes

Not part of the test suite (they take a minute and print a report); tests/integration covers the basics.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator

__all__ = ["Checks"]


class Checks:
    """Collects named PASS/FAIL steps and prints them as it goes."""

    def __init__(self, client: str) -> None:
        self.client = client
        self.failed: list[str] = []
        self.passed: list[str] = []

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            self.failed.append(name)
            print(f"FAIL [{self.client}] {name}: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
        else:
            self.passed.append(name)
            print(f"PASS [{self.client}] {name}", flush=True)

    def report(self) -> int:
        print(f"[{self.client}] {len(self.passed)} passed, {len(self.failed)} failed", flush=True)
        return 1 if self.failed else 0
