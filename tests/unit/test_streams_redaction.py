"""Secrets never appear in a repr, an exception message or a log line produced by streams/."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import pytest
import redis.exceptions
from pydantic import SecretStr

from combee.errors import ConfigError
from combee.redaction import redact
from combee.settings import Settings
from streams.client import AsyncPromptClient, PromptClient, PromptUnavailable
from streams.kafka_config import MaskedSecret, aiokafka_security_kwargs, kafka_security_kwargs
from streams.keys import RedisKeys
from streams.publisher import TracePublisher
from streams.redis_connection import (
    RedisOptions,
    build_redis,
    build_sync_redis,
)
from streams.redis_publisher import LatestVersionPublisher
from streams.redis_store import RedisPromptStore

SECRET = "s3cr3t-Pa55w0rd"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_redact_masks_given_secrets_and_url_passwords() -> None:
    text = f"failed: redis://alice:{SECRET}@db:6379/0 and rediss://:{SECRET}@x and plain {SECRET}"
    out = redact(text, [SECRET])
    assert SECRET not in out
    assert "redis://alice:***@db:6379/0" in out
    out_no_list = redact(f"redis://alice:{SECRET}@db:6379/0", [])
    assert SECRET not in out_no_list and "alice" in out_no_list


def test_redact_leaves_urls_without_credentials_alone() -> None:
    assert redact("redis://db:6379/0 is down", []) == "redis://db:6379/0 is down"


def test_redis_options_repr_and_safe_url_hide_passwords() -> None:
    options = RedisOptions(url=f"redis://bob:{SECRET}@db:6379/0")
    assert SECRET not in repr(options) and SECRET not in options.safe_url
    assert SECRET in options.secrets()
    with_field = RedisOptions(url="redis://db:6379/0", password=SecretStr(SECRET))
    assert SECRET not in repr(with_field)
    assert with_field.secrets() == (SECRET,)


def test_built_clients_do_not_show_the_password() -> None:
    options = RedisOptions(url="redis://127.0.0.1:6379/0", username="bob", password=SecretStr(SECRET))
    for client in (build_redis(options), build_sync_redis(options)):
        assert SECRET not in repr(client)
        assert SECRET not in str(client.connection_pool)


def test_password_given_twice_is_a_config_error_without_the_secret() -> None:
    options = RedisOptions(url=f"redis://:{SECRET}@db:6379/0", password=SecretStr("other-" + SECRET))
    with pytest.raises(ConfigError) as info:
        build_redis(options)
    assert SECRET not in str(info.value)


def test_bad_scheme_is_a_config_error_without_the_secret() -> None:
    with pytest.raises(ConfigError) as info:
        build_sync_redis(f"http://u:{SECRET}@db:6379")
    assert SECRET not in str(info.value) and "http://u:***@db:6379" in str(info.value)


def test_a_ca_certificate_turns_tls_on(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not really a certificate; only the path is checked here\n")
    client = build_sync_redis(RedisOptions(url="redis://db:6380/0", ssl_ca_certs=ca))
    kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class.__name__ == "SSLConnection"
    assert kwargs["ssl_ca_certs"] == str(ca) and kwargs["ssl_cert_reqs"] == "required"
    with pytest.raises(ConfigError, match="does not exist"):
        build_sync_redis(RedisOptions(url="redis://db:6380/0", ssl_ca_certs=tmp_path / "missing.pem"))


async def test_store_errors_from_an_unreachable_redis_carry_no_secret() -> None:
    client = build_redis(
        RedisOptions(url=f"redis://127.0.0.1:{closed_port()}/0", password=SecretStr(SECRET)), retries=0
    )
    store = RedisPromptStore(client, RedisKeys(prefix="t"))
    with pytest.raises(redis.exceptions.ConnectionError) as info:
        await store.current("ns")
    assert SECRET not in str(info.value)
    await client.aclose()


def test_prompt_unavailable_carries_no_secret() -> None:
    url = f"redis://agent:{SECRET}@127.0.0.1:{closed_port()}/0"
    with PromptClient(url, "ns") as client, pytest.raises(PromptUnavailable) as info:
        client.get()
    assert SECRET not in str(info.value) and SECRET not in repr(client)


async def test_async_prompt_unavailable_carries_no_secret() -> None:
    client = AsyncPromptClient(RedisOptions(f"redis://127.0.0.1:{closed_port()}/0", password=SecretStr(SECRET)), "ns")
    with pytest.raises(PromptUnavailable) as info:
        await client.get()
    assert SECRET not in str(info.value)
    await client.aclose()


class _LeakyStore:
    async def publish(self, *args: Any, **kwargs: Any) -> bool:
        raise redis.exceptions.ConnectionError(f"cannot reach redis://svc:{SECRET}@redis:6379/0")


async def test_latest_version_publisher_redacts_last_error_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    sleeps: list[float] = []

    async def fake_sleep(delay: float) -> None:
        sleeps.append(delay)
        if len(sleeps) >= 2:
            raise _StopLoop

    publisher = LatestVersionPublisher(_LeakyStore(), sleep=fake_sleep, secrets=[SECRET])
    publisher.offer("ns", 1, "prompt", "{}")
    with caplog.at_level(logging.DEBUG), pytest.raises(_StopLoop):
        await publisher.run()
    assert publisher.last_error is not None and SECRET not in publisher.last_error
    assert "redis://svc:***@redis:6379/0" in publisher.last_error
    assert SECRET not in caplog.text


class _StopLoop(Exception):
    pass


def _sasl_settings(**extra: Any) -> Settings:
    return Settings(
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="agent",
        kafka_sasl_password=SecretStr(SECRET),
        **extra,
    )


def test_kafka_kwargs_hold_the_password_but_never_print_it(caplog: pytest.LogCaptureFixture) -> None:
    kwargs = kafka_security_kwargs(_sasl_settings())
    assert kwargs["sasl_plain_password"] == SECRET  # the client library gets the real value
    assert isinstance(kwargs["sasl_plain_password"], MaskedSecret)
    assert SECRET not in repr(kwargs) and SECRET not in str(kwargs)
    logging.getLogger("test").warning("config: %s / %r", kwargs, dict(**kwargs))
    assert SECRET not in caplog.text
    assert SECRET not in repr(aiokafka_security_kwargs(_sasl_settings()))


def test_trace_publisher_repr_and_producer_kwargs_hide_the_password() -> None:
    seen: dict[str, Any] = {}

    def factory(**kwargs: Any) -> Any:
        seen.update(kwargs)
        return object()

    publisher = TracePublisher(_sasl_settings(), producer_factory=factory)
    assert seen["sasl_plain_password"] == SECRET and SECRET not in repr(seen)
    assert SECRET not in repr(publisher)
