"""``combee worker``: build the real edges (OpenAI-compatible LLM, Redis, Kafka) and run the Faust worker."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import faust

from combee.settings import Settings
from workers.app import ROLES, create_app

__all__ = ["run_worker"]


def run_worker(
    settings: Settings,
    *,
    roles: Iterable[str] = ROLES,
    until_idle_s: float | None = None,
    loglevel: str = "info",
    method: Any = None,
) -> int:
    """Run a worker until it is stopped (SIGTERM/SIGINT) or, with ``until_idle_s``, until it is idle.

    Creates missing topics and the state directory (Faust's datadir is under it) first. Returns the process
    exit status.
    """
    from combee.cli import build_llm, build_near_duplicates, method_config
    from streams.kafka_config import aiokafka_security_kwargs, ensure_topics
    from streams.keys import RedisKeys
    from streams.redis_store import LatestVersionPublisher, RedisPromptStore, build_redis
    from streams.topics import Topics

    topics = Topics(prefix=settings.topic_prefix, partitions=settings.partitions)
    ensure_topics(settings, topics)
    # Faust creates its datadir without parents: on a fresh checkout (no var/dev yet) it would not start.
    (settings.state_dir / "faust").mkdir(parents=True, exist_ok=True)
    store = RedisPromptStore(build_redis(settings), RedisKeys(settings.key_prefix))
    publisher = LatestVersionPublisher(store)
    app, _ = create_app(
        settings,
        roles=roles,
        llm=build_llm(settings),
        store=store,
        publisher=publisher,
        method=method or method_config(settings, "combee"),
        dedup=build_near_duplicates(settings),
        until_idle_s=until_idle_s,
        faust_kwargs=_faust_security(settings),
        consumer_kwargs=aiokafka_security_kwargs(settings),
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _faust_security(settings: Settings) -> dict[str, Any]:
    """Faust's ``broker_credentials`` from the Kafka security settings (SASL and/or TLS)."""
    if settings.kafka_security_protocol == "PLAINTEXT":
        return {}
    import ssl

    from faust.auth import SASLCredentials, SSLCredentials

    context = None
    if settings.kafka_security_protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(
            cafile=str(settings.kafka_ssl_cafile) if settings.kafka_ssl_cafile else None
        )
        if settings.kafka_ssl_certfile:
            context.load_cert_chain(
                str(settings.kafka_ssl_certfile),
                str(settings.kafka_ssl_keyfile) if settings.kafka_ssl_keyfile else None,
            )
    if settings.kafka_security_protocol == "SSL":
        return {"broker_credentials": SSLCredentials(context)}
    password = settings.kafka_sasl_password.get_secret_value() if settings.kafka_sasl_password else None
    return {
        "broker_credentials": SASLCredentials(
            username=settings.kafka_sasl_username,
            password=password,
            mechanism=settings.kafka_sasl_mechanism or "PLAIN",
            ssl_context=context,
        )
    }
