"""Kafka option mapping (kafka-python and aiokafka spellings) and ensure_topics against a fake admin client."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from combee.errors import ConfigError
from combee.settings import Settings
from streams.kafka_config import aiokafka_security_kwargs, ensure_topics, kafka_security_kwargs
from streams.topics import Topics


def test_plaintext_is_the_default() -> None:
    assert kafka_security_kwargs(Settings()) == {"security_protocol": "PLAINTEXT"}
    assert aiokafka_security_kwargs(Settings()) == {"security_protocol": "PLAINTEXT"}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_maps_to_both_spellings(mechanism: Any) -> None:
    settings = Settings(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism=mechanism,
        kafka_sasl_username="agent",
        kafka_sasl_password=SecretStr("pw"),
    )
    expected = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "agent",
        "sasl_plain_password": "pw",
    }
    assert kafka_security_kwargs(settings) == expected
    assert aiokafka_security_kwargs(settings) == expected


def test_sasl_ssl_with_a_ca_file(tmp_path: Path) -> None:
    ca = Path("/etc/ssl/certs/ca-certificates.crt")
    if not ca.is_file():
        pytest.skip("no system CA bundle to stand in for a CA file")
    settings = Settings(
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="agent",
        kafka_sasl_password=SecretStr("pw"),
        kafka_ssl_cafile=ca,
    )
    kp = kafka_security_kwargs(settings)
    assert kp["ssl_cafile"] == str(ca) and kp["ssl_check_hostname"] is True
    assert "ssl_certfile" not in kp
    ak = aiokafka_security_kwargs(settings)
    assert isinstance(ak["ssl_context"], ssl.SSLContext)
    assert ak["ssl_context"].check_hostname and ak["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    assert "ssl_cafile" not in ak


def test_mutual_tls_client_certificate(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a throwaway certificate")
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=combee-test",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    settings = Settings(
        kafka_security_protocol="SSL", kafka_ssl_cafile=cert, kafka_ssl_certfile=cert, kafka_ssl_keyfile=key
    )
    kp = kafka_security_kwargs(settings)
    assert (kp["ssl_certfile"], kp["ssl_keyfile"]) == (str(cert), str(key))
    assert isinstance(aiokafka_security_kwargs(settings)["ssl_context"], ssl.SSLContext)
    bad = Settings(kafka_security_protocol="SSL", kafka_ssl_certfile=key, kafka_ssl_keyfile=key)
    with pytest.raises(ConfigError, match="certificate"):
        aiokafka_security_kwargs(bad)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kafka_security_protocol": "SASL_SSL"}, "needs COMBEE_KAFKA_SASL_MECHANISM"),
        (
            {"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "PLAIN", "kafka_sasl_username": "u"},
            "COMBEE_KAFKA_SASL_PASSWORD",
        ),
        ({"kafka_sasl_mechanism": "PLAIN"}, "SASL settings are given"),
        ({"kafka_ssl_cafile": Path("/etc/hostname")}, "use SSL or SASL_SSL"),
        ({"kafka_security_protocol": "SSL", "kafka_ssl_keyfile": Path("/etc/hostname")}, "needs COMBEE_KAFKA_SSL_CERT"),
        ({"kafka_security_protocol": "SSL", "kafka_ssl_cafile": Path("/nonexistent/ca.pem")}, "not a readable file"),
    ],
)
def test_contradictory_settings_are_config_errors(fields: dict[str, Any], message: str) -> None:
    settings = Settings(**fields)
    with pytest.raises(ConfigError, match=message):
        kafka_security_kwargs(settings)
    with pytest.raises(ConfigError, match=message):
        aiokafka_security_kwargs(settings)


# ----------------------------------------------------------------------------------------------------------
# ensure_topics
# ----------------------------------------------------------------------------------------------------------


@dataclass
class FakeAdmin:
    """Enough of KafkaAdminClient: topics are {name: partitions}; ``race`` topics appear during create."""

    topics: dict[str, int] = field(default_factory=dict)
    configs: dict[str, dict[str, str]] = field(default_factory=dict)
    race: dict[str, int] = field(default_factory=dict)
    refuse: set[str] = field(default_factory=set)
    created: list[dict[str, Any]] = field(default_factory=list)
    init: dict[str, Any] = field(default_factory=dict)
    closed: bool = False

    def __call__(self, **kwargs: Any) -> FakeAdmin:
        self.init = kwargs
        return self

    def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        out = []
        for name in names:
            if name in self.topics:
                parts = [{"partition_index": i, "leader_id": 1, "error_code": 0} for i in range(self.topics[name])]
                out.append({"name": name, "error_code": 0, "partitions": parts})
            else:
                out.append({"name": name, "error_code": 3, "partitions": []})
        return out

    def create_topics(self, new: dict[str, dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        assert kwargs.get("raise_errors") is False
        results = []
        for name, spec in new.items():
            if name in self.refuse:
                results.append({"name": name, "error_code": 38, "error_message": "Replication factor: 3 larger"})
            elif name in self.race:
                self.topics[name] = self.race[name]
                results.append({"name": name, "error_code": 36, "error_message": "already exists"})
            else:
                self.created.append({"name": name, **spec})
                self.topics[name] = spec["num_partitions"]
                self.configs[name] = dict(spec["configs"])
                results.append({"name": name, "error_code": 0, "error_message": None})
        return {"topics": results}

    def wait_for_topics(self, names: list[str], timeout_ms: int) -> None:
        assert all(n in self.topics for n in names)

    def describe_configs(self, resources: list[Any], config_filter: str = "modified") -> dict[str, Any]:
        return {
            "topic": {r.name: {k: {"value": v} for k, v in self.configs.get(r.name, {}).items()} for r in resources}
        }

    def close(self) -> None:
        self.closed = True


def test_creates_every_missing_topic_with_its_spec() -> None:
    topics = Topics(prefix="x", partitions=3)
    admin = FakeAdmin()
    report = ensure_topics("k:9092", topics, admin_factory=admin, replication_factor=1)
    assert set(report.created) == {s.name for s in topics.specs()} and report.existing == ()
    by_name = {c["name"]: c for c in admin.created}
    assert by_name["x.playbooks"]["configs"]["cleanup.policy"] == "compact"
    assert by_name["x.traces"]["num_partitions"] == 3 and by_name["x.deadletter"]["num_partitions"] == 1
    assert all(c["replication_factor"] == 1 for c in admin.created)
    assert admin.closed and admin.init["bootstrap_servers"] == "k:9092"


def test_is_idempotent_and_reports_config_drift() -> None:
    topics = Topics(prefix="x", partitions=2)
    admin = FakeAdmin()
    ensure_topics("k:9092", topics, admin_factory=admin)
    admin.configs["x.playbooks"]["cleanup.policy"] = "delete"
    again = ensure_topics("k:9092", topics, admin_factory=admin)
    assert again.created == () and set(again.existing) == {s.name for s in topics.specs()}
    assert again.config_drift == {"x.playbooks": {"cleanup.policy": ("delete", "compact")}}


def test_a_topic_created_concurrently_counts_as_existing() -> None:
    topics = Topics(prefix="x", partitions=2)
    admin = FakeAdmin(race={"x.traces": 2})
    report = ensure_topics("k:9092", topics, admin_factory=admin)
    assert "x.traces" not in report.created and "x.traces" in report.existing


def test_a_wrong_partition_count_is_a_config_error_naming_the_topic() -> None:
    topics = Topics(prefix="x", partitions=4)
    admin = FakeAdmin(topics={"x.traces": 2})
    with pytest.raises(ConfigError, match=r"x\.traces has 2 partitions, expected 4"):
        ensure_topics("k:9092", topics, admin_factory=admin)
    assert admin.closed


def test_a_racing_topic_with_the_wrong_partition_count_is_caught_too() -> None:
    admin = FakeAdmin(race={"x.partials": 1})
    with pytest.raises(ConfigError, match=r"x\.partials has 1 partitions"):
        ensure_topics("k:9092", Topics(prefix="x", partitions=4), admin_factory=admin)


def test_a_refused_creation_is_a_config_error_with_the_brokers_reason() -> None:
    admin = FakeAdmin(refuse={"x.groups"})
    with pytest.raises(ConfigError, match=r"x\.groups.*Replication factor"):
        ensure_topics("k:9092", Topics(prefix="x"), admin_factory=admin, replication_factor=3)


def test_settings_security_reaches_the_admin_client() -> None:
    admin = FakeAdmin()
    settings = Settings(
        kafka_bootstrap="b:9093",
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="PLAIN",
        kafka_sasl_username="u",
        kafka_sasl_password=SecretStr("pw"),
    )
    ensure_topics(settings, Topics(prefix="x"), admin_factory=admin)
    assert admin.init["security_protocol"] == "SASL_PLAINTEXT" and admin.init["sasl_plain_password"] == "pw"
    assert admin.init["bootstrap_servers"] == "b:9093"


@dataclass
class LaggingMetadata(FakeAdmin):
    """A cluster whose brokers learn of a new topic a few describes after the controller created it."""

    lag: int = 2
    unseen: dict[str, int] = field(default_factory=dict)

    def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        out = super().describe_topics(names)
        for item in out:
            if self.unseen.get(item["name"], 0) > 0:
                self.unseen[item["name"]] -= 1
                item.update(error_code=3, partitions=[])
        return out

    def create_topics(self, new: dict[str, dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        self.unseen.update(dict.fromkeys(new, self.lag))
        return super().create_topics(new, **kwargs)


def test_topics_created_on_a_cluster_are_waited_for_until_every_broker_describes_them() -> None:
    topics = Topics(prefix="x", partitions=2)
    admin = LaggingMetadata()
    report = ensure_topics("k:9092", topics, admin_factory=admin, timeout_s=5)
    assert set(report.created) == {s.name for s in topics.specs()}


def test_a_created_topic_that_never_shows_up_is_still_an_error_after_the_timeout() -> None:
    topics = Topics(prefix="x", partitions=2)
    admin = LaggingMetadata(lag=10**6)
    with pytest.raises(ConfigError, match="still missing after creation"):
        ensure_topics("k:9092", topics, admin_factory=admin, timeout_s=1)
