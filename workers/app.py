"""The Faust app: topics, agents and lifecycle. Thin wiring: decode → call the stage → ack.

Roles: ``learner`` runs the window, map and combine stages (co-partitioned by namespace, one owner per
namespace) and ``curate`` runs the pool: reflection tasks and curator groups of every namespace, whoever owns
it. ``combee worker`` runs both by default; more capacity, even for a single namespace, is more workers (up
to the partition count; docs/scaling.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import faust

from combee.identity import IdentityPolicy
from combee.llm import LLM
from combee.metrics import Metrics, NoMetrics
from combee.settings import Settings
from combee.windowing import MapState, WindowPolicy
from combee.wiring import build_quotas, feedback_policy, identity_policy, promotion_config
from streams.codec import decode
from streams.control_auth import control_key
from streams.envelopes import Snapshot
from streams.forget import CachedRules
from streams.pending import PendingStore
from streams.quarantine import QuarantineStore
from streams.redis_outcomes import RedisOutcomes
from streams.redis_promotion import RedisPromotion
from streams.topics import MAX_MESSAGE_BYTES, Topics
from workers.combine import handle_partial
from workers.context import StageConfig, StageContext
from workers.curate import handle_group
from workers.delivery.backfill import with_backfill
from workers.delivery.driver import App
from workers.delivery.kafka_io import KafkaIO
from workers.delivery.resume import stall_guard
from workers.delivery.tables import ChangelogTable
from workers.fanout import handle_reflected
from workers.feedback import forget_feedback, handle_feedback
from workers.health import HealthWatch, health_loop, llm_dependency_names
from workers.mapper import handle_window
from workers.observe import export_outcomes, lag_reporter, publish_listener
from workers.outcomes import OutcomeRecorder, flush_loop
from workers.promotion import promotion_loop
from workers.reflect import handle_reflect_task
from workers.status import idle, republish_if_lost, status_of
from workers.window import closer_loop, handle_trace

if TYPE_CHECKING:
    from combee.embeddings import NearDuplicates
    from combee.engine import MethodConfig
    from streams.redis_publisher import LatestVersionPublisher
    from streams.redis_store import RedisPromptStore

__all__ = ["ROLES", "create_app"]

log = logging.getLogger("combee.worker")
Handler = Callable[[StageContext, Any, Any], Awaitable[None]]  # a stage: (context, stream, event)
ROLES = ("learner", "curate")


def _map_state_decode(raw: bytes) -> MapState:
    import json

    obj = json.loads(raw)
    return MapState(
        next_seq=obj["next_seq"],
        marks=tuple((s, o) for s, o in obj["marks"]),
        recent=tuple((w, q, f) for w, q, f in obj["recent"]),
    )


def _map_state_encode(state: MapState) -> bytes:
    import json

    return json.dumps(
        {"next_seq": state.next_seq, "marks": list(state.marks), "recent": list(state.recent)}, separators=(",", ":")
    ).encode()


def _snapshot_decode(raw: bytes) -> Snapshot:
    env = decode(raw)
    if not isinstance(env, Snapshot):
        raise ValueError("not a snapshot")
    return env


def _snapshot_encode(snap: Snapshot) -> bytes:
    return snap.model_dump_json(by_alias=True).encode()


def create_app(
    settings: Settings,
    *,
    roles: Iterable[str] = ROLES,
    llm: LLM,
    store: RedisPromptStore,
    publisher: LatestVersionPublisher,
    method: MethodConfig,
    until_idle_s: float | None = None,
    faust_kwargs: dict[str, Any] | None = None,
    consumer_kwargs: dict[str, Any] | None = None,
    dedup: NearDuplicates | None = None,
    metrics: Metrics | None = None,
    health: HealthWatch | None = None,
    identity: IdentityPolicy | None = None,
) -> tuple[faust.App, StageContext]:
    """Build the app and the stages' shared context (nothing connects until the worker starts).

    ``metrics`` (None: off) receives the stages' reports, the versions the publisher sees in Redis and, every
    few seconds, the consumer lag of the assigned partitions. ``health`` (None: off) is checked at start and
    every ``settings.health_interval_s`` seconds and told of every LLM step's outcome; its report goes to Redis.
    ``identity`` (None: from the settings, :func:`combee.wiring.identity_policy`) is who may sign traces.
    """
    roles = set(roles)
    topics = Topics(settings.topic_prefix, settings.partitions, traces_retention_ms=settings.traces_retention_ms)
    app = App(
        f"{settings.topic_prefix}-worker",
        broker=f"kafka://{settings.kafka_bootstrap}",
        store="memory://",
        datadir=str(settings.state_dir / "faust"),  # Faust's own files; not the current directory
        web_enabled=False,
        web_bind="127.0.0.1",
        web_host="127.0.0.1",
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        topic_allow_declare=True,  # Faust creates its own internal topics; ours exist already (ensure_topics)
        producer_acks=-1,
        producer_max_request_size=MAX_MESSAGE_BYTES,
        consumer_max_fetch_size=2 * MAX_MESSAGE_BYTES,
        consumer_auto_offset_reset="earliest",
        stream_wait_empty=False,
        broker_commit_interval=settings.kafka_commit_interval_s,
        broker_session_timeout=settings.kafka_session_timeout_s,
        broker_heartbeat_interval=max(1.0, settings.kafka_session_timeout_s / 5),
        broker_commit_every=settings.kafka_commit_every,
        value_serializer="raw",
        key_serializer="raw",
        **(faust_kwargs or {}),
    )

    async def send(topic: str, key: bytes, value: bytes, partition: int) -> tuple[int, int]:
        md = await app.producer.send_and_wait(topic, key, value, partition, None, None)
        return md.partition, md.offset

    io = KafkaIO(send, settings.kafka_bootstrap, consumer_kwargs, group_id=app.conf.id)
    if control_key(settings) is None:
        log.warning(
            "COMBEE_CONTROL_KEY is unset: control records (rollback) on %s are applied without authentication; "
            "set it on workers and operators (docs/security.md)",
            topics.partials,
        )
    identity = identity if identity is not None else identity_policy(settings)
    log.info(
        "producer identity: %d producer keys; unsigned traces refused in %s",
        len(identity.keys),
        ", ".join(sorted(identity.require_signed)) or "no namespace",
    )
    config = StageConfig(
        topics=topics,
        method=method,
        policy=WindowPolicy(
            max_inflight=settings.max_inflight_windows,
            max_wait_s=settings.max_wait_s,
            bs_min=settings.bs_min,
            bs_max=settings.bs_max,
        ),
        bs_candidates=settings.bs_candidates,
        bs_default=settings.bs_default,
        curate_concurrency=settings.curate_concurrency,
        reflect_task_size=settings.reflect_task_size,
        buffer_limit=settings.namespace_buffer,
        held_limit=settings.held_max,
        max_namespaces=settings.max_namespaces,
        namespace_idle_s=settings.namespace_idle_s,
        control_key=control_key(settings),
        identity=identity,
        feedback=feedback_policy(settings),
        promotion=promotion_config(settings),
    )
    ctx = StageContext(
        config=config,
        io=io,
        llm=llm,
        dedup=dedup,
        publisher=publisher,
        store=store,
        map_table=ChangelogTable(io, topics.mapstate, topics.partitions, _map_state_decode, _map_state_encode),
        snapshots=ChangelogTable(io, topics.playbooks, topics.partitions, _snapshot_decode, _snapshot_encode),
        metrics=metrics or NoMetrics(),
        forget_rules=CachedRules(store.forget_rules, time.monotonic),
        quotas=build_quotas(settings),
        quarantine=QuarantineStore(store.redis, store.keys),
        pending=PendingStore(store.redis, store.keys),
    )
    ctx.serving = RedisPromotion(store.redis, store.keys)
    recorder = ctx.outcomes = OutcomeRecorder(RedisOutcomes(store.redis, store.keys), ctx.acks.done)
    publisher.on_published = publish_listener(ctx)
    if health is not None:
        dependency = llm_dependency_names(settings)
        watch = health
        ctx.llm_outcome = lambda role, exc: watch.llm_outcome(dependency.get(role, "llm"), exc)

        @app.task
        async def health_reporter() -> None:
            await health_loop(ctx, watch, store, settings.health_interval_s)

    def stage_agent(topic_name: str, name: str, handle: Handler) -> None:
        """One agent per stage topic, all alike: take events unacked (the stage acks when its work is durable),
        let the context put back what a rebalance held over, and hand each event to the stage."""

        async def run(stream: Any) -> None:
            s = stream.noack()
            async for event in s.events():
                for e in await with_backfill(ctx.acks, ctx.io, event):
                    await handle(ctx, s, e)

        run.__name__ = run.__qualname__ = name.replace("-", "_")
        topic = app.topic(topic_name, key_serializer="raw", value_serializer="raw", internal=False)
        app.agent(topic, name=name)(run)

    if "learner" in roles:
        stage_agent(topics.traces, "combee-window", handle_trace)
        stage_agent(topics.feedback, "combee-feedback", handle_feedback)
        stage_agent(topics.windows, "combee-map", handle_window)
        stage_agent(topics.reflections, "combee-gather", handle_reflected)
        stage_agent(topics.partials, "combee-combine", handle_partial)

        @app.task
        async def window_closer() -> None:
            await closer_loop(ctx)

        @app.task
        async def outcome_counter() -> None:
            await flush_loop(recorder)

        @app.task
        async def promotion_checker() -> None:
            await promotion_loop(ctx)

        @app.task
        async def status_reporter() -> None:
            while True:
                await asyncio.sleep(2.0)
                try:
                    await store.mark_seen(sorted(ctx.runtimes))
                except Exception as exc:  # Redis down: best effort, as the status below
                    log.debug("namespaces seen not written: %s", exc)
                for rt in list(ctx.runtimes.values()):
                    try:
                        await store.set_status(rt.namespace, status_of(ctx, rt))
                        await republish_if_lost(ctx, rt)
                    except Exception as exc:  # Redis down: status is best effort, learning goes on
                        log.debug("status for %s not written: %s", rt.namespace, exc)
                await export_outcomes(ctx, recorder)

    if "curate" in roles:
        reflect_gate = asyncio.Semaphore(settings.reflect_concurrency)
        curate_gate = asyncio.Semaphore(settings.curate_concurrency)

        async def reflect(c: StageContext, s: Any, e: Any) -> None:
            await handle_reflect_task(c, s, e, reflect_gate)

        async def curate(c: StageContext, s: Any, e: Any) -> None:
            await handle_group(c, s, e, curate_gate)

        stage_agent(topics.reflect, "combee-reflect", reflect)
        stage_agent(topics.groups, "combee-curate", curate)

    @app.task
    async def prompt_publisher() -> None:
        await publisher.run()

    @app.task
    async def lag_metrics() -> None:
        await lag_reporter(ctx, lambda: app.consumer)

    @app.task
    async def resume_stalled() -> None:
        await stall_guard(lambda: app.consumer, topics=topics.stage_inputs, acks=ctx.acks, io=ctx.io)

    if until_idle_s is not None:

        @app.task
        async def idle_monitor() -> None:
            started = time.monotonic()
            while True:
                await asyncio.sleep(0.5)
                if time.monotonic() - started > until_idle_s and idle(ctx, until_idle_s):
                    log.info("idle for %.1fs with nothing in flight: stopping (--until-idle)", until_idle_s)
                    os.kill(os.getpid(), signal.SIGTERM)
                    return

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def on_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        _forget(ctx, revoked)

    return app, ctx


def _forget(ctx: StageContext, revoked: Iterable[Any]) -> None:
    """Drop in-memory state of revoked partitions; their new owner rebuilds it from Kafka."""
    topics = ctx.topics
    for tp in revoked:
        ctx.acks.forget(tp.topic, tp.partition)
        forget_feedback(ctx, tp.topic, tp.partition)
        if tp.topic == topics.traces:
            for rt in ctx.runtimes.values():
                rt.buffers.pop(tp.partition, None)
                rt.held.pop(tp.partition, None)
            if ctx.outcomes is not None:
                ctx.outcomes.forget(tp.partition)
        if tp.topic == topics.partials:
            ctx.snapshots.forget(tp.partition)
            ctx.map_table.forget(tp.partition)
            ctx.tenures.revoke(tp.partition)  # work still in flight finishes under its own tenure, or is fenced
            for ns, rt in list(ctx.runtimes.items()):
                if rt.partition == tp.partition:
                    if rt.mapper is not None:
                        rt.mapper.cancel()
                    del ctx.runtimes[ns]
            ctx.metrics.namespaces_live(len(ctx.runtimes))
