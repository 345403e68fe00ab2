"""Start a ``combee worker`` process against given services and model endpoint (the demo's and the streaming
benchmark's worker)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["spawn_worker"]


def spawn_worker(
    log_path: Path,
    *worker_args: str,
    base_url: str,
    bootstrap: str,
    redis_url: str,
    prefix: str,
    max_wait_s: float,
    python_args: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``combee worker`` against the given model endpoint and services, under ``prefix``, logging to
    ``log_path``; ``python_args`` go to the interpreter before ``-m combee.cli`` (e.g. a profiler's); ``env``:
    more settings (``COMBEE_*``) of the worker."""
    full_env = {
        **os.environ,
        "OPENAI_BASE_URL": base_url,
        "COMBEE_KAFKA_BOOTSTRAP": bootstrap,
        "COMBEE_REDIS_URL": redis_url,
        "COMBEE_TOPIC_PREFIX": prefix,
        "COMBEE_KEY_PREFIX": prefix,
        "COMBEE_MAX_WAIT_S": f"{max_wait_s:g}",
        **(env or {}),
    }
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, *python_args, "-m", "combee.cli", "worker", *worker_args],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
