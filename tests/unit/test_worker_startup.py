"""A starting worker bounds its first broker requests by ``COMBEE_KAFKA_STARTUP_TIMEOUT_S``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import workers.main
from combee.errors import ConfigError
from combee.settings import Settings
from combee.wiring import gate_validation


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


def test_a_bad_gate_validation_file_or_grader_stops_the_worker_before_it_connects(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def never(settings: Settings) -> None:
        raise AssertionError("the worker reached Kafka")

    monkeypatch.setattr(workers.main, "require_kafka", never)
    bad = tmp_path / "v.jsonl"
    bad.write_text('{"task": "t"}\n')
    for settings in (
        Settings(promotion_gate_validation_file=tmp_path / "missing.jsonl"),
        Settings(promotion_gate_validation_file=bad),
        Settings(promotion_gate_grader="nope"),
    ):
        with pytest.raises(ConfigError):
            workers.main.run_worker(settings)
    good = tmp_path / "good.jsonl"
    good.write_text('{"task": "t", "truth": "x"}\n')
    assert gate_validation(Settings(promotion_gate_validation_file=good))[0].truth == "x"
