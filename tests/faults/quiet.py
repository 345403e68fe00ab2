"""The quiet period after a run has settled, before its checks: the time anything late (a window read again and
applied twice, a stale publish) gets to show up. It ends as soon as nothing late *can* still come, and after
:data:`QUIET_S` at the latest — the fixed period it replaces, so a run never waits longer than before.

Nothing can still come once (1) the workers' group has committed every trace, so no trace is read again, and (2)
the learner of every namespace reports, in a status written after the period began, nothing buffered and no
window in flight (``workers/status.py``; written every 2 s). A run where that cannot be seen — a learner that
never commits (kill-uncommitted), a namespace whose owner has no status of it — waits the whole period, as before.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

import redis

from tests.faults.harness import Run

__all__ = ["QUIET_S", "wait_quiet"]

QUIET_S = 3.0
POLL_S = 0.25


def _idle_since(run: Run, namespaces: Iterable[str], since: float) -> bool:
    client = run.redis(socket_timeout=2)
    try:
        for ns in namespaces:
            raw = client.get(run.keys.status(ns))
            status = json.loads(raw) if raw else None
            if not isinstance(status, dict) or float(status.get("updated_at", 0)) < since:
                return False
            if status.get("buffered") != 0 or status.get("windows_in_flight") != 0:
                return False
        return True
    except (redis.RedisError, ValueError):  # Redis away, or a status not as expected: not known to be quiet
        return False
    finally:
        client.close()


def wait_quiet(run: Run, namespaces: Iterable[str], max_s: float = QUIET_S) -> float:
    """Wait until nothing late can still arrive (see the module docstring), ``max_s`` seconds at most; return the
    seconds waited (noted in the run's events)."""
    wanted = sorted(namespaces)
    since = time.time()
    started = time.monotonic()
    while time.monotonic() - started < max_s:
        if _idle_since(run, wanted, since) and run.consumer_lag() == 0:
            break
        time.sleep(POLL_S)
    waited = round(time.monotonic() - started, 1)
    run.note(f"quiet after {waited}s (at most {max_s:g}s)")
    return waited
