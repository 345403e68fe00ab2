"""The public operations on a state dir: up (one broker and Redis), down, status, and stopping, starting
or restarting one service of a running stack (fault injection)."""

from __future__ import annotations

import contextlib
import shlex
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.local.cluster import ClusterServices, load_cluster, node_name, stop_nodes
from deploy.local.config import (
    DEFAULT_KAFKA_PORT,
    DEFAULT_REDIS_PORT,
    SERVICE_NAMES,
    DeployError,
    StackConfig,
    config_path,
    default_state_dir,
    kafka_version,
    load_config,
    locked,
    prepare_state_dir,
    say,
    write_json,
)
from deploy.local.process import forget, live_record, log_path, read_record
from deploy.local.readiness import kafka_answering, redis_ping, redis_shutdown_save
from deploy.local.service import ensure_service, port_of, start_service, stop_service, wait_gone

__all__ = [
    "Services",
    "down",
    "restart_kafka",
    "restart_redis",
    "start_kafka",
    "start_redis",
    "status",
    "stop_kafka",
    "stop_redis",
    "up",
]


def _check_compatible(state_dir: Path, previous: StackConfig, wanted: StackConfig) -> None:
    """Refuse to reuse running services that were started with settings other than the ones asked for."""
    if live_record(state_dir, "kafka"):
        was = (previous.kafka_version, previous.kafka_port, previous.controller_port)
        now = (wanted.kafka_version, wanted.kafka_port, wanted.controller_port)
        if was != now:
            raise DeployError(
                f"Kafka from {state_dir} runs as version {was[0]} on ports {was[1]}/{was[2]}, but version "
                f"{now[0]} on {now[1]}/{now[2]} was asked for: run `python -m deploy.local down` first, "
                "or use another state dir"
            )
    if live_record(state_dir, "redis"):
        if previous.redis_port != wanted.redis_port:
            raise DeployError(
                f"redis from {state_dir} runs on port {previous.redis_port}, not {wanted.redis_port}: "
                "run `python -m deploy.local down` first, or use another state dir"
            )
        if previous.redis_password != wanted.redis_password:
            raise DeployError(f"redis from {state_dir} runs with a different password: run `down` first")


@dataclass(frozen=True)
class Services:
    """The running stack, as `up` leaves it."""

    state_dir: Path
    config: StackConfig
    started: tuple[str, ...] = field(default=())  # what this `up` started; the rest was already running

    @property
    def kafka_bootstrap(self) -> str:
        return self.config.kafka_bootstrap

    @property
    def redis_url(self) -> str:
        return self.config.redis_url

    def env(self) -> dict[str, str]:
        """The variables the project reads to find the services."""
        return {"COMBEE_KAFKA_BOOTSTRAP": self.kafka_bootstrap, "COMBEE_REDIS_URL": self.redis_url}

    def export_lines(self) -> str:
        return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in self.env().items())


def up(
    state_dir: Path | None = None,
    kafka_port: int = DEFAULT_KAFKA_PORT,
    redis_port: int = DEFAULT_REDIS_PORT,
    redis_password: str | None = None,
    timeout_s: float = 120,
    *,
    controller_port: int | None = None,
) -> Services:
    """Make sure Kafka and Redis run and answer on 127.0.0.1; start whichever does not.

    Idempotent: services recorded in ``state_dir`` that are alive are reused (and waited for until they
    answer). ``timeout_s`` bounds the wait for answers, not the one-time jar download. On failure, whatever
    this call started is stopped again and DeployError is raised (with the last lines of the log).
    Raises DeployError if a needed port is held by another process.
    """
    state_dir = prepare_state_dir(state_dir or default_state_dir())
    cfg = StackConfig(
        kafka_port=kafka_port,
        controller_port=controller_port or kafka_port + 1,
        redis_port=redis_port,
        redis_password=redis_password or None,
        kafka_version=kafka_version(),
    )
    with locked(state_dir / ".lock"):
        _refuse_cluster(state_dir, "up")
        try:
            previous: StackConfig | None = load_config(state_dir)
        except DeployError:
            previous = None
        if previous is not None:
            _check_compatible(state_dir, previous, cfg)
        deadline = time.monotonic() + timeout_s
        started: list[str] = []
        try:
            for name in SERVICE_NAMES:
                if ensure_service(state_dir, name, cfg, deadline, timeout_s):
                    started.append(name)
        except BaseException:
            for name in reversed(started):
                stop_service(state_dir, name)
            raise
        # Only now: restarts and status read it, and it must describe what actually runs.
        write_json(config_path(state_dir), cfg.to_json())
    return Services(state_dir, cfg, tuple(started))


def down(state_dir: Path | None = None, services: Sequence[str] = SERVICE_NAMES) -> list[str]:
    """Stop the recorded ``services`` (default: all) that are still the processes this module launched.

    Returns the names actually stopped. Stale PID files are removed; nothing else is ever signalled.
    Kafka's data dir is kept; Redis's snapshot (if any) is removed, so the next `up` starts Redis empty.
    """
    state_dir = (state_dir or default_state_dir()).resolve()
    if not state_dir.exists():
        return []
    stopped: list[str] = []
    with locked(state_dir / ".lock"):
        for name in reversed(SERVICE_NAMES):  # redis first, kafka last
            if name not in services:
                continue
            if stop_service(state_dir, name):
                stopped.append(name)
                say(f"{name}: stopped")
            if name == "redis":
                (state_dir / "redis" / "dump.rdb").unlink(missing_ok=True)
        cluster = load_cluster(state_dir)
        if cluster is not None:  # all nodes at once, after Redis (see stop_nodes)
            nodes = [node_name(i) for i in reversed(cluster.node_ids)]
            for name in stop_nodes(state_dir, [n for n in nodes if n in services or "kafka" in services]):
                stopped.append(name)
                say(f"{name}: stopped")
    return stopped


