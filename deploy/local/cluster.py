"""A local multi-node cluster (fault tests of leader failover): every node a KRaft broker and controller,
one cluster id, a static quorum of all nodes, every topic replicated on every node."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import signal
import string
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.local.binaries import fetch_kafka, find_java, read_text
from deploy.local.config import (
    DEFAULT_KAFKA_PORT,
    DEFAULT_REDIS_PORT,
    DEPLOY_DIR,
    HOST,
    KAFKA_VERSION,
    DeployError,
    StackConfig,
    config_path,
    default_state_dir,
    kafka_version,
    locked,
    prepare_state_dir,
    say,
    write_json,
)
from deploy.local.ports import require_free
from deploy.local.process import ProcessRecord, forget, live_record, log_path, read_record, reap
from deploy.local.readiness import kafka_metadata
from deploy.local.service import (
    ensure_service,
    kafka_broker_argv,
    kafka_tool,
    new_cluster_id,
    send_signal,
    spawn,
    stop_service,
    wait_gone,
    wait_ready,
)

__all__ = [
    "CLUSTER_HEAP",
    "ClusterConfig",
    "ClusterServices",
    "cluster_up",
    "load_cluster",
    "node_name",
    "node_pids",
    "restart_node",
    "start_node",
    "stop_node",
    "stop_nodes",
]


#: Heap of each node of a local cluster: N of them share the machine with the workers.
CLUSTER_HEAP = "384m"
_CLUSTER_STOP_GRACE_S = 10.0


def node_name(node_id: int) -> str:
    """The service name of cluster node ``node_id``: its PID file, launch record and log are named after it."""
    return f"kafka-{node_id}"


@dataclass(frozen=True)
class ClusterConfig:
    """What `cluster_up` was asked for; saved as cluster.json. Node ``i`` (1..nodes) listens for clients on
    ``kafka_port + 2(i-1)`` and for the KRaft quorum on the port after it."""

    nodes: int = 3
    kafka_port: int = DEFAULT_KAFKA_PORT
    redis_port: int = DEFAULT_REDIS_PORT
    redis_password: str | None = None
    kafka_version: str = KAFKA_VERSION
    min_insync_replicas: int = 2
    cluster_id: str = ""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise DeployError(f"a cluster needs at least one node, not {self.nodes}")
        if not 1 <= self.min_insync_replicas <= self.nodes:
            raise DeployError(f"min.insync.replicas={self.min_insync_replicas} must be within 1..{self.nodes}")

    @property
    def node_ids(self) -> range:
        return range(1, self.nodes + 1)

    def client_port(self, node_id: int) -> int:
        return self.kafka_port + 2 * (node_id - 1)

    def controller_port(self, node_id: int) -> int:
        return self.client_port(node_id) + 1

    @property
    def voters(self) -> str:
        """controller.quorum.voters: every node is a voter (a static quorum)."""
        return ",".join(f"{i}@{HOST}:{self.controller_port(i)}" for i in self.node_ids)

    @property
    def kafka_bootstrap(self) -> str:
        """Every node: a client that starts while one is down still finds the cluster."""
        return ",".join(f"{HOST}:{self.client_port(i)}" for i in self.node_ids)

    @property
    def redis_url(self) -> str:
        return self.stack_config().redis_url

    def stack_config(self) -> StackConfig:
        """The single-broker view saved as config.json beside cluster.json, so that the Redis helpers
        (stop_redis, start_redis, status) work on a cluster's state dir unchanged."""
        return StackConfig(
            kafka_port=self.client_port(1),
            controller_port=self.controller_port(1),
            redis_port=self.redis_port,
            redis_password=self.redis_password,
            kafka_version=self.kafka_version,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "kafka_port": self.kafka_port,
            "redis_port": self.redis_port,
            "redis_password": self.redis_password,
            "kafka_version": self.kafka_version,
            "min_insync_replicas": self.min_insync_replicas,
            "cluster_id": self.cluster_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterConfig:
        return cls(
            nodes=int(data["nodes"]),
            kafka_port=int(data["kafka_port"]),
            redis_port=int(data["redis_port"]),
            redis_password=data.get("redis_password"),
            kafka_version=str(data["kafka_version"]),
            min_insync_replicas=int(data["min_insync_replicas"]),
            cluster_id=str(data.get("cluster_id") or ""),
        )


@dataclass(frozen=True)
class ClusterServices:
    """The running cluster and Redis, as `cluster_up` leaves them."""

    state_dir: Path
    config: ClusterConfig
    started: tuple[str, ...] = field(default=())

    @property
    def kafka_bootstrap(self) -> str:
        return self.config.kafka_bootstrap

    @property
    def redis_url(self) -> str:
        return self.config.redis_url

    def env(self) -> dict[str, str]:
        """The variables the project reads to find the services, and to replicate its topics on them."""
        return {
            "COMBEE_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "COMBEE_REDIS_URL": self.redis_url,
            "COMBEE_REPLICATION_FACTOR": str(self.config.nodes),
            "COMBEE_MIN_INSYNC_REPLICAS": str(self.config.min_insync_replicas),
        }

    def export_lines(self) -> str:
        return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in self.env().items())


