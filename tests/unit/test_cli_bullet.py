"""``combee bullet``'s one-line errors that need no service, Redis not there (exit 4, never a traceback), and the error
of a control request no worker answered (bullet actions and ``prompt rollback``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from combee.cli.base import EXIT_SERVICE, no_new_version


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


def test_a_control_request_no_worker_answered_says_where_to_look_and_whether_it_was_signed() -> None:
    signed, unsigned = no_new_version("rollback", 30, True), no_new_version("pin of b00001", 2.5, False)
    assert signed.code == unsigned.code == EXIT_SERVICE
    assert str(signed).startswith("rollback requested, but no new version appeared within 30s (is a worker running?")
    assert "signed with this COMBEE_CONTROL_KEY" in str(signed) and "not signed" not in str(signed)
    assert str(unsigned).startswith("pin of b00001 requested, but no new version appeared within 2.5s")
    assert "not signed: no COMBEE_CONTROL_KEY" in str(unsigned) and "\n" not in str(unsigned)
