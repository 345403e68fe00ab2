"""The rights table of :mod:`streams.acls` against the topics the workers really use, and its printed commands."""

from __future__ import annotations

import pytest

from combee.cli.main import main
from streams.acls import Grant, Role, grants, kafka_acls_commands
from streams.topics import Topics


def _allows(table: tuple[Grant, ...], resource: str, name: str, op: str) -> bool:
    return any(
        g.resource == resource and op in g.operations and (name.startswith(g.name) if g.prefixed else name == g.name)
        for g in table
    )


def test_a_producer_may_write_the_traces_topic_and_nothing_else() -> None:
    topics = Topics(prefix="acme", partitions=4)
    table = grants(Role.PRODUCER, "acme")
    assert _allows(table, "topic", topics.traces, "Write")
    for spec in topics.specs():
        if spec.name != topics.traces:
            assert not _allows(table, "topic", spec.name, "Write"), spec.name
            assert not _allows(table, "topic", spec.name, "Read"), spec.name
    assert not _allows(table, "group", "acme-worker", "Read")


def test_a_worker_may_create_read_and_write_every_topic_of_its_prefix_and_join_its_groups() -> None:
    topics = Topics(prefix="acme", partitions=4)
    table = grants(Role.WORKER, "acme")
    names = [s.name for s in topics.specs()] + ["acme-worker-__assignor-__leader"]
    for name in names:
        for op in ("Read", "Write", "Describe", "Create"):
            assert _allows(table, "topic", name, op), (name, op)
    assert _allows(table, "group", "acme-worker", "Read")
    # another deployment's topics are not this worker's
    assert not _allows(table, "topic", "other.partials", "Write")
    assert not _allows(table, "topic", "acmex.partials", "Write")


def test_an_operator_may_send_control_records_but_not_write_plans_or_deltas() -> None:
    topics = Topics(prefix="acme", partitions=4)
    table = grants(Role.OPERATOR, "acme")
    assert _allows(table, "topic", topics.partials, "Write")
    assert _allows(table, "topic", topics.windows, "Write")  # replay
    for name in (topics.deltas, topics.playbooks, topics.groups, topics.reflections):
        assert not _allows(table, "topic", name, "Write"), name


def test_the_printed_commands_name_the_principal_and_each_grant() -> None:
    lines = kafka_acls_commands(Role.PRODUCER, "acme", "User:agent", "kafka:9092")
    assert lines == [
        "kafka-acls.sh --bootstrap-server kafka:9092 --add --allow-principal User:agent --topic 'acme.traces' "
        "--operation Write --operation Describe"
    ]
    worker = kafka_acls_commands(Role.WORKER, "acme", "User:w")
    assert len(worker) == len(grants(Role.WORKER, "acme"))
    assert all("--resource-pattern-type prefixed" in line for line in worker)


def test_combee_topics_acls_prints_them(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMBEE_TOPIC_PREFIX", "acme")
    assert main(["topics", "acls", "producer", "--principal", "User:agent"]) == 0
    assert capsys.readouterr().out.splitlines() == kafka_acls_commands(Role.PRODUCER, "acme", "User:agent")


def test_a_feedback_source_may_write_the_feedback_topic_and_nothing_else() -> None:
    topics = Topics(prefix="acme", partitions=4)
    table = grants(Role.FEEDBACK, "acme")
    assert _allows(table, "topic", topics.feedback, "Write")
    for spec in topics.specs():
        if spec.name != topics.feedback:
            assert not _allows(table, "topic", spec.name, "Write"), spec.name
            assert not _allows(table, "topic", spec.name, "Read"), spec.name
    # and an agent's producer principal cannot write feedback (the loop above for producers covers every topic)
    assert not _allows(grants(Role.PRODUCER, "acme"), "topic", topics.feedback, "Write")
