"""Topics as a deployment step (issue 15, item 5): describing topics, the missing-topic error of the publisher,
the ``combee topics`` and ``combee dev up`` wiring and docker-compose's one-shot topics service. No Kafka here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from combee.cli import main
from combee.cli.dev import exported_env
from combee.cli.topics import format_states
from combee.errors import TopicMissing
from streams.kafka_config import create_topics_command, describe_topics, missing_topics, topic_states
from streams.publisher import TracePublisher
from streams.topics import Topics

REPO = Path(__file__).resolve().parents[2]


def _described(partitions: dict[str, int], replicas: int = 1) -> dict[str, dict[str, Any]]:
    return {
        name: {
            "name": name,
            "error_code": 0,
            "partitions": [{"partition_index": i, "replica_nodes": list(range(1, replicas + 1))} for i in range(count)],
        }
        for name, count in partitions.items()
    }


class _Admin:
    """Enough of KafkaAdminClient for describe: topics are {name: partitions}."""

    def __init__(self, topics: dict[str, int], replicas: int = 1) -> None:
        self.topics = topics
        self.replicas = replicas
        self.closed = False

    def __call__(self, **kwargs: Any) -> _Admin:
        return self

    def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        known = _described({n: c for n, c in self.topics.items() if n in names}, self.replicas)
        return [known.get(n, {"name": n, "error_code": 3, "partitions": []}) for n in names]

    def close(self) -> None:
        self.closed = True


def test_topic_states_put_each_spec_beside_what_the_cluster_has() -> None:
    topics = Topics(prefix="x", partitions=3)
    states = {s.spec.name: s for s in topic_states(topics.specs(), _described({"x.traces": 3, "x.deltas": 2}, 3))}
    assert states["x.traces"].exists and states["x.traces"].ok
    assert (states["x.traces"].partitions, states["x.traces"].replication_factor) == (3, 3)
    assert states["x.deltas"].exists and not states["x.deltas"].ok
    assert not states["x.windows"].exists and states["x.windows"].partitions is None
    assert len(states) == len(topics.specs())


def test_describe_topics_asks_once_and_closes_the_admin() -> None:
    admin = _Admin({"x.traces": 2}, replicas=3)
    states = describe_topics("k:9092", Topics(prefix="x", partitions=2), admin_factory=admin)
    assert admin.closed
    assert [s.spec.name for s in states if s.exists] == ["x.traces"]
    table = format_states(states)
    assert re.search(r"^x\.traces\s+2\s+3\s+ok\s+namespace", table, re.MULTILINE)
    assert re.search(r"^x\.windows\s+-\s+-\s+missing", table, re.MULTILINE)


def test_missing_topics_counts_only_the_brokers_unknown_topic() -> None:
    class Unauthorised(_Admin):
        def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
            return [{"name": n, "error_code": 29, "partitions": []} for n in names]

    assert missing_topics("k:9092", ["a", "b"], admin_factory=_Admin({"b": 1})) == ["a"]
    assert missing_topics("k:9092", ["a"], admin_factory=Unauthorised({})) == []


def test_the_create_command_names_only_what_differs_from_the_defaults() -> None:
    assert create_topics_command("h:9092", Topics()) == "combee topics create --bootstrap h:9092"
    assert (
        create_topics_command("a:1,b:2", Topics(prefix="p", partitions=8))
        == "combee topics create --bootstrap a:1,b:2 --prefix p --partitions 8"
    )


class _Producer:
    def __init__(self, **kwargs: Any) -> None:
        self.sent: list[tuple[str, bytes | None]] = []

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> Any:
        self.sent.append((topic, value))
        return None

    def flush(self, timeout: float | None = None) -> None:
        pass

    def close(self, timeout: float | None = None) -> None:
        pass


TRACE = {"namespace": "ns", "task": "t", "output": "o", "feedback": {"success": True}}


def test_a_publisher_whose_topic_is_missing_says_which_and_how_to_create_it_and_sends_nothing() -> None:
    producer = _Producer()
    existing: set[str] = set()
    checks: list[str] = []

    def exists(name: str) -> bool:
        checks.append(name)
        return name in existing

    pub = TracePublisher("h:9092", Topics(prefix="p"), producer_factory=lambda **kw: producer, topic_exists=exists)
    with pytest.raises(TopicMissing) as caught:
        pub.publish_many([TRACE, TRACE])
    assert caught.value.topic == "p.traces"
    assert str(caught.value) == (
        "Kafka topic p.traces does not exist; create it with: combee topics create --bootstrap h:9092 --prefix p"
    )
    assert producer.sent == []
    existing.add("p.traces")  # created meanwhile: the next publish goes through, and the check is not repeated
    pub.publish(TRACE)
    pub.publish(TRACE)
    assert len(producer.sent) == 2 and checks == ["p.traces", "p.traces"]


def test_an_injected_producer_alone_skips_the_topic_check() -> None:
    producer = _Producer()
    TracePublisher("h:9092", producer_factory=lambda **kw: producer).publish(TRACE)
    assert len(producer.sent) == 1


def test_dev_up_reads_the_services_from_the_export_lines() -> None:
    text = "export COMBEE_KAFKA_BOOTSTRAP=127.0.0.1:9092\nexport COMBEE_REDIS_URL='redis://:p w@h:1/0'\nnoise\n"
    assert exported_env(text) == {
        "COMBEE_KAFKA_BOOTSTRAP": "127.0.0.1:9092",
        "COMBEE_REDIS_URL": "redis://:p w@h:1/0",
    }


def test_dev_up_creates_the_topics_on_the_services_it_started(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from combee.cli import topics as topics_cli
    from deploy import local
    from streams.kafka_config import TopicsReport

    def up(argv: list[str]) -> int:
        print("export COMBEE_KAFKA_BOOTSTRAP=127.0.0.1:29092\nexport COMBEE_REPLICATION_FACTOR=3")
        return 0

    seen: list[Any] = []

    def create(settings: Any, **kwargs: Any) -> TopicsReport:
        seen.append(settings)
        return TopicsReport(created=("combee.traces",), existing=())

    monkeypatch.setattr(local, "main", up)
    monkeypatch.setattr(topics_cli, "create_topics", create)
    assert main(["dev", "up"]) == 0
    out, err = capsys.readouterr()
    assert out == "export COMBEE_KAFKA_BOOTSTRAP=127.0.0.1:29092\nexport COMBEE_REPLICATION_FACTOR=3\n"
    assert "topics under prefix combee: 1 created, 0 already there" in err
    assert seen[0].kafka_bootstrap == "127.0.0.1:29092" and seen[0].replication_factor == 3

    def refuse(settings: Any, **kwargs: Any) -> TopicsReport:
        raise RuntimeError("broker says no")

    monkeypatch.setattr(topics_cli, "create_topics", refuse)
    assert main(["dev", "up"]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "creating the topics failed: RuntimeError: broker says no" in err
    seen.clear()
    monkeypatch.setattr(topics_cli, "create_topics", create)
    assert main(["dev", "up", "--no-topics"]) == 0 and seen == []


def test_topics_options_default_to_the_workers_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from combee.cli import topics as topics_cli
    from combee.cli.main import build_parser

    monkeypatch.setenv("COMBEE_PARTITIONS", "6")
    args = build_parser().parse_args(["topics", "create", "--replication-factor", "3", "--prefix", "q"])
    settings = topics_cli.settings_for(args)
    assert (settings.partitions, settings.replication_factor, settings.topic_prefix) == (6, 3, "q")
    args = build_parser().parse_args(["topics", "describe", "--partitions", "2"])
    assert topics_cli.settings_for(args).partitions == 2


def test_compose_creates_the_topics_once_before_the_workers_start() -> None:
    compose = (REPO / "docker-compose.yml").read_text()
    init = re.search(r"^  topics-init:\n((?:    .*\n|\s*\n)*)", compose, re.MULTILINE)
    assert init is not None
    assert 'command: ["combee", "topics", "create"]' in init.group(1)
    worker = re.search(r"^  combee-worker:\n((?:    .*\n|\s*\n)*)", compose, re.MULTILINE)
    assert worker is not None
    assert re.search(r"topics-init:\n\s+condition: service_completed_successfully", worker.group(1))
