"""A PRIVATE Kafka broker and redis-server for the fault suite, started with ``deploy.local`` on free ports.

The suite restarts and stops these services on purpose (broker restart, Redis outage), so it never uses the
shared ones other people's tests run on: everything lives under its own state directory and is stopped by PID
through ``deploy.local.down``. Redis requires a password (every scenario runs against an authenticated Redis);
the password reaches the workers only through ``COMBEE_REDIS_PASSWORD``, never in a URL.
"""

from __future__ import annotations

import json
import random
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import deploy.local as local

__all__ = ["RESERVED_PORTS", "PrivateStack", "free_port"]

# Ports the shared services of this machine use (and their KRaft controller ports): never ours.
RESERVED_PORTS = frozenset({9092, 9093, 6379, 39092, 39093, 36379, 19092, 19093, 29092, 29093, 26379})


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(span: int = 1, rng: random.Random | None = None) -> int:
    """A port P such that P..P+span-1 are free and reserved by nobody, below the ephemeral range (so a
    restarted server does not find its port taken by some client's outgoing connection)."""
    rng = rng or random.Random()
    low, _ = local._ephemeral_range()
    for _ in range(500):
        port = rng.randrange(20_000, min(low, 32_000) - span)
        ports = range(port, port + span)
        if not any(p in RESERVED_PORTS for p in ports) and all(_bindable(p) for p in ports):
            return port
    raise RuntimeError("no free port pair found")


@dataclass
class PrivateStack:
    """Kafka + Redis of the fault suite (see the module docstring)."""

    state_dir: Path
    kafka_port: int = 0
    redis_port: int = 0
    redis_password: str = ""
    services: local.Services | None = None

    @classmethod
    def from_state_dir(cls, state_dir: Path) -> PrivateStack:
        """The stack a previous ``up`` left in ``state_dir`` (ports and password from its config.json), so a
        developer can keep one running between suite runs (``COMBEE_FAULTS_STATE_DIR``)."""
        config = state_dir / "config.json"
        if not config.exists():
            return cls(state_dir)
        data = json.loads(config.read_text())
        return cls(state_dir, data["kafka_port"], data["redis_port"], data.get("redis_password") or "")

    def up(self, timeout_s: float = 180) -> PrivateStack:
        self.kafka_port = self.kafka_port or free_port(2)
        self.redis_port = self.redis_port or free_port(1)
        while self.redis_port in (self.kafka_port, self.kafka_port + 1):
            self.redis_port = free_port(1)
        self.redis_password = self.redis_password or "rp-" + secrets.token_urlsafe(18)
        self.services = local.up(
            self.state_dir,
            kafka_port=self.kafka_port,
            redis_port=self.redis_port,
            redis_password=self.redis_password,
            timeout_s=timeout_s,
        )
        return self

    def down(self) -> None:
        local.down(self.state_dir)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def redis_url(self) -> str:
        """The URL without credentials (the password goes in COMBEE_REDIS_PASSWORD)."""
        return f"redis://127.0.0.1:{self.redis_port}/0"

    # --- faults ----------------------------------------------------------------------------------------

    def restart_kafka(self, *, kill: bool = False) -> float:
        """Restart the broker (SIGTERM, or SIGKILL with ``kill``); returns the seconds it was away."""
        started = time.monotonic()
        local.restart_kafka(self.state_dir, kill=kill)
        return time.monotonic() - started

    def stop_redis(self, *, keep_data: bool = True) -> None:
        local.stop_redis(self.state_dir, keep_data=keep_data)

    def start_redis(self) -> None:
        local.start_redis(self.state_dir)

    def logs(self) -> list[Path]:
        return [self.state_dir / "kafka.log", self.state_dir / "redis.log"]