def _cluster_path(state_dir: Path) -> Path:
    return state_dir / "cluster.json"


def load_cluster(state_dir: Path) -> ClusterConfig | None:
    """The cluster recorded in ``state_dir``, or None if it holds none (a single broker, or nothing yet)."""
    path = _cluster_path(state_dir)
    try:
        return ClusterConfig.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise DeployError(f"{path} is unreadable ({exc}); run `python -m deploy.local down` and `up`") from None


def _require_cluster(state_dir: Path) -> ClusterConfig:
    cfg = load_cluster(state_dir)
    if cfg is None:
        raise DeployError(f"{state_dir} holds no cluster: run `python -m deploy.local up --nodes 3` first")
    return cfg


def _formatted_cluster_id(state_dir: Path, cfg: ClusterConfig) -> str | None:
    """The cluster id some node's log dir was already formatted with (so a half-done `up` is finished with
    the same id instead of splitting the cluster)."""
    for node_id in cfg.node_ids:
        text = read_text(state_dir / node_name(node_id) / "data" / "meta.properties") or ""
        found = re.search(r"^cluster\.id=(\S+)$", text, re.MULTILINE)
        if found:
            return found.group(1)
    return None


def _render_cluster_properties(cfg: ClusterConfig, node_id: int, log_dir: Path) -> str:
    template = string.Template((DEPLOY_DIR / "cluster.properties").read_text())
    return template.substitute(
        node_id=node_id,
        kafka_port=cfg.client_port(node_id),
        controller_port=cfg.controller_port(node_id),
        voters=cfg.voters,
        log_dir=str(log_dir),
        replication=cfg.nodes,
        min_isr=cfg.min_insync_replicas,
    )


def _launch_node(state_dir: Path, cfg: ClusterConfig, node_id: int) -> ProcessRecord:
    lib = fetch_kafka(cfg.kafka_version)
    java = find_java()
    name = node_name(node_id)
    require_free(cfg.client_port(node_id), f"Kafka node {node_id}")
    require_free(cfg.controller_port(node_id), f"Kafka node {node_id} controller")
    node_dir = state_dir / name
    data_dir = node_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    props = node_dir / "server.properties"
    props.write_text(_render_cluster_properties(cfg, node_id, data_dir))
    if not (data_dir / "meta.properties").exists():
        args = ["format", "-t", cfg.cluster_id, "-c", str(props), "--ignore-formatted"]
        kafka_tool(java, lib, args, log_path(state_dir, name))
    argv = kafka_broker_argv(java, lib, props, os.environ.get("COMBEE_KAFKA_HEAP", CLUSTER_HEAP))
    return spawn(state_dir, name, argv, node_dir, cfg.client_port(node_id), (cfg.controller_port(node_id),))


def _node_answering(cfg: ClusterConfig, node_id: int, brokers: int) -> Callable[[], bool]:
    """True once the node serves Metadata naming itself (registered and unfenced) and ``brokers`` live nodes."""

    def answering() -> bool:
        try:
            md = kafka_metadata(cfg.client_port(node_id))
        except (OSError, ValueError, struct.error):
            return False
        live = {b[0] for b in md.brokers}
        return node_id in live and len(live) >= brokers

    return answering


