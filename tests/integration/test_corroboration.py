"""Corroboration against the real Kafka + Redis (issue 25 item 2): with COMBEE_CORROBORATE_MIN_TRACES=2, a
lesson one trace taught stays pending (listed by ``combee bullet list --pending`` with its traces and
producers, never in the published prompt), keeps its support across a worker restart, does not go live on a
second trace of the same producer, and goes live once a second producer's trace teaches it too. The model
repeats what it reads (tests/integration/echo_llm.py), so a trace's task is its lesson."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from combee.cli.main import main
from tests.integration.echo_llm import EchoServer
from tests.integration.pipeline import Pipeline, wait_until
from tests.integration.streams_support import kafka_bootstrap_or_skip, redis_url_or_skip

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]  # a loaded machine

NS = "ns-corroborate"
LESSON = "Divide net income by revenue for the net margin of a segment."


@pytest.fixture
def echo_pipe(tmp_path: Path) -> Iterator[Pipeline]:
    server = EchoServer(cite=True).start()
    env = {"COMBEE_EMBEDDINGS": "off", "COMBEE_MODEL": "echo", "COMBEE_CORROBORATE_MIN_TRACES": "2"}
    pipe = Pipeline(kafka_bootstrap_or_skip(), redis_url_or_skip(), tmp_path, base_url=server.base_url, env_extra=env)
    try:
        yield pipe
    finally:
        pipe.close()
        server.stop()


def _pending(pipe: Pipeline, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> list[dict]:
    for name, value in pipe.env().items():
        if name.startswith(("COMBEE_", "OPENAI_")):
            monkeypatch.setenv(name, value)
    capsys.readouterr()
    assert main(["bullet", "list", NS, "--pending", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _trace(i: int, producer: str) -> dict:
    return {"trace_id": f"t{i}", "namespace": NS, "task": LESSON, "metadata": {"producer": producer}}


def _live(pipe: Pipeline) -> bool:
    return any(LESSON in b.content for b in pipe.published_playbook(NS).bullets)


def test_one_traces_lesson_stays_pending_until_a_second_producer_teaches_it(
    echo_pipe: Pipeline, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe = echo_pipe
    pipe.create_topics()
    worker = pipe.start_worker()
    pipe.publish_traces([_trace(0, "alice")])
    pipe.wait_learned({NS: 1}, timeout_s=600)
    assert not _live(pipe)
    wait_until(lambda: len(_pending(pipe, monkeypatch, capsys)) == 1, 30, "the pending lesson in Redis")
    (entry,) = _pending(pipe, monkeypatch, capsys)
    assert entry["op"] == "ADD" and LESSON in entry["content"] and entry["sources"] == ["t0"]
    assert entry["producers"] == ["alice"] and entry["teachers"] == 1

    worker.stop()  # the pool outlives the worker: the next one loads it from Redis
    pipe.start_worker()
    pipe.publish_traces([_trace(1, "alice")])  # the same producer again: still one teacher
    pipe.wait_learned({NS: 2}, timeout_s=600)
    assert not _live(pipe)
    (entry,) = _pending(pipe, monkeypatch, capsys)
    assert entry["sources"] == ["t0", "t1"] and entry["teachers"] == 1 and entry["windows"] == 2

    pipe.publish_traces([_trace(2, "bob")])
    pipe.wait_learned({NS: 3}, timeout_s=600)
    (bullet,) = [b for b in pipe.published_playbook(NS).bullets if LESSON in b.content]
    assert set(bullet.sources) == {"t0", "t1", "t2"}
    assert _pending(pipe, monkeypatch, capsys) == []
