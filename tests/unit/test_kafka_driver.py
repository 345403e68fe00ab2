"""The worker's Faust app builds its Kafka consumer with a short fetch wait (workers/delivery/driver.py)."""

from __future__ import annotations

import asyncio

from workers.delivery.driver import FETCH_MAX_WAIT_MS, App


def test_the_worker_consumer_waits_at_most_fetch_max_wait_ms_on_the_broker() -> None:
    async def build() -> int:
        app = App("fetch-wait-test", broker="kafka://127.0.0.1:9", store="memory://", web_enabled=False)
        thread = app.consumer._thread  # type: ignore[attr-defined]
        consumer = thread._create_worker_consumer(app.transport)  # built, never started: no connection
        wait: int = consumer._fetch_max_wait_ms
        return wait

    assert asyncio.run(build()) == FETCH_MAX_WAIT_MS < 1500
