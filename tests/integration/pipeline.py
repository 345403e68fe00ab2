"""Harness for end-to-end tests of the streaming pipeline on the real Kafka and Redis.

A :class:`Pipeline` owns a unique topic/key prefix, a SIMULATED model server (subprocess) and any number of
``combee worker`` subprocesses; it publishes traces with the SDK and reads back what the pipeline wrote
(delta log, dead letters, Redis versions).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from combee.models import Playbook
from combee.playbook import render_prompt
from combee.sim.config import SimConfig
from combee.sim.runner import SimProcess
from combee.sim.world import generate_traces
from streams.codec import decode
from streams.deltalog import split_log
from streams.envelopes import DeadLetter, DeltaRecord
from streams.keys import RedisKeys
from streams.topics import Topics
from tests.integration.streams_support import unique
from tests.support import wait_until


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    log: Path
    terminated: bool = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def terminate(self) -> None:
        """SIGTERM, once, without waiting (:meth:`stop` waits)."""
        if not self.terminated and self.alive():
            self.proc.terminate()
        self.terminated = True

    def stop(self) -> None:
        self.terminate()
        if self.alive():
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Pipeline:
    bootstrap: str
    redis_url: str
    tmp: Path
    partitions: int = 4
    time_scale: float = 0.005
    sim_seed: int = 1
    env_extra: dict[str, str] = field(default_factory=dict)
    prefix: str = field(default_factory=lambda: unique("it"))
    sim: SimProcess | None = None
    workers: list[Worker] = field(default_factory=list)
    base_url: str | None = None  # a real model's endpoint instead of the simulator's

    @property
    def topics(self) -> Topics:
        return Topics(prefix=self.prefix, partitions=self.partitions)

    @property
    def keys(self) -> RedisKeys:
        return RedisKeys(self.prefix)

    def start_sim(self, start_timeout_s: float = 30.0, **config: Any) -> SimProcess:
        self.sim = SimProcess(SimConfig(seed=self.sim_seed, time_scale=self.time_scale, **config), world="combee")
        self.sim.start(start_timeout_s)
        return self.sim

    def env(self, **extra: str) -> dict[str, str]:
        assert self.sim is not None or self.base_url, "start the simulator first (or name a real endpoint)"
        env = {
            **os.environ,
            "OPENAI_BASE_URL": self.base_url or self.sim.base_url,  # type: ignore[union-attr]
            "COMBEE_KAFKA_BOOTSTRAP": self.bootstrap,
            "COMBEE_REDIS_URL": self.redis_url,
            "COMBEE_TOPIC_PREFIX": self.prefix,
            "COMBEE_KEY_PREFIX": self.prefix,
            "COMBEE_PARTITIONS": str(self.partitions),
            "COMBEE_MAX_WAIT_S": "2",
            "COMBEE_LLM_MAX_ATTEMPTS": "3",
            "COMBEE_LLM_BACKOFF_MAX_S": "2",
            # A SIGKILLed worker's partitions move after the group session timeout: the broker's minimum (6 s),
            # as the fault suite uses, not the 10 s default; every kill in these tests pays it.
            "COMBEE_KAFKA_SESSION_TIMEOUT_S": "6",
            **self.env_extra,
            **extra,
        }
        return env

    def create_topics(self, timeout_s: float = 120.0) -> None:
        """``combee topics create`` with this pipeline's settings, as a deployment does before any worker or
        publisher starts (a publisher that finds no topic fails at once: it does not wait for a worker)."""
        self.cli("topics", "create", timeout_s=timeout_s)

    def cli(
        self, *args: str, check: bool = True, timeout_s: float = 180.0, **env: str
    ) -> subprocess.CompletedProcess[str]:
        """``combee ARGS`` with this pipeline's settings (and ``env`` on top). ``check``: assert it exits 0 (with
        its stderr in the message); otherwise the caller reads the exit code."""
        done = subprocess.run(
            [sys.executable, "-m", "combee.cli", *args], env=self.env(**env), capture_output=True, text=True,
            timeout=timeout_s, check=False,
        )  # fmt: skip
        assert not check or done.returncode == 0, f"combee {' '.join(args)} failed ({done.returncode}): {done.stderr}"
        return done

    def start_worker(self, *args: str, **env: str) -> Worker:
        log = self.tmp / f"worker-{len(self.workers)}.log"
        with log.open("wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "combee.cli", "worker", *args],
                env=self.env(**env),
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        worker = Worker(proc, log)
        self.workers.append(worker)
        return worker

    def close(self) -> None:
        for w in self.workers:  # all leave at once (each takes about a second to shut down), then wait
            w.terminate()
        for w in self.workers:
            w.stop()
        if self.sim is not None:
            self.sim.stop()

    # --- input ------------------------------------------------------------------------------------------

    def traces(self, n: int, seed: int, namespace: str, world: str = "formula") -> tuple[list[dict], dict]:
        traces, _, truth = generate_traces(n, seed, namespace=namespace, world=world, test_n=0)
        return traces, truth

    def publish(self, records: Iterable[tuple[bytes | None, bytes]], pace_s: float = 0.0) -> int:
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        count = 0
        for key, value in records:
            producer.send(self.topics.traces, key=key, value=value)
            count += 1
            if pace_s:
                time.sleep(pace_s)
        producer.flush(30)
        producer.close()
        return count

    def publish_traces(self, traces: list[dict], pace_s: float = 0.0) -> int:
        return self.publish(((t["namespace"].encode(), json.dumps(t).encode()) for t in traces), pace_s)

    # --- output -----------------------------------------------------------------------------------------

    def read_topic(self, topic: str) -> list[Any]:
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
        try:
            parts = consumer.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in parts]
            if not tps:
                return []
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            ends = consumer.end_offsets(tps)
            out: list[Any] = []
            while any(consumer.position(tp) < ends[tp] for tp in tps):
                for msgs in consumer.poll(timeout_ms=1000).values():
                    out.extend(msgs)
            return out
        finally:
            consumer.close()

    def deltas(self, namespace: str | None = None) -> list[DeltaRecord]:
        """The valid records of the delta log (streams.deltalog: claims and fenced records count for nobody)."""
        log = split_log((m.partition, m.offset, m.value) for m in self.read_topic(self.topics.deltas))
        return sorted(log.records(namespace), key=lambda r: (r.namespace, r.version))

    def dead_letters(self) -> list[DeadLetter]:
        out = []
        for msg in self.read_topic(self.topics.deadletter):
            rec = decode(msg.value)
            assert isinstance(rec, DeadLetter)
            out.append(rec)
        return out

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, decode_responses=True)

    def current_version(self, namespace: str) -> int:
        value = self.redis().hget(self.keys.current(namespace), "version")
        return int(value) if value else 0

    def published_playbook(self, namespace: str, version: int | None = None) -> Playbook:
        key = self.keys.current(namespace) if version is None else self.keys.version(namespace, version)
        raw = self.redis().hget(key, "playbook")
        assert raw, f"no playbook in Redis at {key}"
        return Playbook.model_validate_json(raw)

    def learned(self, namespace: str) -> int:
        """Traces covered by the windows applied so far (from the delta log)."""
        return sum(r.trace_count for r in self.deltas(namespace))

    def wait_learned(self, expected: dict[str, int], timeout_s: float = 240) -> None:
        def done() -> bool:
            dead = [w for w in self.workers if not w.alive()]
            if dead and not any(w.alive() for w in self.workers):
                raise AssertionError("every worker exited:\n" + dead[-1].tail())
            counts: dict[str, int] = {}
            newest: dict[str, int] = {}
            for rec in self.deltas():  # one read of the log per poll (it was 1 + one per namespace)
                counts[rec.namespace] = counts.get(rec.namespace, 0) + rec.trace_count
                newest[rec.namespace] = max(newest.get(rec.namespace, 0), rec.version)
            return all(counts.get(ns, 0) >= n for ns, n in expected.items()) and all(
                self.current_version(ns) == newest[ns] for ns in expected
            )

        try:
            wait_until(done, timeout_s, f"all traces learned {expected}", poll_s=0.5)
        except AssertionError as exc:
            tail = self.workers[-1].tail() if self.workers else ""
            raise AssertionError(f"{exc}\n--- worker log ---\n{tail}") from None


def check_prompt_matches(pipe: Pipeline, namespace: str, version: int, prompt: str) -> None:
    """The prompt a reader saw for ``version`` is exactly the rendering of that version's playbook."""
    playbook = pipe.published_playbook(namespace, version)
    assert playbook.version == version
    assert render_prompt(playbook) == prompt
