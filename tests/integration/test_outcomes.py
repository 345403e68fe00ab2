"""Outcomes per version on the real Kafka and Redis: the Redis script counts exactly what the pure ledger counts,
and a pipeline whose worker is SIGKILLed mid-run and whose traces are then all re-read from offset 0 ends with
counts equal to the published traces' (none lost, none twice); ``combee prompt history``, ``combee status
--json`` and the worker's ``combee_outcomes_total`` say the same. SIMULATED model (the learning is not judged).
"""

from __future__ import annotations

import json
import random
import urllib.request
from collections.abc import AsyncIterator

import pytest
import redis.asyncio
from kafka import KafkaAdminClient, TopicPartition
from kafka.structs import OffsetAndMetadata

from combee.metrics_prometheus import sample_sum
from combee.outcomes import Ledger, Observation, OutcomeCounts, describe, record
from streams.keys import RedisKeys
from streams.redis_connection import build_redis
from streams.redis_outcomes import RedisOutcomes
from streams.redis_store import RedisPromptStore
from tests.integration.pipeline import Pipeline
from tests.integration.streams_support import free_port, redis_url_or_skip, unique
from tests.support import wait_until

pytestmark = pytest.mark.integration

PLAYBOOK = json.dumps({"namespace": "ns", "version": 0, "bullets": []})


@pytest.fixture
async def client() -> AsyncIterator[redis.asyncio.Redis]:
    r = build_redis(redis_url_or_skip())
    yield r
    await r.aclose()


async def test_the_script_counts_what_the_pure_ledger_counts_under_redelivery(client: redis.asyncio.Redis) -> None:
    keys = RedisKeys(unique("test-outcomes"))
    try:
        await RedisPromptStore(client, keys).publish("ns", 4, "prompt", PLAYBOOK)
        store, rng = RedisOutcomes(client, keys), random.Random(7)
        outcomes = ("success", "failure", "unknown")
        stream = [
            Observation(i, rng.randrange(8), rng.choice(outcomes), rng.choice([None, rng.randrange(-8, 9) / 4]))
            for i in range(300)
        ]
        ledger, start, skipped = Ledger(), 0, 0
        while start < len(stream):  # batches that restart at or before the last offset counted, some sent twice
            restart, end = rng.randint(max(0, start - 20), start), rng.randint(start + 1, min(len(stream), start + 40))
            for _ in range(rng.choice([1, 2])):
                result = await store.record("ns", 3, stream[restart:end])
                ledger, counted = record(ledger, 3, stream[restart:end], live=4)
                assert result.counted == counted
                skipped += result.skipped
            start = end
        assert await store.counts("ns") == dict(ledger.counts)
        assert sum(c.n for c in ledger.counts.values()) == len(stream) and skipped > 0
        assert "unknown" in ledger.counts  # versions 5..7 are above the live 4
        assert [(await store.record("ns", 4, stream[:1])).counted for _ in range(2)] == [1, 0]  # its own mark
    finally:
        async for key in client.scan_iter(match=f"{keys.prefix}:*", count=500):
            await client.delete(key)


# --- the pipeline ---------------------------------------------------------------------------------------------

FAR_AHEAD = 10**6  # a version no worker publishes in this test: always above the live one


def name_versions(traces: list[dict], live: int, seed: int) -> tuple[list[dict], dict[str, OutcomeCounts]]:
    """Make traces name versions 0..live (a tenth name one far ahead, a tenth none) with their outcomes and
    scores; return them and the counts they must produce."""
    rng, expected = random.Random(seed), {}
    out = []
    for t in traces:
        t = dict(t)
        roll = rng.random()
        success = rng.choice([True, False, None])
        score = rng.randrange(0, 9) / 4
        t["feedback"] = {**t.get("feedback", {}), "success": success, "score": score}
        if roll < 0.1:
            t.pop("playbook_version", None)
        else:
            version = FAR_AHEAD if roll < 0.2 else rng.randint(0, live)
            t["playbook_version"] = version
            key = "unknown" if version == FAR_AHEAD else str(version)
            outcome = "unknown" if success is None else ("success" if success else "failure")
            one = OutcomeCounts(**{outcome: 1}, score_sum=score, score_count=1)  # type: ignore[arg-type]
            expected[key] = expected.get(key, OutcomeCounts()) + one
        out.append(t)
    return out, expected


