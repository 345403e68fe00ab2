"""The traces topic: records no larger than a trace may be, and a configurable retention (issue 26, item 3)."""

from __future__ import annotations

import pytest

from combee.models import LIMITS
from combee.settings import Settings
from streams.topics import MAX_MESSAGE_BYTES, TRACES_MAX_MESSAGE_BYTES, Topics


def _config(topics: Topics, name: str) -> dict[str, str]:
    return next(s.config for s in topics.specs() if s.name == name)


def test_the_traces_topic_takes_no_record_much_larger_than_the_trace_limit() -> None:
    topics = Topics()
    limit = int(_config(topics, topics.traces)["max.message.bytes"])
    assert limit == TRACES_MAX_MESSAGE_BYTES
    assert LIMITS.trace_bytes < limit <= LIMITS.trace_bytes + 16 * 1024  # the limit plus framing room, no more
    # the other topics carry windows of many traces and keep their larger bound
    assert int(_config(topics, topics.windows)["max.message.bytes"]) == MAX_MESSAGE_BYTES > limit


def test_the_traces_retention_comes_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _config(Settings().topics(), "combee.traces")["retention.ms"] == "-1"  # default: kept forever
    week = 7 * 24 * 3600 * 1000
    monkeypatch.setenv("COMBEE_TRACES_RETENTION_MS", str(week))
    topics = Settings().topics()
    assert _config(topics, topics.traces)["retention.ms"] == str(week)
    assert _config(topics, topics.deltas)["retention.ms"] == "-1"  # only the traces' retention is the setting's


def test_a_retention_below_minus_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMBEE_TRACES_RETENTION_MS", "-5")
    with pytest.raises(ValueError, match="traces_retention_ms"):
        Settings()