def status(state_dir: Path | None = None) -> dict[str, Any]:
    """For each service: pid (None if no PID file), alive (that PID is still the launched process), port,
    answering (the port answers Kafka Metadata / Redis PING, whoever serves it) and log path."""
    state_dir = (state_dir or default_state_dir()).resolve()
    try:
        cfg: StackConfig | None = load_config(state_dir)
    except DeployError:
        cfg = None
    report: dict[str, Any] = {"state_dir": str(state_dir)}
    if cfg is not None:
        report["kafka_version"] = cfg.kafka_version
        report["env"] = _without_password(Services(state_dir, cfg).env(), cfg.redis_password)
    names: Sequence[str] = SERVICE_NAMES
    ports: dict[str, int] = {}
    with contextlib.suppress(DeployError):
        cluster = load_cluster(state_dir)
        if cluster is not None:
            names = (*(node_name(i) for i in cluster.node_ids), "redis")
            ports = {node_name(i): cluster.client_port(i) for i in cluster.node_ids}
            report["services"] = list(names)
            report["env"] = _without_password(ClusterServices(state_dir, cluster).env(), cluster.redis_password)
    for name in names:
        record = read_record(state_dir, name)
        alive = record is not None and live_record(state_dir, name) is not None
        port = record.port if record else ((ports.get(name) or port_of(name, cfg)) if cfg else None)
        answering = False
        if port is not None and cfg is not None:
            answering = kafka_answering(port) if name.startswith("kafka") else redis_ping(port, cfg.redis_password)
        report[name] = {
            "pid": record.pid if record else None,
            "alive": alive,
            "port": port,
            "answering": answering,
            "log": str(log_path(state_dir, name)),
        }
    return report


def _without_password(env: dict[str, str], password: str | None) -> dict[str, str]:
    """``env`` as `status` shows it: the Redis URL's password (``redis://:PASSWORD@``) replaced by ``***``."""
    if not password:
        return env
    auth = f":{urllib.parse.quote(password, safe='')}@"
    return {key: value.replace(auth, ":***@") for key, value in env.items()}


def _refuse_cluster(state_dir: Path, what: str) -> None:
    cluster = load_cluster(state_dir)
    if cluster is not None:
        raise DeployError(
            f"{state_dir} holds a {cluster.nodes}-node cluster: `{what}` is for a single broker (use `up --nodes "
            f"{cluster.nodes}`, `restart kafka --node N`, or another state dir)"
        )


def _restart_one(state_dir: Path | None, name: str, stop_first: bool, timeout_s: float, **stop: Any) -> None:
    state_dir = (state_dir or default_state_dir()).resolve()
    with locked(state_dir / ".lock"):
        if name == "kafka":
            _refuse_cluster(state_dir, "restart kafka")
        cfg = load_config(state_dir)
        if stop_first:
            stop_service(state_dir, name, **stop)
        if live_record(state_dir, name) is None:
            forget(state_dir, name)
            start_service(state_dir, name, cfg, time.monotonic() + timeout_s, timeout_s)


def stop_kafka(state_dir: Path | None = None, *, kill: bool = False) -> bool:
    """Stop the broker (SIGTERM: controlled shutdown; ``kill``: SIGKILL, a crash). Its data is kept."""
    state_dir = (state_dir or default_state_dir()).resolve()
    with locked(state_dir / ".lock"):
        _refuse_cluster(state_dir, "stop kafka")
        return stop_service(state_dir, "kafka", kill=kill)


def start_kafka(state_dir: Path | None = None, timeout_s: float = 120) -> None:
    """Start the broker again with the config of the last `up` (no-op if it runs); waits until it answers."""
    _restart_one(state_dir, "kafka", False, timeout_s)


def restart_kafka(state_dir: Path | None = None, *, kill: bool = False, timeout_s: float = 120) -> None:
    """Stop the broker (gracefully, or SIGKILL if ``kill``) and start it again on the same data dir.
    Topics, committed offsets and changelogs survive. Returns once it answers again."""
    _restart_one(state_dir, "kafka", True, timeout_s, kill=kill)


def stop_redis(state_dir: Path | None = None, *, keep_data: bool = True) -> bool:
    """Make Redis unavailable. With ``keep_data`` (default) it writes a snapshot first (SHUTDOWN SAVE) that
    start_redis() loads, like an outage of a persistent server; without it, the data is gone (SIGTERM)."""
    state_dir = (state_dir or default_state_dir()).resolve()
    with locked(state_dir / ".lock"):
        record = live_record(state_dir, "redis")
        if record is None:
            forget(state_dir, "redis")
            return False
        if keep_data:
            cfg = load_config(state_dir)
            try:
                redis_shutdown_save(cfg.redis_port, cfg.redis_password)
                wait_gone(record, 30.0)
            except OSError as exc:
                say(f"redis: SHUTDOWN SAVE failed ({exc}); stopping it without a snapshot")
        else:
            (state_dir / "redis" / "dump.rdb").unlink(missing_ok=True)
        stop_service(state_dir, "redis")  # SIGTERM if still running; clears the PID file either way
        return True


def start_redis(state_dir: Path | None = None, timeout_s: float = 30) -> None:
    """Start Redis again with the config of the last `up` (no-op if it runs), loading a snapshot left by
    stop_redis(keep_data=True); waits until it answers PING."""
    _restart_one(state_dir, "redis", False, timeout_s)


def restart_redis(state_dir: Path | None = None, *, keep_data: bool = True, timeout_s: float = 30) -> None:
    """stop_redis() then start_redis()."""
    stop_redis(state_dir, keep_data=keep_data)
    start_redis(state_dir, timeout_s)
