"""What the combiner uses of its worker: the one port through which every file of :mod:`workers.combiner` reaches
Kafka, Redis, the LLM, the worker's tables and its namespaces.

The combine stage (:mod:`workers.combine`) hands its :class:`~workers.context.StageContext` in, which has all of
this and more; the combiner's files name this protocol instead, so they depend on what they use, not on every
stage's context, and a test may hand in anything that has these members. The checker holds the stage context to
it at the one place it is passed in.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from combee.embeddings import NearDuplicates
    from combee.engine import MethodConfig
    from combee.llm import LLM, Role
    from combee.metrics import Metrics
    from streams.envelopes import Envelope, Snapshot
    from streams.pending import PendingStore
    from streams.quarantine import QuarantineStore
    from streams.redis_promotion import RedisPromotion
    from streams.redis_publisher import LatestVersionPublisher
    from streams.redis_store import RedisPromptStore
    from streams.topics import Topics
    from workers.delivery.acks import OrderedAcks
    from workers.delivery.kafka_io import KafkaIO
    from workers.delivery.tables import ChangelogTable
    from workers.outcomes import OutcomeRecorder
    from workers.runtime import NamespaceRuntime
    from workers.tenure import Tenures

__all__ = ["CombinerPort", "MethodSettings"]

T = TypeVar("T")


class MethodSettings(Protocol):
    """The part of the worker's configuration the combiner reads."""

    @property
    def method(self) -> MethodConfig: ...


class CombinerPort(Protocol):
    """The combiner's view of its worker (one per process)."""

    io: KafkaIO  # reads the deltas log back when a partition is claimed
    llm: LLM  # merge calls of the scan
    store: RedisPromptStore  # published versions, read back by rollbacks and restores
    publisher: LatestVersionPublisher  # publishes each applied version to Redis
    snapshots: ChangelogTable[Snapshot]  # the applied playbook of each namespace (recovery point)
    tenures: Tenures  # the combiner's claims of the deltas log's partitions, and their state
    acks: OrderedAcks  # a record is acked once its effect is durable
    metrics: Metrics
    dedup: NearDuplicates | None  # semantic de-duplication of the merge and apply (None: exact match only)
    pending: PendingStore | None  # lessons waiting for corroboration (None: in memory only)
    quarantine: QuarantineStore | None  # lessons the guard held back (None: not stored)
    serving: RedisPromotion | None  # serving states and decisions of gated namespaces (None: not handled)
    outcomes: OutcomeRecorder | None  # the fleet's outcomes per version (None: not counted)
    runtimes: dict[str, NamespaceRuntime]
    owner: str  # this process, as named in the claims it writes
    rng: random.Random
    wake: asyncio.Event  # set when applied work may let a stage go on
    in_flight_tasks: int  # merge calls running (the worker is busy while there are any)

    @property
    def config(self) -> MethodSettings: ...

    @property
    def topics(self) -> Topics: ...

    def runtime(self, namespace: str) -> NamespaceRuntime: ...

    async def send(self, topic: str, key: str, envelope: Envelope, partition: int | None = None) -> int: ...

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Future[Any]: ...

    async def retrying(self, what: str, call: Callable[[], Awaitable[T]], role: Role | None = None) -> T: ...

    def touch(self) -> None: ...
