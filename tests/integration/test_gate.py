"""The gate on the real services (docs/promotion.md, "The gate"): a worker whose default policy is ``gate`` learns
from SIMULATED traces with the simulator, and the generator role of its evaluations is a scripted endpoint of this
test whose answers depend on the playbook. First every version answers as well as the live one and is promoted;
then the endpoint answers wrong with any lesson the live playbook did not have, so the next candidates are
rejected and the served playbook stays at its parent. Agents polling through PromptClient the whole time are
never served a rejected version."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

from combee.holdout import held_out
from combee.models import Trace
from combee.serving import pending_candidate
from streams.client import PromptClient, PromptUnavailable
from streams.codec import decode
from streams.envelopes import ReflectTask
from streams.keys import RedisKeys
from streams.redis_promotion import SERVING_FIELDS, RedisPromotion, parse_decisions, parse_serving
from tests.integration.pipeline import Pipeline
from tests.integration.streams_support import kafka_bootstrap_or_skip, redis_url_or_skip, unique
from tests.support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(2400)]
NS = "ns-gate"
STARTUP_S = 300
LEARN_S = 900  # a loaded machine learns slowly
TASKS = 24
HOLDOUT = 0.25
_ID = re.compile(r"\[(b\d{5})\]")


class ScriptedGenerator(ThreadingHTTPServer):
    """An OpenAI-compatible generator: the answer is the number in the task, or "0" when the playbook in the
    system message has a bullet id outside ``allowed`` (None: every id is fine)."""

    allowed: frozenset[str] | None = None
    calls = 0


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedGenerator

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, payload: dict[str, Any]) -> None:
        raw = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        self._send({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        system = next((m["content"] for m in body["messages"] if m["role"] == "system"), "")
        user = next((m["content"] for m in body["messages"] if m["role"] == "user"), "")
        allowed = self.server.allowed
        hurt = allowed is not None and not set(_ID.findall(system)) <= allowed
        numbers = re.findall(r"\d+", user)
        answer = "0" if hurt else (numbers[0] if numbers else "none")
        self.server.calls += 1
        text = json.dumps({"reasoning": "scripted", "final_answer": answer})
        self._send({
            "id": "g", "object": "chat.completion", "created": 0, "model": "scripted",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })  # fmt: skip


@pytest.fixture
def generator() -> Iterator[ScriptedGenerator]:
    server = ScriptedGenerator(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def pipe(tmp_path: Path) -> Iterator[Pipeline]:
    p = Pipeline(kafka_bootstrap_or_skip(), redis_url_or_skip(), tmp_path)
    p.start_sim(STARTUP_S)
    try:
        yield p
    finally:
        p.close()


class Watcher:
    """Agents reading their prompt through PromptClient in a thread, every version they are served kept."""

    def __init__(self, pipe: Pipeline) -> None:
        self.pipe, self.served, self.stop = pipe, set[int](), threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        clients = [
            PromptClient(self.pipe.redis_url, NS, key_prefix=self.pipe.prefix, max_age_s=0, agent_id=f"agent-{i}")
            for i in range(3)
        ]
        while not self.stop.wait(0.1):
            for client in clients:
                with contextlib.suppress(PromptUnavailable):
                    self.served.add(client.get().version)
        for client in clients:
            client.close()


def state(pipe: Pipeline) -> Any:
    return parse_serving(pipe.redis().hmget(pipe.keys.serving(NS), SERVING_FIELDS))


def settled(pipe: Pipeline) -> bool:
    """At rest: the head is served. (Nothing pending is not enough: right after a rejection nothing is pending
    until the combiner commits the live content as the next head, which is then a candidate again.)"""
    head = pipe.current_version(NS)
    return head > 0 and state(pipe).live == head


def decisions(pipe: Pipeline) -> list[dict[str, Any]]:
    return parse_decisions(pipe.redis().hgetall(pipe.keys.decisions(NS)))


def ids(pipe: Pipeline, version: int) -> set[str]:
    return {b.id for b in pipe.published_playbook(NS, version).bullets}


def test_the_gate_promotes_versions_that_answer_as_well_and_rejects_the_ones_that_answer_worse(
    pipe: Pipeline, generator: ScriptedGenerator, tmp_path: Path
) -> None:
    validation = tmp_path / "validation.jsonl"
    validation.write_text("".join(json.dumps({"task": f"What is {100 + i}?", "truth": str(100 + i),
                                              "grader": "numeric"}) + "\n" for i in range(TASKS)))  # fmt: skip
    pipe.create_topics()
    pipe.start_worker(
        COMBEE_PROMOTION_POLICY="gate", COMBEE_PROMOTION_GATE_VALIDATION_FILE=str(validation),
        COMBEE_PROMOTION_GATE_MIN_PAIRS="20", COMBEE_PROMOTION_CHECK_S="0.5", COMBEE_ROLLBACK_ON_OUTCOMES="false",
        COMBEE_BASE_URL_GENERATOR=f"http://127.0.0.1:{generator.server_address[1]}/v1",
        COMBEE_PROMOTION_GATE_HOLDOUT=str(HOLDOUT),
    )  # fmt: skip
    watcher = Watcher(pipe)
    watcher.thread.start()
    try:
        first, _ = pipe.traces(20, 8, NS)
        published = list(first)
        pipe.publish_traces(first)
        pipe.wait_learned({NS: 20}, timeout_s=LEARN_S)
        wait_until(lambda: settled(pipe), 120, "every first-batch version decided")
        live = state(pipe).live
        assert live is not None and pending_candidate(state(pipe), live) is None
        assert not [d for d in decisions(pipe) if d["action"] == "reject"]  # each answered as well: all promoted
        generator.allowed = frozenset(ids(pipe, live))

        more, _ = pipe.traces(20, 9, NS)
        published += more
        pipe.publish_traces(more)
        pipe.wait_learned({NS: 40}, timeout_s=LEARN_S)
        wait_until(lambda: settled(pipe), 120, "every second-batch version decided")
    finally:
        watcher.stop.set()
        watcher.thread.join(10)
    made = decisions(pipe)
    rejected = [d for d in made if d["action"] == "reject"]
    assert rejected and all(d["decided_by"] == "gate" for d in made if d["action"] != "policy")
    evidence = rejected[0]["evidence"]
    assert evidence["comparison"]["verdict"] == "worse" and evidence["pairs"]["baseline_only"] >= TASKS
    final = state(pipe)
    assert ids(pipe, final.live) <= generator.allowed  # the served playbook stayed at what was live
    hurt = {v for v in range(1, pipe.current_version(NS) + 1) if not ids(pipe, v) <= generator.allowed}
    assert hurt, "the second batch made no version with a new lesson"
    assert watcher.served and not watcher.served & hurt  # no agent was ever served a rejected version
    restored = [d for d in pipe.deltas(NS) if d.window_id.startswith(f"{NS}/reject/")]
    assert restored and all(d.rollback_to is not None for d in restored)
    assert generator.calls >= 2 * TASKS
    shown = subprocess.run(
        [sys.executable, "-m", "combee.cli", "prompt", "policy", NS], env=pipe.env(), capture_output=True, text=True,
        timeout=120, check=True,
    ).stdout  # fmt: skip
    held = pipe.redis().hlen(pipe.keys.holdout(NS))
    assert f"{NS}: policy gate: live v{final.live}" in shown
    assert f"the workers' default validation file and {held} held-out traces" in shown
    assert_held_out_never_learned(pipe, published, evidence)


def assert_held_out_never_learned(pipe: Pipeline, published: list[dict], evidence: dict) -> None:
    """The traces with ground truth whose hash falls below the share are kept as tasks, and no reflect task of
    any window carried one of them."""
    expected = {t["trace_id"] for t in published if held_out(Trace.model_validate(t), HOLDOUT)}
    kept = set(pipe.redis().hkeys(pipe.keys.holdout(NS)))
    assert expected and kept == expected
    tasks = [decode(m.value) for m in pipe.read_topic(pipe.topics.reflect)]
    reflected = {t.trace_id for task in tasks if isinstance(task, ReflectTask) for t in task.traces}
    assert reflected and not reflected & kept
    assert reflected | kept == {t["trace_id"] for t in published}
    assert evidence["validation"]["source"] == "file:validation.jsonl+holdout"
    assert TASKS < evidence["validation"]["tasks"] <= TASKS + len(kept)  # the ones kept by then


async def test_held_out_traces_are_kept_once_within_the_cap_and_a_namespace_keeps_its_own_set() -> None:
    client = redis.asyncio.from_url(redis_url_or_skip())
    promotion = RedisPromotion(client, RedisKeys(unique("it-gate")))
    try:
        assert await promotion.hold_out(NS, {"t2": "two", "t1": "one"}, cap=3) == 2
        assert await promotion.hold_out(NS, {"t1": "changed", "t3": "three", "t4": "four"}, cap=3) == 1
        assert await promotion.held_out(NS) == ["one", "two", "three"]  # t1 kept as it was; t4 over the cap
        assert await promotion.validation(NS) is None
        await promotion.set_validation(NS, '{"task": "t", "truth": "x"}')
        assert await promotion.validation(NS) == '{"task": "t", "truth": "x"}'
        await promotion.set_validation(NS, None)
        assert await promotion.validation(NS) is None
    finally:
        await client.aclose()
