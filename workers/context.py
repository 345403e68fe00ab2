"""The shared context of a worker's stages: configuration, Kafka I/O, tables, LLM, prompt publisher."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from combee.controller import DEFAULT_BS, DEFAULT_TRIAL_SIZES, BatchSizeController
from combee.embeddings import NearDuplicates
from combee.engine import MethodConfig
from combee.errors import LLMRateLimited, LLMUnavailable
from combee.feedback import FeedbackJoin, FeedbackPolicy
from combee.gate import BaselineGrades
from combee.identity import IdentityPolicy
from combee.llm import LLM, Role
from combee.metrics import Metrics, NoMetrics
from combee.promotion import PromotionConfig
from combee.quotas import QuotaLedger
from combee.windowing import MapState, WindowPolicy
from streams.codec import CodecError, dead_letter, decode, encode
from streams.envelopes import Envelope, Snapshot
from streams.topics import Topics, partition_for
from workers.delivery.acks import OrderedAcks
from workers.delivery.kafka_io import KafkaIO
from workers.delivery.tables import ChangelogTable
from workers.runtime import Buffered, Gathers, NamespaceRuntime
from workers.tenure import Tenures

if TYPE_CHECKING:
    from streams.forget import CachedRules
    from streams.pending import PendingStore
    from streams.quarantine import QuarantineStore
    from streams.redis_promotion import RedisPromotion
    from streams.redis_publisher import LatestVersionPublisher
    from streams.redis_store import RedisPromptStore
    from workers.outcomes import OutcomeRecorder

__all__ = ["StageConfig", "StageContext"]

log = logging.getLogger("combee.worker")
T = TypeVar("T")
E = TypeVar("E")


@dataclass(frozen=True)
class StageConfig:
    topics: Topics
    method: MethodConfig
    policy: WindowPolicy
    bs_candidates: tuple[int, ...] = DEFAULT_TRIAL_SIZES
    bs_default: int = DEFAULT_BS
    curate_concurrency: int = 8
    reflect_task_size: int = 8  # traces per reflection task (combee.fanout.task_slices)
    window_max_bytes: int = 6 * 1024 * 1024
    buffer_limit: int = 4096  # traces buffered per namespace; past it, its traces are held back (workers/holdback.py)
    held_limit: int = 100_000  # offsets held back per traces partition before the window stage stops pulling
    max_namespaces: int = 1000  # live namespaces (runtimes) per worker; a new one past it is dead-lettered
    namespace_idle_s: float = 600.0  # a namespace quiet this long with nothing buffered or in flight is evicted
    retry_max_s: float = 30.0
    control_key: bytes | None = None  # COMBEE_CONTROL_KEY: control records must be signed with it (None: not checked)
    identity: IdentityPolicy = field(default_factory=IdentityPolicy)  # producers' keys, namespaces requiring them
    feedback: FeedbackPolicy = field(default_factory=FeedbackPolicy)  # where each namespace's feedback comes from
    promotion: PromotionConfig = field(default_factory=PromotionConfig)


def process_id() -> str:
    """host/pid/random: names this process in the claims it writes (a restarted pid is another owner)."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