def _start_nodes(
    state_dir: Path, cfg: ClusterConfig, node_ids: Sequence[int], brokers: int, deadline: float, timeout_s: float
) -> None:
    """Launch every node of ``node_ids`` first (a quorum needs a majority before any node can answer), then
    wait until each answers with ``brokers`` live nodes. On failure, the nodes launched here are killed."""
    started = time.monotonic()
    records: list[ProcessRecord] = []
    try:
        for node_id in node_ids:
            forget(state_dir, node_name(node_id))
            records.append(_launch_node(state_dir, cfg, node_id))
        for node_id, record in zip(node_ids, records, strict=True):
            wait_ready(state_dir, record, _node_answering(cfg, node_id, brokers), deadline, timeout_s)
            say(
                f"kafka node {node_id}: started pid {record.pid} on {HOST}:{record.port} in "
                f"{time.monotonic() - started:.1f} s"
            )
    except BaseException:
        for record in records:
            stop_service(state_dir, record.name, kill=True)
        raise


def stop_nodes(state_dir: Path, names: Sequence[str], grace_s: float = _CLUSTER_STOP_GRACE_S) -> list[str]:
    """SIGTERM every recorded node at once, then SIGKILL whichever outlives ``grace_s``. Stopping them one
    by one would leave the last ones without a controller quorum to grant their controlled shutdown; even
    together, the last node up can wait for a quorum that is gone, hence the short grace (what a killed node
    wrote is in the page cache; its next start recovers the logs as after any crash)."""
    running: list[tuple[str, ProcessRecord]] = []
    for name in names:
        record = read_record(state_dir, name)
        if record is not None:
            reap(record.pid)
            if send_signal(record, signal.SIGTERM):
                running.append((name, record))
                continue
        forget(state_dir, name)
    deadline = time.monotonic() + grace_s
    for name, record in running:
        if not wait_gone(record, max(0.1, deadline - time.monotonic())):
            say(f"{name} (pid {record.pid}) ignored SIGTERM for {grace_s:g} s: sending SIGKILL")
            send_signal(record, signal.SIGKILL)
            if not wait_gone(record, 10.0):
                raise DeployError(f"{name} (pid {record.pid}) did not exit even after SIGKILL")
        forget(state_dir, name)
    return [name for name, _ in running]


