"""faust-streaming's aiokafka driver with one change: how long the worker's fetches wait on the broker.

Library behaviour answered: the driver builds the worker's consumer with ``fetch_max_wait_ms=1500``, hard-coded
(no Faust setting reaches it). aiokafka sends one long-poll fetch per broker for the partitions that have no
records buffered; a partition whose buffer drains while such a fetch is in flight is asked for only when that
fetch returns, up to 1.5 s later. Every stage hop of a window (windows, reflect, reflections, groups, partials)
can pay it, and the map stage's round trip through the pool paid it on every window (docs/scaling.md). Here the
fetch waits at most :data:`FETCH_MAX_WAIT_MS`; an idle worker then sends a few more (empty) fetches per second,
which costs the broker next to nothing.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_kafka

__all__ = ["FETCH_MAX_WAIT_MS", "App"]

FETCH_MAX_WAIT_MS = 100


class _ConsumerThread(faust_kafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # Read by AIOKafkaConsumer.start(), which builds the fetcher; the constructor argument is fixed above.
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        return consumer


class _Consumer(faust_kafka.Consumer):
    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(faust_kafka.Transport):
    Consumer = _Consumer


class App(faust.App):
    """``faust.App`` whose Kafka consumer uses :class:`_Transport` (the broker URL must be ``kafka://``)."""

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)
