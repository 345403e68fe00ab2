"""Small helpers shared by the integration tests and the fault suite."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["wait_until"]


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.5) -> None:
    """Poll ``cond`` until it is true; fail the test with ``what`` after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
