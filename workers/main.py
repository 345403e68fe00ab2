"""``combee worker``: build the real edges (OpenAI-compatible LLM, Redis, Kafka) and run the Faust worker."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import faust

from combee.engine import MethodConfig
from combee.settings import Settings
from combee.wiring import (
    build_llm,
    build_metrics,
    build_near_duplicates,
    build_publisher,
    gate_validation,
    identity_policy,
    method_config,
)
from streams.kafka_config import aiokafka_security_kwargs, ensure_topics, faust_security_kwargs, require_kafka
from streams.redis_store import RedisPromptStore
from workers.app import ROLES, create_app
from workers.health import build_health

__all__ = ["run_worker"]


def run_worker(
    settings: Settings,
    *,
    roles: Iterable[str] = ROLES,
    until_idle_s: float | None = None,
    loglevel: str = "info",
    method: MethodConfig | None = None,
) -> int:
    """Run a worker until it is stopped (SIGTERM/SIGINT) or, with ``until_idle_s``, until it is idle.

    Serves metrics (when ``metrics_port`` is set), creates missing topics and the state directory (Faust's
    datadir is under it) first. Returns the process exit status. Raises KafkaUnreachable at once (not after
    kafka-python's 30 s) when no bootstrap address answers.
    """
    identity = identity_policy(settings)  # a bad producer keys file fails before anything connects
    metrics = build_metrics(settings)  # then: a taken port fails before anything connects
    gate_validation(settings)  # a bad gate validation file or grader, too (read again when the stages are built)
    require_kafka(settings)
    ensure_topics(settings, settings.topics(), timeout_s=settings.kafka_startup_timeout_s)
    # Faust creates its datadir without parents: on a fresh checkout (no var/dev yet) it would not start.
    (settings.state_dir / "faust").mkdir(parents=True, exist_ok=True)
    store = RedisPromptStore.from_settings(settings)
    app, _ = create_app(
        settings,
        roles=roles,
        llm=build_llm(settings),
        store=store,
        publisher=build_publisher(store, settings),
        method=method or method_config(settings, "combee"),
        dedup=build_near_duplicates(settings),
        until_idle_s=until_idle_s,
        faust_kwargs=faust_security_kwargs(settings),
        consumer_kwargs=aiokafka_security_kwargs(settings),
        metrics=metrics,
        health=build_health(settings, store) if settings.health_interval_s > 0 else None,
        identity=identity,
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    # One INFO line per LLM request ("HTTP Request: POST ...") cost a tenth of the worker's CPU per trace.
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