def cluster_up(
    state_dir: Path | None = None,
    nodes: int = 3,
    kafka_port: int = DEFAULT_KAFKA_PORT,
    redis_port: int = DEFAULT_REDIS_PORT,
    redis_password: str | None = None,
    timeout_s: float = 180,
    *,
    min_insync_replicas: int | None = None,
) -> ClusterServices:
    """Make sure a ``nodes``-node KRaft cluster (every node broker + controller, one cluster id, a static
    quorum of all nodes) and Redis run and answer on 127.0.0.1; start whatever does not.

    Ports: node ``i`` takes ``kafka_port + 2(i-1)`` (clients) and the next one (controller), so the cluster
    uses ``2 * nodes`` consecutive ports. Every topic is replicated to all nodes; ``min_insync_replicas``
    (default: a majority) is the broker-wide min.insync.replicas. Like `up`: idempotent, reuses live
    processes recorded in ``state_dir``, stops what it started if it fails, raises DeployError.
    """
    state_dir = prepare_state_dir(state_dir or default_state_dir())
    with locked(state_dir / ".lock"):
        previous = load_cluster(state_dir)
        if previous is None and live_record(state_dir, "kafka") is not None:
            raise DeployError(f"{state_dir} runs a single broker: run `python -m deploy.local down` first")
        cfg = ClusterConfig(
            nodes=nodes,
            kafka_port=kafka_port,
            redis_port=redis_port,
            redis_password=redis_password or None,
            kafka_version=kafka_version(),
            min_insync_replicas=min_insync_replicas if min_insync_replicas is not None else nodes // 2 + 1,
        )
        cfg = dataclasses.replace(cfg, cluster_id=_formatted_cluster_id(state_dir, cfg) or new_cluster_id())
        live = [i for i in cfg.node_ids if live_record(state_dir, node_name(i)) is not None]
        if previous is not None and (live or _formatted_cluster_id(state_dir, previous)):
            was = dataclasses.replace(previous, redis_port=0, redis_password=None)
            if dataclasses.replace(cfg, redis_port=0, redis_password=None) != was:
                raise DeployError(
                    f"{state_dir} holds a cluster of {previous.nodes} nodes (Kafka {previous.kafka_version}, ports "
                    f"from {previous.kafka_port}), not the one asked for: run `python -m deploy.local down` and use "
                    "another state dir"
                )
        redis_was = (previous.redis_port, previous.redis_password) if previous is not None else None
        if live_record(state_dir, "redis") and redis_was not in (None, (cfg.redis_port, cfg.redis_password)):
            raise DeployError(f"redis from {state_dir} runs on another port or password: run `down` first")
        deadline = time.monotonic() + timeout_s
        missing = [i for i in cfg.node_ids if i not in live]
        started: list[str] = []
        try:
            if missing:
                _start_nodes(state_dir, cfg, missing, cfg.nodes, deadline, timeout_s)
                started += [node_name(i) for i in missing]
            for node_id in live:
                record = live_record(state_dir, node_name(node_id))
                assert record is not None
                wait_ready(state_dir, record, _node_answering(cfg, node_id, cfg.nodes), deadline, timeout_s)
                say(f"kafka node {node_id}: reusing pid {record.pid} on {HOST}:{record.port}")
            if ensure_service(state_dir, "redis", cfg.stack_config(), deadline, timeout_s):
                started.append("redis")
        except BaseException:
            if "redis" in started:
                stop_service(state_dir, "redis")
            stop_nodes(state_dir, [n for n in started if n != "redis"])
            raise
        write_json(_cluster_path(state_dir), cfg.to_json())
        write_json(config_path(state_dir), cfg.stack_config().to_json())
    return ClusterServices(state_dir, cfg, tuple(started))


def stop_node(state_dir: Path | None, node_id: int, *, kill: bool = False) -> bool:
    """Stop cluster node ``node_id`` (SIGTERM: controlled shutdown, its leaderships move first; ``kill``:
    SIGKILL, a crash). Verified by PID like every stop here. Its data is kept. True if it was running."""
    state_dir = (state_dir or default_state_dir()).resolve()
    with locked(state_dir / ".lock"):
        cfg = _require_cluster(state_dir)
        if node_id not in cfg.node_ids:
            raise DeployError(f"the cluster in {state_dir} has nodes 1..{cfg.nodes}, not {node_id}")
        return stop_service(state_dir, node_name(node_id), kill=kill)


def start_node(state_dir: Path | None, node_id: int, timeout_s: float = 120) -> None:
    """Start cluster node ``node_id`` again on its data (no-op if it runs); returns once it serves clients
    (registered with the quorum and unfenced). Its replicas then catch up in the background."""
    state_dir = (state_dir or default_state_dir()).resolve()
    with locked(state_dir / ".lock"):
        cfg = _require_cluster(state_dir)
        if node_id not in cfg.node_ids:
            raise DeployError(f"the cluster in {state_dir} has nodes 1..{cfg.nodes}, not {node_id}")
        if live_record(state_dir, node_name(node_id)) is None:
            _start_nodes(state_dir, cfg, [node_id], 1, time.monotonic() + timeout_s, timeout_s)


def restart_node(state_dir: Path | None, node_id: int, *, kill: bool = False, timeout_s: float = 120) -> None:
    """stop_node() then start_node()."""
    stop_node(state_dir, node_id, kill=kill)
    start_node(state_dir, node_id, timeout_s)


def node_pids(state_dir: Path | None = None) -> dict[int, int | None]:
    """node id -> PID of the cluster node this module launched, if it still runs (else None)."""
    state_dir = (state_dir or default_state_dir()).resolve()
    cfg = _require_cluster(state_dir)
    pids: dict[int, int | None] = {}
    for node_id in cfg.node_ids:
        record = live_record(state_dir, node_name(node_id))
        pids[node_id] = record.pid if record else None
    return pids
