"""The wire's settings sections: Kafka, topics and Redis. ``combee.settings.Settings`` is composed of them.

Each section reads the same ``COMBEE_<FIELD>`` environment variables as the whole settings object, so a
module of ``streams/`` asks for the section it needs (``KafkaSettings``, ``TopicSettings``, ``RedisSettings``, or
``StreamSettings`` for all three) and any ``Settings`` object passes, without ``streams/`` importing the method,
the LLM roles or the workers' fields. One way to build each wire object from settings: ``settings.topics()``,
``settings.redis_options()`` (and ``RedisPromptStore.from_settings``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from streams.redis_connection import RedisOptions

if TYPE_CHECKING:
    from streams.topics import Topics

__all__ = ["KafkaSettings", "RedisSettings", "StreamSettings", "TopicSettings"]

_CONFIG = SettingsConfigDict(env_prefix="COMBEE_", extra="ignore", case_sensitive=False)


class KafkaSettings(BaseSettings):
    """Where the brokers are, how a client authenticates, and how workers consume and commit."""

    model_config = _CONFIG

    kafka_bootstrap: str = "127.0.0.1:9092"
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: Path | None = None
    kafka_ssl_certfile: Path | None = None
    kafka_ssl_keyfile: Path | None = None
    # Copies of every topic Combee creates (its own and Faust's), and how many must have a write before the
    # broker acknowledges it (producers use acks=all). 1 suits a single broker; on a cluster of 3, 3 and 2
    # survive the loss of any one broker with nothing lost. None leaves min.insync.replicas to the broker.
    replication_factor: int = Field(default=1, ge=1)
    min_insync_replicas: int | None = Field(default=None, ge=1)
    # How fast a dead worker's partitions move to a live one (Kafka's group session timeout).
    kafka_session_timeout_s: float = Field(default=10.0, ge=6.0)
    # How often (seconds) and after how many acked records a worker commits its consumed offsets. A crash
    # re-delivers whatever was not committed yet; the pipeline's exactly-once effect does not depend on it.
    kafka_commit_interval_s: float = Field(default=1.0, gt=0)
    kafka_commit_every: int = Field(default=200, ge=1)
    # How long a starting worker waits for the broker to answer its first requests (creating missing topics)
    # before it gives up with one line. A broker that does not listen at all fails at once; this bounds the
    # case where it listens but does not answer (still starting, or refusing a SASL/TLS handshake).
    kafka_startup_timeout_s: float = Field(default=30.0, gt=0)
    # The HMAC-SHA256 key of control records (rollback): the CLI signs with it, workers that have it apply only
    # records signed with it (others are dead-lettered and counted). Unset: workers accept unsigned control records.
    control_key: SecretStr | None = None
    # An agent's identity (combee/identity.py): with both set, TracePublisher signs every trace it sends as this
    # producer with this key (HMAC-SHA256); the workers verify it with the same key (COMBEE_PRODUCER_KEYS_FILE).
    producer_id: str | None = None
    producer_key: SecretStr | None = None


class TopicSettings(BaseSettings):
    """Combee's topics: their prefix, partition count and the traces topic's retention."""

    model_config = _CONFIG

    topic_prefix: str = "combee"
    partitions: int = Field(default=4, ge=1)
    # How long the traces topic keeps a trace (its retention.ms when the topic is created): -1 keeps them forever
    # (replay can relearn from the first trace); a bound is how long a trace, personal data included, survives.
    traces_retention_ms: int = Field(default=-1, ge=-1)

    def topics(self) -> Topics:
        """Combee's topics under these settings (the one way settings become :class:`Topics`)."""
        from streams.topics import Topics  # aiokafka's partitioner: not loaded by agents that only read Redis

        return Topics(
            prefix=self.topic_prefix, partitions=self.partitions, traces_retention_ms=self.traces_retention_ms
        )


class RedisSettings(BaseSettings):
    """The Redis that holds the published prompts, and its key prefix."""

    model_config = _CONFIG

    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_username: str | None = None
    redis_password: SecretStr | None = None
    redis_ssl_ca_certs: Path | None = None
    key_prefix: str = "combee"

    def redis_options(self) -> RedisOptions:
        """Where and how to connect (the one way settings become :class:`RedisOptions`)."""
        return RedisOptions(
            url=self.redis_url,
            username=self.redis_username,
            password=self.redis_password,
            ssl_ca_certs=self.redis_ssl_ca_certs,
            key_prefix=self.key_prefix,
        )


class StreamSettings(KafkaSettings, TopicSettings, RedisSettings):
    """All three wire sections: what a command needs that reads topics and Redis together (status, replay)."""

    model_config = _CONFIG
