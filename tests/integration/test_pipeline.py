"""End to end on the real Kafka and Redis: SIMULATED traces in, versioned prompts out.

Each test gets its own topic/key prefix, simulator process and worker processes (tests/integration/pipeline.py).
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from combee.engine import MethodConfig, Window, run_window
from combee.models import LIMITS, Playbook, Trace
from combee.plan import DEFAULT_SHUFFLE_KEY
from combee.playbook import render_prompt
from combee.settings import Settings
from combee.sim.inproc import InProcessSim
from combee.sim.world import Behaviour, WorldResponder, insight_keys_in, retention
from combee.wiring import build_near_duplicates
from streams.client import PromptClient
from streams.envelopes import DeltaRecord
from tests.integration.pipeline import Pipeline, check_prompt_matches, wait_until
from tests.integration.streams_support import PrivateRedis

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def offline_playbook(traces: list[dict], records: list[DeltaRecord], seed: int = 1) -> Playbook:
    """The offline engine (``combee learn``'s) on the same traces, cut into the same windows with the same
    shuffle seeds, against the same simulated model."""
    llm = InProcessSim(WorldResponder(Behaviour(seed=seed)), seed=seed)
    dedup = build_near_duplicates(Settings(), log=lambda _: None)  # the workers' semantic de-duplication
    parsed = [Trace.model_validate(t) for t in traces]
    ns = parsed[0].namespace
    order = {o: i for i, o in enumerate(sorted(o for r in records for o in r.offsets))}  # published in order

    async def run() -> Playbook:
        playbook = Playbook(namespace=ns)
        for r in records:
            chunk = tuple(parsed[order[o]] for o in r.offsets)
            window = Window(ns, "file:e0", order[r.offsets[0]], order[r.offsets[-1]], chunk, seed_key=r.seed_key)
            config = MethodConfig(shuffle_key=r.shape)  # the shape the workers used, as the log says
            playbook = (await run_window(window, playbook, llm, config, dedup=dedup)).playbook
        return playbook

    return asyncio.run(run())


class Watcher(threading.Thread):
    """A PromptClient.watch() reader running during the test; records every (version, prompt) it sees."""

    def __init__(self, pipe: Pipeline, namespace: str) -> None:
        super().__init__(daemon=True)
        self.client = PromptClient(pipe.redis_url, namespace, key_prefix=pipe.prefix, poll_interval_s=0.5)
        self.seen: list[tuple[int, str]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        last = None
        while not self.stopping.is_set():
            for v in self.client.watch(timeout=1.0, after=last):
                self.seen.append((v.version, v.prompt))
                last = v.version

    def stop(self) -> list[tuple[int, str]]:
        self.stopping.set()
        self.join(timeout=10)
        self.client.close()
        return self.seen


def test_two_namespaces_learn_like_offline_and_never_mix(pipe: Pipeline) -> None:
    formula, truth_f = pipe.traces(200, 1, "fin-formula", "formula")
    finer, truth_n = pipe.traces(200, 2, "fin-finer", "finer")
    watcher = Watcher(pipe, "fin-formula")
    watcher.start()
    pipe.start_worker()
    interleaved = [t for pair in zip(formula, finer, strict=True) for t in pair]
    pipe.publish_traces(interleaved, pace_s=0.01)  # a fleet, not a burst: several windows per namespace
    pipe.wait_learned({"fin-formula": 200, "fin-finer": 200})
    seen = watcher.stop()

    for ns, traces, truth, prefix in (("fin-formula", formula, truth_f, "FX"), ("fin-finer", finer, truth_n, "FN")):
        records = pipe.deltas(ns)
        # every window applied once, covering every trace exactly once
        assert len({r.window_id for r in records}) == len(records)
        offsets = [o for r in records for o in r.offsets]
        assert len(offsets) == len(set(offsets)) == 200
        assert [r.version for r in records] == list(range(1, len(records) + 1))
        assert {r.shape for r in records} == {DEFAULT_SHUFFLE_KEY}  # the workers' default reduce shape
        # namespaces never mix: a playbook holds only its own world's insight keys
        playbook = pipe.published_playbook(ns)
        keys = insight_keys_in(render_prompt(playbook))
        assert keys and all(k.startswith(prefix) for k in keys)
        # quality: at least 0.9 x the offline learner on the same traces and window sizes. Given the same
        # windows and seeds the simulated model answers identically, so the engines must agree exactly.
        offline = offline_playbook(traces, records)
        streamed_r = retention(render_prompt(playbook), truth["insights"])
        offline_r = retention(render_prompt(offline), truth["insights"])
        sizes = [r.trace_count for r in records]
        print(f"{ns}: windows {sizes} retention streamed {streamed_r:.3f} offline {offline_r:.3f}")
        assert streamed_r >= 0.9 * offline_r
        assert [(b.section, b.content) for b in playbook.bullets] == [(b.section, b.content) for b in offline.bullets]

    # the reader saw strictly increasing versions, each prompt exactly its version's playbook
    versions = [v for v, _ in seen]
    assert versions and versions == sorted(set(versions))
    assert versions[-1] == pipe.current_version("fin-formula")
    for version, prompt in seen:
        check_prompt_matches(pipe, "fin-formula", version, prompt)


def test_bad_records_are_dead_lettered_and_good_ones_learned(pipe: Pipeline) -> None:
    good, _ = pipe.traces(40, 3, "ns-good")
    bad: list[tuple[bytes | None, bytes]] = [
        (b"ns-good", b"not json {"),
        (b"ns-good", json.dumps({"namespace": "ns-good"}).encode()),  # no task
        # over the trace limit, within the topic's framing room (a bigger record the broker itself refuses)
        (b"ns-good", json.dumps({"namespace": "ns-good", "task": "x" * LIMITS.trace_bytes}).encode()),
        (b"bad ns!", json.dumps({"namespace": "bad ns!", "task": "t"}).encode()),  # unsafe namespace
        (b"ns-good", b"\xff\xfe\x00garbage"),
        (b"ns-good", json.dumps({"namespace": "ns-good", "task": "t", "steps": "not a list"}).encode()),
    ]
    records: list[tuple[bytes | None, bytes]] = []
    for i, t in enumerate(good):
        records.append((b"ns-good", json.dumps(t).encode()))
        if i < len(bad):
            records.append(bad[i])
    # a trace from a plain Kafka client with no key at all is accepted (its namespace is in the JSON)
    plain = dict(good[0], trace_id="plain-client-1")
    records.append((None, json.dumps(plain).encode()))
    pipe.start_worker()
    pipe.publish(records)
    pipe.wait_learned({"ns-good": 41})

    letters = pipe.dead_letters()
    assert len(letters) == len(bad)
    reasons = " | ".join(d.reason for d in letters)
    for expected in ("not valid JSON", "task", "over the 262144-byte limit", "invalid namespace", "UTF-8", "steps"):
        assert expected in reasons, (expected, reasons)
    assert all(d.topic == pipe.topics.traces and d.offset >= 0 for d in letters)


def test_combiner_sigkill_loses_nothing_and_applies_nothing_twice(pipe: Pipeline) -> None:
    traces, _ = pipe.traces(300, 4, "ns-kill")
    worker = pipe.start_worker()
    watcher = Watcher(pipe, "ns-kill")
    watcher.start()

    def publish(part: list[dict]) -> threading.Thread:
        thread = threading.Thread(target=pipe.publish_traces, args=(part,), kwargs={"pace_s": 0.02})
        thread.start()
        return thread

    # The traces arrive in four parts, the next while the killed worker restarts, so every restarted worker
    # has traces to learn (all at once, a restart can find everything learned and no window left to apply).
    parts = [traces[i : i + 75] for i in range(0, 300, 75)]
    before = len(pipe.deltas("ns-kill"))
    publishers = [publish(parts[0])]
    kills = 0
    for part in parts[1:]:  # kill the worker (window, map, curate and combine stages) mid-run, three times
        wait_until(lambda b=before: len(pipe.deltas("ns-kill")) > b, 90, "a window to be applied")
        worker.kill()
        kills += 1
        before = len(pipe.deltas("ns-kill"))
        publishers.append(publish(part))
        worker = pipe.start_worker()
    for thread in publishers:
        thread.join()
    pipe.wait_learned({"ns-kill": 300})
    seen = watcher.stop()

    records = pipe.deltas("ns-kill")
    ids = [r.window_id for r in records]
    assert len(ids) == len(set(ids)), "a window was applied twice"
    offsets = sorted(o for r in records for o in r.offsets)
    assert offsets == sorted(set(offsets)) and len(offsets) == 300, "a trace was lost or learned twice"
    assert [r.version for r in records] == list(range(1, len(records) + 1))
    versions = [v for v, _ in seen]
    assert versions == sorted(set(versions)), "a reader saw a version regression"
    for version, prompt in seen:
        check_prompt_matches(pipe, "ns-kill", version, prompt)
    print(f"{kills} SIGKILLs: {len(records)} windows, 300 traces each learned once, versions 1..{versions[-1]}")


#: What a worker logs when an LLM step met the outage after all the client's attempts and waits to retry
#: (workers/context.py, StageContext.retrying).
OUTAGE_WAIT = "LLM endpoint unavailable"


def test_llm_outage_makes_windows_wait_not_drop(pipe: Pipeline) -> None:
    traces, _ = pipe.traces(80, 5, "ns-outage")
    worker = pipe.start_worker()
    pipe.publish_traces(traces[:20])
    pipe.wait_learned({"ns-outage": 20})
    assert pipe.sim is not None
    waits_before = worker.log.read_text(errors="replace").count(OUTAGE_WAIT)
    pipe.sim.set_faults(outage=True)
    pipe.publish_traces(traces[20:])
    # The endpoint is down: a window's LLM step uses up the client's attempts, then waits to retry (logged)
    # instead of dropping or half-applying the window. Wait for that, not for a fixed time.
    wait_until(
        lambda: worker.log.read_text(errors="replace").count(OUTAGE_WAIT) > waits_before,
        120,
        "a window to wait out the LLM outage",
    )
    stuck = pipe.learned("ns-outage")
    assert stuck == 20
    pipe.sim.set_faults(outage=False)
    pipe.wait_learned({"ns-outage": 80})
    records = pipe.deltas("ns-outage")
    assert sum(r.trace_count for r in records) == 80
    assert pipe.sim.stats()["by_status"].get("503", 0) > 0


def test_redis_outage_publishing_retries_and_newest_version_lands(pipe: Pipeline, private_redis: PrivateRedis) -> None:
    pipe.redis_url = private_redis.url
    traces, _ = pipe.traces(120, 6, "ns-redis")
    pipe.start_worker()
    pipe.publish_traces(traces[:30])
    pipe.wait_learned({"ns-redis": 30})
    private_redis.stop()  # Redis goes away: learning must go on
    pipe.publish_traces(traces[30:])
    wait_until(lambda: pipe.learned("ns-redis") >= 120, 120, "learning to continue without Redis")
    private_redis.start()  # back (empty): the newest version must be published
    newest = max(r.version for r in pipe.deltas("ns-redis"))
    wait_until(lambda: pipe.current_version("ns-redis") == newest, 60, "the newest version in Redis")
    assert pipe.published_playbook("ns-redis").version == newest


def test_replay_reproduces_the_playbook_with_the_cache(pipe: Pipeline, tmp_path: Path) -> None:
    import subprocess
    import sys

    traces, truth = pipe.traces(120, 7, "ns-src")
    cache = tmp_path / "cache"
    worker = pipe.start_worker(COMBEE_CACHE_DIR=str(cache))
    pipe.publish_traces(traces, pace_s=0.01)
    pipe.wait_learned({"ns-src": 120})
    source = pipe.published_playbook("ns-src")
    assert pipe.sim is not None
    requests_before = pipe.sim.stats()["requests"]

    def replay(into: str) -> None:
        subprocess.run(
            [sys.executable, "-m", "combee.cli", "replay", "--namespace", "ns-src", "--from", "earliest",
             "--into", into, "--wait", "--timeout", "180"],
            env=pipe.env(), check=True, timeout=240,
        )  # fmt: skip

    replay("ns-copy")
    copy = pipe.published_playbook("ns-copy")
    assert copy.version == source.version
    assert [(b.id, b.section, b.content, b.helpful, b.harmful) for b in copy.bullets] == [
        (b.id, b.section, b.content, b.helpful, b.harmful) for b in source.bullets
    ]
    assert pipe.sim.stats()["requests"] == requests_before, "the replay should be served from the cache"

    worker.stop()  # and without the cache: it completes, within the quality bound
    pipe.start_worker()
    replay("ns-fresh")
    fresh = pipe.published_playbook("ns-fresh")
    ret_fresh = retention(render_prompt(fresh), truth["insights"])
    ret_source = retention(render_prompt(source), truth["insights"])
    assert ret_fresh >= 0.9 * ret_source