def traces_committed(pipe: Pipeline) -> int:
    admin = KafkaAdminClient(bootstrap_servers=pipe.bootstrap)
    try:
        tps = [TopicPartition(pipe.topics.traces, p) for p in range(pipe.partitions)]
        got = admin.list_group_offsets({f"{pipe.prefix}-worker": tps}).get(f"{pipe.prefix}-worker", {})
        return sum(max(0, m.offset) for m in got.values())
    finally:
        admin.close()


def rewind_traces(pipe: Pipeline) -> bool:
    """Commit offset 0 on every traces partition for the (stopped) worker group: everything is read again.
    False while the group still has a member (the coordinator has not seen the worker leave yet)."""
    admin = KafkaAdminClient(bootstrap_servers=pipe.bootstrap)
    try:
        tps = {TopicPartition(pipe.topics.traces, p): OffsetAndMetadata(0, "", -1) for p in range(pipe.partitions)}
        admin.alter_group_offsets(f"{pipe.prefix}-worker", tps)
    except Exception:
        return False
    finally:
        admin.close()
    return traces_committed(pipe) == 0


def counted(pipe: Pipeline, ns: str) -> dict[str, OutcomeCounts]:
    from streams.redis_outcomes import parse_outcomes

    return parse_outcomes(pipe.redis().hgetall(pipe.keys.outcomes(ns)))


@pytest.mark.slow
@pytest.mark.timeout(1500)  # three worker starts and two learning runs on a SIMULATED model
def test_outcomes_are_exact_through_a_kill_and_a_full_reread(pipe: Pipeline) -> None:
    ns = "ns-outcomes"
    warmup, _ = pipe.traces(40, 3, ns)
    pipe.create_topics()
    port = free_port()
    worker = pipe.start_worker(COMBEE_METRICS_PORT=str(port))
    pipe.publish_traces(warmup)
    pipe.wait_learned({ns: 40}, timeout_s=600)
    live = pipe.current_version(ns)
    assert live >= 1
    raw, _ = pipe.traces(80, 5, ns)
    traces, expected = name_versions(raw, live, seed=11)
    total = 40 + len(traces)

    pipe.publish_traces(traces[:40])
    wait_until(lambda: sum(c.n for c in counted(pipe, ns).values()) > 0, 120, "some outcomes counted")
    worker.kill()  # mid-run: outcomes are counted on arrival, their offsets committed only after their window
    pipe.publish_traces(traces[40:])
    worker = pipe.start_worker(COMBEE_METRICS_PORT=str(port))
    pipe.wait_learned({ns: total}, timeout_s=600)
    wait_until(lambda: traces_committed(pipe) == total, 120, "every trace acknowledged")
    assert counted(pipe, ns) == expected

    worker.stop()
    wait_until(lambda: rewind_traces(pipe), 60, "the group's traces offsets set back to 0")  # re-read them all
    worker = pipe.start_worker(COMBEE_METRICS_PORT=str(port))
    wait_until(lambda: traces_committed(pipe) == total, 180, "every trace read and acknowledged again")
    assert counted(pipe, ns) == expected  # nothing counted twice

    status = json.loads(pipe.cli("status", ns, "--json").stdout)["namespaces"][0]["outcomes"]
    assert {k: v["n"] for k, v in status.items()} == {k: c.n for k, c in expected.items()}
    history = pipe.cli("prompt", "history", ns, "--limit", "1000").stdout
    for key, counts in expected.items():
        assert describe(counts) in history, key

    def scraped() -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        return sample_sum(text, "combee_outcomes_total", namespace=ns)

    wait_until(lambda: scraped() == sum(c.n for c in expected.values()), 30, "the worker to export the counts")