@dataclass
class StageContext:
    """What the stages (window, map, curate, combine, commit) share: config, clients, tables, runtimes. One per
    worker process."""

    config: StageConfig
    io: KafkaIO
    llm: LLM
    publisher: LatestVersionPublisher
    store: RedisPromptStore
    map_table: ChangelogTable[MapState]
    snapshots: ChangelogTable[Snapshot]
    dedup: NearDuplicates | None = None  # semantic de-duplication (None: exact match only)
    acks: OrderedAcks = field(default_factory=OrderedAcks)
    runtimes: dict[str, NamespaceRuntime] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    last_activity: float = field(default_factory=time.monotonic)
    in_flight_tasks: int = 0
    rng: random.Random = field(default_factory=random.Random)
    tasks: set[asyncio.Future[Any]] = field(default_factory=set)
    owner: str = field(default_factory=process_id)
    tenures: Tenures = field(default_factory=Tenures)  # the combiner's claims of the deltas log's partitions
    metrics: Metrics = field(default_factory=NoMetrics)
    gathers: Gathers = field(default_factory=Gathers)  # reflection answers awaited by the map stage
    # told of every LLM step's outcome (the dependency named for the role, and the outage or None): the health
    # board follows an outage as soon as work meets it (workers/health.py)
    llm_outcome: Callable[[Role, BaseException | None], None] | None = None
    # the forget rules the window stage honours (``combee traces forget``); None: no rules are read
    forget_rules: CachedRules | None = None
    # the rate limits the window stage applies (``COMBEE_QUOTA_*``, combee/quotas.py); None: no limits
    quotas: QuotaLedger | None = None
    # counts each trace's outcome for the version it names, exactly once (workers/outcomes.py); None: not counted
    outcomes: OutcomeRecorder | None = None
    # where the combiner stores the lessons the guard held back, and operators' actions (None: not stored)
    quarantine: QuarantineStore | None = None
    # where the combiner keeps the lessons waiting for corroboration (None: in memory only)
    pending: PendingStore | None = None
    # the namespaces' serving states and decisions (workers/promotion.py); None: promotion is not handled
    serving: RedisPromotion | None = None
    # the candidate each gated namespace was last said to wait with (workers/gate.py logs a wait once)
    gate_waits: dict[str, int] = field(default_factory=dict)
    # per namespace: the live version's graded answers to the validation tasks, reused by the next evaluation
    gate_baselines: dict[str, BaselineGrades] = field(default_factory=dict)
    # rejections whose new head this process asked the combiner for again (workers/promotion.py), by window id
    restores_asked: set[str] = field(default_factory=set)
    # traces of trusted-feedback namespaces waiting for their feedback, and feedback come first (workers/feedback.py);
    # bounded as config.feedback says
    feedback_join: FeedbackJoin[Buffered, Any] = field(init=False)

    def __post_init__(self) -> None:
        f = self.config.feedback
        self.feedback_join = FeedbackJoin(f.wait_s, f.early_s, f.early_limit)

    def buffered(self, rt: NamespaceRuntime) -> int:
        """Traces of ``rt``'s namespace taken and not yet in a window: in its buffers, or waiting in the join for
        their trusted feedback (workers/feedback.py); what backpressure and eviction count."""
        return rt.buffered() + self.feedback_join.waiting(rt.namespace)

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Future[Any]:
        """Run ``coro`` in the background, keeping a reference until it finishes."""
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    @property
    def topics(self) -> Topics:
        return self.config.topics

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def home_partition(self, namespace: str) -> int:
        return partition_for(namespace.encode("utf-8"), self.topics.partitions)

    def runtime(self, namespace: str) -> NamespaceRuntime:
        rt = self.runtimes.get(namespace)
        if rt is None:
            cfg = self.config
            rt = NamespaceRuntime(
                namespace=namespace,
                partition=self.home_partition(namespace),
                controller=BatchSizeController(
                    candidates=cfg.bs_candidates,
                    bs_min=cfg.policy.bs_min,
                    bs_max=cfg.policy.bs_max,
                    default=cfg.bs_default,
                ),
            )
            self.runtimes[namespace] = rt
            self.metrics.namespace_seen(namespace)
            self.metrics.namespaces_live(len(self.runtimes))
        return rt

    async def send(self, topic: str, key: str, envelope: Envelope, partition: int | None = None) -> int:
        """Send an envelope and wait for the broker's ack; keyed by ``key`` (namespace unless stated)."""
        kb = key.encode("utf-8")
        part = partition if partition is not None else partition_for(kb, self.topics.partitions)
        return await self.io.send(topic, kb, encode(envelope), part)

    async def receive(
        self, stream: Any, event: Any, kinds: type[E] | tuple[type[E], ...], stage: str, expected: str
    ) -> E | None:
        """Take ``event`` in: register it for in-order acks, mark the worker busy, and decode its record.

        Returns the envelope when it is an instance of ``kinds`` (a class or a tuple of classes); anything else
        is dead-lettered under ``stage`` ("expected <expected>, got <schema>", or the codec's reason), acked,
        and None is returned.
        """
        msg = event.message
        self.acks.add(stream, event)
        self.touch()
        try:
            env = decode(msg.value or b"")
            if not isinstance(env, kinds):
                raise CodecError(f"expected {expected}, got {env.schema_}")
        except CodecError as exc:
            await self.dead_letter(stage, exc.reason, msg)
            await self.acks.done(event)
            return None
        return env

    async def dead_letter(self, stage: str, reason: str, message: Any) -> None:
        record = dead_letter(
            stage=stage,
            reason=reason,
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            key=message.key,
            value=message.value,
        )
        await self.io.send(self.topics.deadletter, message.key or b"", encode(record), 0)
        log.warning("dead-lettered %s[%d]@%d (%s): %s", message.topic, message.partition, message.offset, stage, reason)

    async def retrying(self, what: str, call: Callable[[], Awaitable[T]], role: Role | None = None) -> T:
        """Run an LLM-bound step until it succeeds: an endpoint outage makes work wait, never drop.

        LLMUnavailable / LLMRateLimited back off exponentially (with jitter, capped at ``retry_max_s``, at least
        the server's Retry-After hint) and try again (each failure counted for ``role``); any other exception
        propagates.
        """
        attempt = 0
        while True:
            try:
                result = await call()
            except (LLMUnavailable, LLMRateLimited) as exc:
                attempt += 1
                if role is not None:
                    self.metrics.llm_unavailable(role)
                    if self.llm_outcome is not None and isinstance(exc, LLMUnavailable):
                        self.llm_outcome(role, exc)
                hint = getattr(exc, "retry_after_s", None) or 0.0
                delay = max(hint, self.rng.uniform(0, min(self.config.retry_max_s, 0.5 * 2**attempt)))
                # the first failure and every tenth: the health report (combee status) says the rest
                level = logging.WARNING if attempt % 10 == 1 else logging.DEBUG
                log.log(level, "%s: LLM endpoint unavailable (%s); retry %d in %.1fs", what, exc, attempt, delay)
                self.touch()
                await asyncio.sleep(delay)
                continue
            if role is not None and self.llm_outcome is not None:
                self.llm_outcome(role, None)
            return result
