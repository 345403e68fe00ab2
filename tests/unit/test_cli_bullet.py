"""``combee bullet``'s one-line errors that need no service, and Redis not there (exit 4, never a traceback)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest


def combee(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "combee.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["release", "ns", "b00001"], "'b00001' is not a quarantine id (q + 12 hex digits)"),
        (["pin", "ns", "q0123456789ab"], "'q0123456789ab' is quarantined: release it first"),
        (["list", "no such ns!"], "invalid namespace"),
        (["list", "ns", "--quarantined", "--all"], "not allowed with argument"),
    ],
)
def test_bad_requests_are_one_line_with_exit_2(args: list[str], message: str) -> None:
    done = combee("bullet", *args, COMBEE_REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0")  # never a real Redis
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


@pytest.mark.parametrize("verb", [["list", "ns"], ["audit", "ns"], ["release", "ns", "q0123456789ab"]])
def test_redis_not_there_is_one_line_with_exit_4(verb: list[str]) -> None:
    done = combee("bullet", *verb, COMBEE_REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0")
    assert done.returncode == 4 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
