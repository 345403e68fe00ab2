"""Paths and configuration: constants, the state and cache directories, config.json, the lock, messages."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_KAFKA_PORT",
    "DEFAULT_REDIS_PORT",
    "DEPLOY_DIR",
    "HOST",
    "KAFKA_HEAP",
    "KAFKA_VERSION",
    "LOG_TAIL_LINES",
    "SERVICE_NAMES",
    "DeployError",
    "StackConfig",
    "cache_dir",
    "config_path",
    "default_state_dir",
    "env_int",
    "kafka_version",
    "load_config",
    "locked",
    "prepare_state_dir",
    "say",
    "write_json",
]

#: The broker version used everywhere (keep in step with deploy/pom.xml and docker-compose.yml).
#: See docs/infrastructure.md for why this one. ``$COMBEE_KAFKA_VERSION`` overrides it (4.x only: 3.9 needs
#: a reload4j backend instead of log4j2).
KAFKA_VERSION = "4.4.0"
HOST = "127.0.0.1"
DEFAULT_KAFKA_PORT = 9092
DEFAULT_REDIS_PORT = 6379
KAFKA_HEAP = "512m"

#: deploy/, which holds the templates, the POM and the log4j2 configuration beside this package.
DEPLOY_DIR = Path(__file__).resolve().parent.parent
SERVICE_NAMES = ("kafka", "redis")
LOG_TAIL_LINES = 40


class DeployError(RuntimeError):
    """A service could not be fetched, started, reached or stopped. The message is meant for a human."""


def _repo_root() -> Path:
    root = DEPLOY_DIR.parent
    # An installed (non-editable) copy of deploy/ lives in site-packages: fall back to the working directory.
    return root if (root / "pyproject.toml").exists() else Path.cwd()


def default_state_dir() -> Path:
    """``$COMBEE_STATE_DIR`` if set, else ``var/dev`` under the repository."""
    env = os.environ.get("COMBEE_STATE_DIR")
    return Path(env) if env else _repo_root() / "var" / "dev"


def cache_dir() -> Path:
    env = os.environ.get("COMBEE_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "combee"


def kafka_version() -> str:
    return os.environ.get("COMBEE_KAFKA_VERSION") or KAFKA_VERSION


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise DeployError(f"{name}={raw!r} is not a port number") from None


@dataclass(frozen=True)
class StackConfig:
    """What `up` was asked for; saved as config.json so that restarts reuse the same ports and password."""

    kafka_port: int = DEFAULT_KAFKA_PORT
    controller_port: int = DEFAULT_KAFKA_PORT + 1
    redis_port: int = DEFAULT_REDIS_PORT
    redis_password: str | None = None
    kafka_version: str = KAFKA_VERSION

    @property
    def kafka_bootstrap(self) -> str:
        return f"{HOST}:{self.kafka_port}"

    @property
    def redis_url(self) -> str:
        auth = f":{urllib.parse.quote(self.redis_password, safe='')}@" if self.redis_password else ""
        return f"redis://{auth}{HOST}:{self.redis_port}/0"

    def to_json(self) -> dict[str, Any]:
        return {
            "kafka_port": self.kafka_port,
            "controller_port": self.controller_port,
            "redis_port": self.redis_port,
            "redis_password": self.redis_password,
            "kafka_version": self.kafka_version,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StackConfig:
        return cls(
            kafka_port=int(data["kafka_port"]),
            controller_port=int(data["controller_port"]),
            redis_port=int(data["redis_port"]),
            redis_password=data.get("redis_password"),
            kafka_version=str(data["kafka_version"]),
        )


def config_path(state_dir: Path) -> Path:
    return state_dir / "config.json"


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
    tmp.replace(path)


def load_config(state_dir: Path) -> StackConfig:
    path = config_path(state_dir)
    try:
        return StackConfig.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        raise DeployError(f"{path} not found: run `python -m deploy.local up` first") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise DeployError(f"{path} is unreadable ({exc}); run `python -m deploy.local down` and `up`") from None


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Serialise `up`/`down`/restarts on one state dir (and jar fetches on one cache dir) across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def prepare_state_dir(state_dir: Path) -> Path:
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    # config.json may hold the Redis password.
    with contextlib.suppress(OSError):
        state_dir.chmod(0o700)
    return state_dir


def say(msg: str) -> None:
    print(f"deploy.local: {msg}", file=sys.stderr, flush=True)
