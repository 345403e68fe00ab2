"""A starting worker bounds its first broker requests by ``COMBEE_KAFKA_STARTUP_TIMEOUT_S``."""

from __future__ import annotations

from typing import Any

import pytest

import workers.main
from combee.settings import Settings


class _Stop(Exception):
    pass


def test_the_startup_timeout_bounds_topic_creation(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def ensure_topics(settings: Settings, topics: object, *, timeout_s: float = 30.0) -> None:
        seen["timeout_s"] = timeout_s
        raise _Stop

    monkeypatch.setattr(workers.main, "require_kafka", lambda settings: None)
    monkeypatch.setattr(workers.main, "ensure_topics", ensure_topics)
    with pytest.raises(_Stop):
        workers.main.run_worker(Settings(kafka_startup_timeout_s=4.5))
    assert seen["timeout_s"] == 4.5


def test_the_default_startup_timeout_is_kafka_pythons_usual_30_s() -> None:
    assert Settings().kafka_startup_timeout_s == 30.0
    with pytest.raises(ValueError):
        Settings(kafka_startup_timeout_s=0)
