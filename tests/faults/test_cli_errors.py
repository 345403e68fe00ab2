"""A service that is down or refuses the credentials ends a streaming verb with one line, status 4, no secret."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.faults.stack import free_port

SECRET = "pw-that-must-not-show-7c1f"


def combee(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("COMBEE_", "OPENAI_"))}
    return subprocess.run(
        [sys.executable, "-m", "combee.cli", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_status_with_redis_down_is_one_line_without_the_password() -> None:
    port = free_port()
    done = combee(
        "status",
        COMBEE_REDIS_URL=f"redis://combee:{SECRET}@127.0.0.1:{port}/0",
        COMBEE_KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}",
    )
    assert done.returncode == 4, done.stderr
    assert done.stderr.startswith("combee: error: Redis: ") and done.stderr.count("\n") == 1, done.stderr
    assert SECRET not in done.stdout + done.stderr
