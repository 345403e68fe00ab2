"""COMBEE_REPLICATION_FACTOR / COMBEE_MIN_INSYNC_REPLICAS: what ensure_topics asks the broker for."""

from __future__ import annotations

from typing import Any

import pytest

from combee.errors import ConfigError
from combee.settings import Settings
from streams.kafka_config import ensure_topics
from streams.topics import Topics


class _Admin:
    def __init__(self) -> None:
        self.created: dict[str, dict[str, Any]] = {}

    def __call__(self, **kwargs: Any) -> _Admin:
        return self

    def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        return [
            {"name": n, "error_code": 0, "partitions": [{}] * self.created[n]["num_partitions"]}
            if n in self.created
            else {"name": n, "error_code": 3, "partitions": []}
            for n in names
        ]

    def create_topics(self, new: dict[str, dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        self.created.update(new)
        return {"topics": [{"name": n, "error_code": 0} for n in new]}

    def wait_for_topics(self, names: list[str], timeout_ms: int) -> None:
        pass

    def describe_configs(self, resources: list[Any], config_filter: str = "modified") -> dict[str, Any]:
        return {"topic": {}}

    def close(self) -> None:
        pass


def test_settings_choose_the_replication_of_created_topics() -> None:
    admin = _Admin()
    ensure_topics(Settings(replication_factor=3, min_insync_replicas=2), Topics(prefix="r"), admin_factory=admin)
    assert {c["replication_factor"] for c in admin.created.values()} == {3}
    assert {c["configs"]["min.insync.replicas"] for c in admin.created.values()} == {"2"}


def test_by_default_one_replica_and_the_brokers_min_insync() -> None:
    for kafka in (Settings(), "k:9092"):
        admin = _Admin()
        ensure_topics(kafka, Topics(prefix="r"), admin_factory=admin)
        assert {c["replication_factor"] for c in admin.created.values()} == {1}
        assert not any("min.insync.replicas" in c["configs"] for c in admin.created.values())


def test_more_insync_replicas_than_replicas_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="min_insync_replicas=3"):
        ensure_topics(Settings(replication_factor=2, min_insync_replicas=3), Topics(prefix="r"), admin_factory=_Admin())
