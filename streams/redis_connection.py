"""Redis connections: options from :class:`~streams.settings.RedisSettings`, the asyncio and blocking clients, and
keeping secrets out of what this package says.

:func:`build_redis` / :func:`build_sync_redis` make clients with TLS, credentials, timeouts and health checks.
:func:`describe_error` is an exception's message with secrets masked (the rules are :mod:`combee.redaction`);
:func:`is_retryable` tells a passing failure (Redis down, loading, read-only, ...) from a lasting one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.exceptions
import redis.retry
from pydantic import SecretStr
from redis.backoff import ExponentialWithJitterBackoff

from combee.errors import ConfigError
from combee.redaction import URL_CREDENTIALS, redact, redact_url, url_secrets

__all__ = [
    "RedisOptions",
    "RedisSource",
    "build_redis",
    "build_sync_redis",
    "client_secrets",
    "describe_error",
    "is_retryable",
]

# ---------------------------------------------------------------------------------------------------------
# Redaction and error classes
# ---------------------------------------------------------------------------------------------------------


def describe_error(exc: BaseException, secrets: Iterable[str | None] = ()) -> str:
    return redact(f"{type(exc).__name__}: {exc}", secrets)


_RETRYABLE_REPLY_PREFIXES: Final = ("BUSY", "LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "OOM")


def is_retryable(exc: BaseException) -> bool:
    """True for failures that go away by themselves: Redis unreachable, timing out, loading, read-only replica,
    busy with a script, out of memory. False for everything else (bad arguments, a broken script, a bug)."""
    if isinstance(
        exc,
        redis.exceptions.ConnectionError  # includes BusyLoadingError, AuthenticationError, MaxConnectionsError
        | redis.exceptions.TimeoutError
        | redis.exceptions.ReadOnlyError
        | redis.exceptions.OutOfMemoryError
        | OSError,  # includes the builtin ConnectionError and TimeoutError (= asyncio.TimeoutError on 3.11)
    ):
        return True
    if isinstance(exc, redis.exceptions.ResponseError):
        return str(exc).startswith(_RETRYABLE_REPLY_PREFIXES)
    return False


# ---------------------------------------------------------------------------------------------------------
# Connections
# ---------------------------------------------------------------------------------------------------------


class RedisSource(Protocol):
    """What can say where Redis is: :class:`streams.settings.RedisSettings` (so combee's Settings) is one."""

    def redis_options(self) -> RedisOptions: ...


@dataclass(frozen=True, repr=False)
class RedisOptions:
    """Where and how to connect: the fields of :class:`~streams.settings.RedisSettings` (``settings.redis_options()``).

    ``url`` is ``redis://``, ``rediss://`` (TLS) or ``unix://``. Credentials may be in the URL *or* in
    ``username``/``password``, not both. ``ssl_ca_certs`` turns TLS on (and verifies the server against that CA).
    ``repr()`` never shows the password.
    """

    url: str = "redis://127.0.0.1:6379/0"
    username: str | None = None
    password: SecretStr | None = None
    ssl_ca_certs: Path | None = None
    key_prefix: str = "combee"

    @classmethod
    def coerce(cls, source: RedisSource | RedisOptions | str) -> RedisOptions:
        """Accept a URL, settings (anything with ``redis_options()``: :class:`~streams.settings.RedisSettings`) or
        RedisOptions."""
        if isinstance(source, RedisOptions):
            return source
        if isinstance(source, str):
            return cls(url=source)
        return source.redis_options()

    def __repr__(self) -> str:
        return (
            f"RedisOptions(url={self.safe_url!r}, username={self.username!r}, "
            f"password={'***' if self.password is not None else None}, ssl_ca_certs={self.ssl_ca_certs!r}, "
            f"key_prefix={self.key_prefix!r})"
        )

    @property
    def safe_url(self) -> str:
        """The URL with any password masked: fit for logs and messages."""
        return redact_url(self.url)

    def secrets(self) -> tuple[str, ...]:
        """Every secret these options carry (for redaction): the password field and a password in the URL."""
        out: list[str] = []
        if self.password is not None and self.password.get_secret_value():
            out.append(self.password.get_secret_value())
        out.extend(url_secrets(self.url))
        return tuple(out)

    def client_kwargs(
        self,
        *,
        socket_timeout_s: float,
        connect_timeout_s: float,
        health_check_interval_s: int,
        client_name: str,
    ) -> tuple[str, dict[str, Any]]:
        """``(url, kwargs)`` for ``Redis.from_url``; raises ConfigError (with a redacted message) when the
        options contradict each other."""
        url = self.url
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        if scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(f"Redis URL {self.safe_url!r} must start with redis://, rediss:// or unix://")
        tls = scheme == "rediss" or self.ssl_ca_certs is not None
        if tls and scheme == "unix":
            raise ConfigError("a Redis CA certificate (TLS) was given for a unix:// socket URL")
        if tls and scheme == "redis":
            url = "rediss://" + url.split("://", 1)[1]  # a CA means TLS; redis-py picks TLS from the scheme
        m = URL_CREDENTIALS.search(url)
        url_has_password = bool(m and ":" in m.group("creds"))
        if url_has_password and self.password is not None:
            raise ConfigError(
                "the Redis password is given twice (in COMBEE_REDIS_URL and in COMBEE_REDIS_PASSWORD); keep one"
            )
        kwargs: dict[str, Any] = {
            "socket_timeout": socket_timeout_s,
            "socket_connect_timeout": connect_timeout_s,
            "socket_keepalive": True,
            "health_check_interval": health_check_interval_s,
            "decode_responses": True,
            "client_name": client_name,
            # RESP2 on purpose: works with every Redis >= 2.6 and Redis-compatible server, and the replies this
            # module parses (EVAL arrays, HMGET, ZRANGE) are the same shape either way.
            "protocol": 2,
        }
        if self.username is not None:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password.get_secret_value()
        if tls:
            kwargs["ssl_cert_reqs"] = "required"
            if self.ssl_ca_certs is not None:
                if not self.ssl_ca_certs.is_file():
                    raise ConfigError(f"Redis CA certificate file {str(self.ssl_ca_certs)!r} does not exist")
                kwargs["ssl_ca_certs"] = str(self.ssl_ca_certs)
        return url, kwargs


def build_redis(
    settings: RedisSource | RedisOptions | str,
    *,
    socket_timeout_s: float = 5.0,
    connect_timeout_s: float = 2.0,
    retries: int = 2,
    health_check_interval_s: int = 30,
    client_name: str = "combee",
) -> redis.asyncio.Redis:
    """An asyncio Redis client for the learner side (the store, the publisher).

    Strings come back decoded (``decode_responses=True``). A command that fails with a connection error or
    timeout is retried ``retries`` times (jittered exponential backoff, 50 ms to 1 s) before it raises; a
    connection idle for ``health_check_interval_s`` is PINGed before reuse. Nothing connects until the first
    command. Raises ConfigError for an unusable URL/TLS/credential combination; the message never holds a secret.
    """
    options = RedisOptions.coerce(settings)
    url, kwargs = options.client_kwargs(
        socket_timeout_s=socket_timeout_s,
        connect_timeout_s=connect_timeout_s,
        health_check_interval_s=health_check_interval_s,
        client_name=client_name,
    )
    kwargs["retry"] = redis.asyncio.retry.Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), retries)
    try:
        return redis.asyncio.Redis.from_url(url, **kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"bad Redis URL {options.safe_url!r}: {redact(str(exc), options.secrets())}") from None


def build_sync_redis(
    settings: RedisSource | RedisOptions | str,
    *,
    socket_timeout_s: float = 5.0,
    connect_timeout_s: float = 2.0,
    retries: int = 2,
    health_check_interval_s: int = 30,
    client_name: str = "combee",
) -> redis.Redis:
    """The blocking twin of :func:`build_redis` (same options, same guarantees) for agents and tools."""
    options = RedisOptions.coerce(settings)
    url, kwargs = options.client_kwargs(
        socket_timeout_s=socket_timeout_s,
        connect_timeout_s=connect_timeout_s,
        health_check_interval_s=health_check_interval_s,
        client_name=client_name,
    )
    kwargs["retry"] = redis.retry.Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), retries)
    try:
        return redis.Redis.from_url(url, **kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"bad Redis URL {options.safe_url!r}: {redact(str(exc), options.secrets())}") from None


def client_secrets(client: Any) -> tuple[str, ...]:
    """The password a redis-py client authenticates with, if any (to keep it out of messages)."""
    pool = getattr(client, "connection_pool", None)
    conn_kwargs = getattr(pool, "connection_kwargs", None) or {}
    password = conn_kwargs.get("password")
    return (password,) if isinstance(password, str) and password else ()
