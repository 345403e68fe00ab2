"""A PRIVATE Kafka broker and redis-server for the fault suite, started with ``deploy.local`` on free ports.

The suite restarts and stops these services on purpose (broker restart, Redis outage), so it never uses the
shared ones other people's tests run on: everything lives under its own state directory and is stopped by PID
through ``deploy.local.down``. Redis requires a password (every scenario runs against an authenticated Redis);
the password reaches the workers only through ``COMBEE_REDIS_PASSWORD``, never in a URL.

:class:`ClusterStack` is the same with a local KRaft cluster of three nodes instead of one broker (every topic
replicated three times, ``min.insync.replicas=2``), whose nodes the cluster profile SIGKILLs one at a time.
"""

from __future__ import annotations

import json
import random
import secrets
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import deploy.local as local
from deploy.local.ports import ephemeral_range
from streams.kafka_config import TopicsReport, ensure_topics
from streams.topics import Topics

__all__ = ["RESERVED_PORTS", "ClusterStack", "PrivateStack", "free_port"]

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
    low, _ = ephemeral_range()
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
    def replication_factor(self) -> int:
        return 1

    @property
    def min_insync_replicas(self) -> int | None:
        return None

    def worker_env(self) -> dict[str, str]:
        """What the workers need beyond the bootstrap list to use this stack: nothing for one broker."""
        return {}

    def ensure_topics(self, topics: Topics) -> TopicsReport:
        """Create a run's topics, replicated as this stack replicates (the workers would too, but the
        producer may start first)."""
        return ensure_topics(
            self.bootstrap,
            topics,
            replication_factor=self.replication_factor,
            min_insync_replicas=self.min_insync_replicas,
        )

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


@dataclass
class ClusterStack(PrivateStack):
    """A private three-node KRaft cluster (every node broker + controller) and Redis, on free ports.

    Every topic has ``nodes`` replicas and ``min.insync.replicas`` = a majority; every producer of the suite and
    the workers uses acks=all, so a write acknowledged before a node dies is on another node too. Nodes are
    killed and started by node id through ``deploy.local`` (verified PIDs, like everything it stops).
    """

    nodes: int = 3
    cluster: local.ClusterServices | None = None

    def up(self, timeout_s: float = 240) -> ClusterStack:
        self.kafka_port = self.kafka_port or free_port(2 * self.nodes)
        self.redis_port = self.redis_port or free_port(1)
        while self.kafka_port <= self.redis_port < self.kafka_port + 2 * self.nodes:
            self.redis_port = free_port(1)
        self.redis_password = self.redis_password or "rp-" + secrets.token_urlsafe(18)
        self.cluster = local.cluster_up(
            self.state_dir,
            self.nodes,
            kafka_port=self.kafka_port,
            redis_port=self.redis_port,
            redis_password=self.redis_password,
            timeout_s=timeout_s,
        )
        return self

    @property
    def config(self) -> local.ClusterConfig:
        assert self.cluster is not None, "call up() first"
        return self.cluster.config

    @property
    def bootstrap(self) -> str:
        return self.config.kafka_bootstrap

    @property
    def replication_factor(self) -> int:
        return self.config.nodes

    @property
    def min_insync_replicas(self) -> int | None:
        return self.config.min_insync_replicas

    def worker_env(self) -> dict[str, str]:
        return {
            "COMBEE_REPLICATION_FACTOR": str(self.replication_factor),
            "COMBEE_MIN_INSYNC_REPLICAS": str(self.min_insync_replicas),
        }

    # --- faults ----------------------------------------------------------------------------------------

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node (a crash: no controlled shutdown, its leaderships move when its session expires)."""
        local.stop_node(self.state_dir, node_id, kill=True)

    def start_node(self, node_id: int, timeout_s: float = 180) -> float:
        """Start a stopped node again; returns the seconds until it served clients."""
        started = time.monotonic()
        local.start_node(self.state_dir, node_id, timeout_s)
        return time.monotonic() - started

    def restart_kafka(self, *, kill: bool = False) -> float:
        raise NotImplementedError("a cluster restarts one node at a time: kill_node() and start_node()")

    # --- what the cluster says -------------------------------------------------------------------------

    def _admin(self) -> Any:
        from kafka import KafkaAdminClient

        return KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5000, client_id="combee-faults")

    def partitions(self, topics: Iterable[str]) -> dict[tuple[str, int], tuple[int, tuple[int, ...]]]:
        """(topic, partition) -> (leader node id or -1, ISR), as the cluster's metadata says now."""
        admin = self._admin()
        try:
            out: dict[tuple[str, int], tuple[int, tuple[int, ...]]] = {}
            for t in admin.describe_topics(sorted(topics)):
                for part in t.get("partitions") or []:
                    out[(t["name"], part["partition_index"])] = (part["leader_id"], tuple(sorted(part["isr_nodes"])))
            return out
        finally:
            admin.close()

    def leader(self, topic: str, partition: int) -> int:
        return self.partitions([topic])[(topic, partition)][0]

    def under_replicated(self, topics: Iterable[str]) -> list[tuple[str, int]]:
        """Partitions of ``topics`` whose ISR is not every node (or that have no leader)."""
        everyone = tuple(self.config.node_ids)
        return [tp for tp, (leader, isr) in self.partitions(topics).items() if leader < 0 or isr != everyone]

    def replication(self, prefix: str) -> dict[str, tuple[int, str | None]]:
        """Every topic whose name starts with ``prefix`` (a run's own and its Faust app's): the fewest replicas
        any of its partitions has, and its effective min.insync.replicas."""
        from kafka.admin import ConfigResource, ConfigResourceType

        admin = self._admin()
        try:
            names = sorted(n for n in admin.list_topics() if n.startswith(prefix))
            replicas = {
                t["name"]: min((len(p["replica_nodes"]) for p in t.get("partitions") or []), default=0)
                for t in admin.describe_topics(names)
            }
            key = "min.insync.replicas"
            resources = [ConfigResource(ConfigResourceType.TOPIC, n, configs={key: None}) for n in names]
            configs = admin.describe_configs(resources, config_filter="all").get("topic", {})
            return {n: (replicas.get(n, 0), (configs.get(n, {}).get(key) or {}).get("value")) for n in names}
        finally:
            admin.close()

    def node_pids(self) -> dict[int, int | None]:
        return local.node_pids(self.state_dir)

    def logs(self) -> list[Path]:
        return [
            *(self.state_dir / f"{local.node_name(i)}.log" for i in self.config.node_ids),
            self.state_dir / "redis.log",
        ]
