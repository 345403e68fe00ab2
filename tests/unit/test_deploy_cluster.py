"""The local multi-node cluster of deploy.local, without Kafka: ports, the rendered node configuration, the
cluster id, the state-dir guards, the environment it hands out and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploy import local
from deploy.local import ClusterConfig, ClusterServices, DeployError, cli, cluster


def test_nodes_take_consecutive_port_pairs_and_all_of_them_are_voters_and_bootstrap() -> None:
    cfg = ClusterConfig(nodes=3, kafka_port=20000, redis_port=21000, cluster_id="abc")
    assert [(cfg.client_port(i), cfg.controller_port(i)) for i in cfg.node_ids] == [
        (20000, 20001),
        (20002, 20003),
        (20004, 20005),
    ]
    assert cfg.voters == "1@127.0.0.1:20001,2@127.0.0.1:20003,3@127.0.0.1:20005"
    assert cfg.kafka_bootstrap == "127.0.0.1:20000,127.0.0.1:20002,127.0.0.1:20004"
    assert ClusterConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg
    # config.json of a cluster's state dir: the Redis helpers read it unchanged
    assert (cfg.stack_config().redis_port, cfg.stack_config().kafka_port) == (21000, 20000)


@pytest.mark.parametrize(("nodes", "min_isr"), [(0, 1), (3, 0), (3, 4)])
def test_impossible_clusters_are_refused(nodes: int, min_isr: int) -> None:
    with pytest.raises(DeployError):
        ClusterConfig(nodes=nodes, min_insync_replicas=min_isr)


def test_a_node_config_replicates_everything_and_binds_loopback_only(tmp_path: Path) -> None:
    cfg = ClusterConfig(nodes=3, kafka_port=20000, min_insync_replicas=2)
    props = dict(
        line.split("=", 1)
        for line in cluster._render_cluster_properties(cfg, 2, tmp_path / "data").splitlines()
        if line and not line.startswith("#")
    )
    assert props["node.id"] == "2" and props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == cfg.voters
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:20002,CONTROLLER://127.0.0.1:20003"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:20002"
    assert props["log.dirs"] == str(tmp_path / "data")
    for key in (
        "default.replication.factor",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
    ):
        assert props[key] == "3"
    assert props["min.insync.replicas"] == "2" and props["transaction.state.log.min.isr"] == "2"
    assert props["unclean.leader.election.enable"] == "false"


def test_the_cluster_id_of_a_formatted_node_is_reused(tmp_path: Path) -> None:
    cfg = ClusterConfig(nodes=3)
    assert cluster._formatted_cluster_id(tmp_path, cfg) is None
    data = tmp_path / "kafka-2" / "data"
    data.mkdir(parents=True)
    (data / "meta.properties").write_text("version=1\ncluster.id=Xy7-abc_DEF\nnode.id=2\n")
    assert cluster._formatted_cluster_id(tmp_path, cfg) == "Xy7-abc_DEF"
    fresh = cluster.new_cluster_id()
    assert len(fresh) == 22 and not fresh.startswith("-")


def test_single_broker_commands_refuse_a_clusters_state_dir(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text(json.dumps(ClusterConfig(nodes=3, kafka_port=20000).to_json()))
    with pytest.raises(DeployError, match="3-node cluster"):
        local.up(tmp_path, kafka_port=20000, redis_port=21000)
    with pytest.raises(DeployError, match="3-node cluster"):
        local.stop_kafka(tmp_path)
    with pytest.raises(DeployError, match=r"nodes 1\.\.3, not 4"):
        local.stop_node(tmp_path, 4)
    assert local.status(tmp_path)["services"] == ["kafka-1", "kafka-2", "kafka-3", "redis"]


def test_node_commands_need_a_cluster(tmp_path: Path) -> None:
    with pytest.raises(DeployError, match="holds no cluster"):
        local.start_node(tmp_path, 1)


def test_cluster_env_tells_the_workers_to_replicate() -> None:
    env = ClusterServices(Path("/x"), ClusterConfig(nodes=3, kafka_port=20000, redis_port=21000)).env()
    assert env["COMBEE_KAFKA_BOOTSTRAP"].count(",") == 2
    assert (env["COMBEE_REPLICATION_FACTOR"], env["COMBEE_MIN_INSYNC_REPLICAS"]) == ("3", "2")


def test_cli_nodes_and_node() -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["up"]).nodes == 1
    assert parser.parse_args(["up", "--nodes", "3"]).nodes == 3
    args = parser.parse_args(["restart", "kafka", "--node", "2", "--kill"])
    assert (args.node, args.kill) == (2, True)


def test_a_first_single_broker_start_formats_without_a_jvm_for_the_cluster_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The id comes from new_cluster_id(): one StorageTool run (format), not two (random-uuid, then format)."""
    from deploy.local import service
    from deploy.local.config import StackConfig

    tool_runs: list[list[str]] = []
    monkeypatch.setattr(service, "fetch_kafka", lambda version: tmp_path / "lib")
    monkeypatch.setattr(service, "find_java", lambda: "java")
    monkeypatch.setattr(service, "require_free", lambda port, what: None)
    monkeypatch.setattr(service, "kafka_tool", lambda java, lib, args, log: tool_runs.append(args) or "")
    monkeypatch.setattr(service, "spawn", lambda *args, **kwargs: None)
    service._launch_kafka(tmp_path, StackConfig(kafka_port=20001, controller_port=20002))
    assert [args[0] for args in tool_runs] == ["format"]
    cluster_id = tool_runs[0][tool_runs[0].index("-t") + 1]
    assert len(cluster_id) == 22 and not cluster_id.startswith("-")
