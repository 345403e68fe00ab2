"""Quotas end to end on the real Kafka and Redis: a producer over its rate limit has its excess dead-lettered
with the reason, everything else is learned (combee/quotas.py, applied by the window stage)."""

from __future__ import annotations

import json

import pytest

from tests.integration.pipeline import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NS = "ns-quota"


def test_the_excess_of_a_producer_is_dead_lettered_with_the_reason_and_the_rest_is_learned(pipe: Pipeline) -> None:
    traces, _ = pipe.traces(30, 8, NS)
    noisy = [dict(t, metadata={"producer": "noisy"}) for t in traces[:15]]
    quiet = [dict(t, metadata={"producer": "quiet"}) for t in traces[15:20]]
    unnamed = traces[20:]  # no producer: bounded by the namespace's limit only
    # One token per 1,000 s: whatever this machine's speed, a producer gets its burst of 5 and no more.
    pipe.start_worker(COMBEE_QUOTA_PRODUCER_PER_S="0.001", COMBEE_QUOTA_PRODUCER_BURST="5")
    pipe.publish_traces(noisy + quiet + unnamed)
    pipe.wait_learned({NS: 5 + 5 + 10})

    letters = pipe.dead_letters()
    assert len(letters) == 10, [d.reason for d in letters]
    records = {(m.partition, m.offset): json.loads(m.value) for m in pipe.read_topic(pipe.topics.traces)}
    noisy_ids = {t["trace_id"] for t in noisy}
    for d in letters:
        assert d.stage == "window" and d.topic == pipe.topics.traces
        assert d.reason == "rate limit: producer 'noisy' in 'ns-quota' is over its quota of 0.001 traces/s, burst 5"
        assert records[(d.partition, d.offset)]["trace_id"] in noisy_ids  # where it is, to publish it again
    learned = sorted(o for r in pipe.deltas(NS) for o in r.offsets)
    assert len(learned) == len(set(learned)) == 20  # the rest learned, each once
    assert set(learned).isdisjoint(d.offset for d in letters)
