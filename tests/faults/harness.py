"""The fault suite's harness: one scenario run of the REAL pipeline, driven from outside.

A :class:`Run` owns a unique topic/key prefix on the suite's private Kafka + Redis (:mod:`tests.faults.stack`),
its own SIMULATED model server (a :class:`~combee.sim.runner.SimProcess` whose faults are switched at run
time) and any number of ``combee worker`` subprocesses that the scenario starts, SIGKILLs, restarts, adds and
removes. Around them:

* :class:`Producer` — a plain kafka-python producer (not Combee's SDK, which would refuse bad records) that
  records where every record landed, or that the broker refused it;
* :class:`PacedPublisher` — publishes a fixed list of records at a steady rate in a background thread, so
  traces keep arriving while faults happen;
* :class:`PromptWatcher` — a reader polling Redis the way an agent would, recording every (version, prompt,
  playbook) it sees, so version regressions and torn reads are counted from the reader's side;
* :class:`TopicTail` — incremental reads of a topic (the delta log, dead letters, the traces themselves);
* RSS sampling of every worker process (``/proc/<pid>/status``).

A worker process that exits without the scenario having killed or stopped it is a *crash* (counted; the suite
requires 0). Nothing here knows what the invariants are: :mod:`tests.faults.invariants` reads what a run left.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from combee.models import Playbook
from combee.sim.config import SimConfig
from combee.sim.runner import SimProcess
from streams.keys import RedisKeys
from streams.topics import TRACES_MAX_MESSAGE_BYTES, Topics
from tests.faults.stack import PrivateStack
from tests.support import wait_until

__all__ = [
    "PacedPublisher",
    "Producer",
    "PromptWatcher",
    "Record",
    "Run",
    "Sent",
    "TopicTail",
    "WorkerProc",
    "wait_until",
]

REPO = Path(__file__).resolve().parents[2]


def _die_with_parent() -> None:
    """In a child: get SIGTERM when the test process dies, so no worker outlives an interrupted suite."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def rss_kib(pid: int) -> int | None:
    """Resident set size of ``pid`` in KiB (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


# --------------------------------------------------------------------------------------------------------
# Workers
# --------------------------------------------------------------------------------------------------------


@dataclass
class WorkerProc:
    """One ``combee worker`` subprocess. ``expected_exit`` is set before the harness kills or stops it."""

    name: str
    role: str
    proc: subprocess.Popen[bytes]
    log: Path
    started_at: float = field(default_factory=time.monotonic)
    expected_exit: bool = False
    env: dict[str, str] = field(default_factory=dict)  # what start_worker set beyond the run's environment
    rss: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, KiB)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def crashed(self) -> bool:
        return not self.alive() and not self.expected_exit

    def kill(self) -> None:
        """SIGKILL: no shutdown, no commit, no flush — a crash from the pipeline's point of view."""
        self.expected_exit = True
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def terminate(self) -> None:
        """SIGTERM, once (a graceful leave), without waiting: :meth:`stop` waits."""
        if not self.expected_exit and self.alive():
            self.proc.terminate()
        self.expected_exit = True

    def stop(self, timeout_s: float = 40) -> None:
        """SIGTERM (a graceful leave, unless :meth:`terminate` sent it); SIGKILL if it does not exit in time."""
        self.terminate()
        if self.alive():
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def joined(self) -> bool:
        """True once the worker logged that its partitions were assigned (it takes part in the group)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "Ready" in text or "assigned" in text.lower()


# --------------------------------------------------------------------------------------------------------
# Producing
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """A record to publish on the traces topic. ``label`` says what it is meant to test (for the report)."""

    key: bytes | None
    value: bytes | None
    label: str = "good"


@dataclass
class Sent:
    """What became of a record: where it landed, or the broker's refusal."""

    record: Record
    partition: int | None = None
    offset: int | None = None
    refused: str | None = None


class Producer:
    """A plain kafka-python producer for the traces topic that records the fate of every record.

    ``idempotent`` (default) keeps the producer's own retries from duplicating records across a broker
    restart, as any careful agent-side producer would be configured. Records larger than the broker's
    limit (the traces topic's max.message.bytes) are sent by a second, non-idempotent producer whose
    client-side limit is higher than the broker's, so that it is the BROKER that refuses them (and the
    idempotent producer's sequence is not disturbed by a refused batch).
    """

    BIG = 1024 * 1024

    def __init__(self, bootstrap: str, topic: str, *, idempotent: bool = True) -> None:
        self.topic = topic
        common: dict[str, Any] = {"bootstrap_servers": bootstrap, "acks": "all", "linger_ms": 5}
        self._small = KafkaProducer(
            **common, enable_idempotence=idempotent, max_request_size=2 * self.BIG, delivery_timeout_ms=180_000
        )
        self._big: KafkaProducer | None = None
        self._bootstrap = bootstrap
        self.sent: list[Sent] = []
        self._lock = threading.Lock()

    def _big_producer(self) -> KafkaProducer:
        if self._big is None:
            self._big = KafkaProducer(
                bootstrap_servers=self._bootstrap,
                acks="all",
                enable_idempotence=False,
                max_request_size=64 * self.BIG,
                retries=0,
            )
        return self._big

    def send(self, record: Record) -> Sent:
        sent = Sent(record)
        with self._lock:
            self.sent.append(sent)
        big = (
            len(record.value or b"") > TRACES_MAX_MESSAGE_BYTES
        )  # the broker refuses it: keep it off the idempotent one
        producer = self._big_producer() if big else self._small
        future = producer.send(self.topic, key=record.key, value=record.value)

        def ok(md: Any) -> None:
            sent.partition, sent.offset = md.partition, md.offset

        def failed(exc: BaseException) -> None:
            sent.refused = f"{type(exc).__name__}: {exc}"[:300]

        future.add_callback(ok)
        future.add_errback(failed)
        if big:
            try:
                producer.flush(60)
            except Exception as exc:  # the errback has recorded the refusal already
                sent.refused = sent.refused or f"{type(exc).__name__}: {exc}"[:300]
        return sent

    def flush(self, timeout_s: float = 180) -> None:
        self._small.flush(timeout_s)
        if self._big is not None:
            self._big.flush(timeout_s)

    def close(self) -> None:
        self.flush()
        self._small.close(30)
        if self._big is not None:
            self._big.close(30)

    def pending(self) -> int:
        return sum(1 for s in self.sent if s.offset is None and s.refused is None)


class PacedPublisher(threading.Thread):
    """Publishes ``records`` in order at ``rate`` records/s (in small bursts), in the background."""

    def __init__(self, producer: Producer, records: Sequence[Record], rate: float) -> None:
        super().__init__(daemon=True, name="paced-publisher")
        self.producer = producer
        self.records = list(records)
        self.rate = rate
        self.done_count = 0
        self.error: BaseException | None = None
        self.hurry = threading.Event()

    def run(self) -> None:
        try:
            started = time.monotonic()
            for i, record in enumerate(self.records):
                due = started + i / self.rate
                while not self.hurry.is_set() and time.monotonic() < due:
                    time.sleep(min(0.05, max(0.0, due - time.monotonic())))
                self.producer.send(record)
                self.done_count = i + 1
            self.producer.flush()
        except BaseException as exc:  # surfaced by the scenario (join_checked)
            self.error = exc

    def join_checked(self, timeout_s: float = 600) -> None:
        self.join(timeout_s)
        if self.is_alive():
            raise AssertionError("the publisher did not finish in time")
        if self.error is not None:
            raise AssertionError(f"publishing failed: {self.error!r}")


# --------------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class TopicTail:
    """Reads a topic incrementally: each :meth:`poll` returns the records appended since the last call."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            group_id=None,
            max_partition_fetch_bytes=16 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
            request_timeout_ms=60_000,
        )
        self._tps: list[TopicPartition] = []
        self.records: list[TopicRecord] = []

    def _assign(self) -> bool:
        if self._tps:
            return True
        parts = self._consumer.partitions_for_topic(self.topic) or set()
        if not parts:
            return False
        self._tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        self._consumer.assign(self._tps)
        self._consumer.seek_to_beginning(*self._tps)
        return True

    def poll(self, timeout_s: float = 60) -> list[TopicRecord]:
        if not self._assign():
            return []
        ends = self._consumer.end_offsets(self._tps)
        out: list[TopicRecord] = []
        deadline = time.monotonic() + timeout_s
        while any(self._consumer.position(tp) < ends[tp] for tp in self._tps):
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {self.topic} did not reach its end offsets in {timeout_s}s")
            for msgs in self._consumer.poll(timeout_ms=500, max_records=2000).values():
                # records past the end offsets seen above are kept too: the position has moved past them
                out.extend(TopicRecord(m.partition, m.offset, m.key, m.value) for m in msgs)
        self.records.extend(out)
        return out

    def close(self) -> None:
        self._consumer.close()


@dataclass(frozen=True)
class Seen:
    at: float
    version: int
    prompt: str
    playbook_json: str


class PromptWatcher(threading.Thread):
    """An agent-like reader: polls the current prompt of ``namespaces`` in Redis (one HMGET each, like
    :class:`streams.client.PromptClient`) and records every change it observes. Redis being down is normal
    during some scenarios: the reader retries, like an agent keeping its cached prompt."""

    def __init__(self, run: Run, namespaces: Iterable[str], poll_s: float = 0.2) -> None:
        super().__init__(daemon=True, name="prompt-watcher")
        self.run_ = run
        self.namespaces = sorted(namespaces)
        self.poll_s = poll_s
        self.seen: dict[str, list[Seen]] = {ns: [] for ns in self.namespaces}
        self.errors = 0
        self._halt = threading.Event()

    def run(self) -> None:
        client = self.run_.redis(socket_timeout=2)
        while not self._halt.is_set():
            for ns in self.namespaces:
                try:
                    version, prompt, playbook = client.hmget(
                        self.run_.keys.current(ns), ["version", "prompt", "playbook"]
                    )
                except redis.RedisError:
                    self.errors += 1
                    continue
                if version is None:
                    continue
                seen = self.seen[ns]
                if not seen or seen[-1].version != int(version) or seen[-1].prompt != prompt:
                    seen.append(Seen(time.monotonic(), int(version), prompt or "", playbook or ""))
            self._halt.wait(self.poll_s)
        client.close()

    def stop(self) -> dict[str, list[Seen]]:
        self._halt.set()
        self.join(timeout=10)
        return self.seen


# --------------------------------------------------------------------------------------------------------
# A run
# --------------------------------------------------------------------------------------------------------

#: Worker settings of every scenario (a scenario may override some). Failover after a SIGKILL takes about the
#: session timeout, so the minimum is used; LLM timeouts are short so that the simulator's hung requests (a
#: "timeout" fault hangs for longer than this) cost seconds, not minutes.
WORKER_ENV = {
    "COMBEE_PARTITIONS": "4",
    "COMBEE_MAX_WAIT_S": "2",
    "COMBEE_KAFKA_SESSION_TIMEOUT_S": "6",
    "COMBEE_LLM_TIMEOUT_S": "3",
    "COMBEE_LLM_MAX_ATTEMPTS": "4",
    "COMBEE_LLM_BACKOFF_MAX_S": "2",
}

#: The simulator of every scenario: 200× faster than the modelled latencies; a timeout fault hangs
#: 2000 × 0.005 = 10 s (more than COMBEE_LLM_TIMEOUT_S), a 429 says Retry-After 200 × 0.005 = 1 s.
SIM_DEFAULTS: dict[str, Any] = {"seed": 1, "time_scale": 0.005, "timeout_hang_s": 2000.0, "retry_after_s": 200.0}


@dataclass
class Run:
    """One scenario run (see the module docstring)."""

    stack: PrivateStack
    workdir: Path
    name: str
    api_key: str
    partitions: int = 4
    env_extra: dict[str, str] = field(default_factory=dict)
    prefix: str = ""
    sim: SimProcess | None = None
    workers: list[WorkerProc] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)
    rss_samples: list[dict[str, Any]] = field(default_factory=list)
    _sampler: threading.Thread | None = None
    _sampling: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.prefix = self.prefix or f"fx-{self.name}-{uuid.uuid4().hex[:8]}"
        self.workdir.mkdir(parents=True, exist_ok=True)

    # --- names and clients ---------------------------------------------------------------------------

    @property
    def topics(self) -> Topics:
        return Topics(prefix=self.prefix, partitions=self.partitions)

    @property
    def keys(self) -> RedisKeys:
        return RedisKeys(self.prefix)

    def redis(self, socket_timeout: float = 5) -> redis.Redis:
        return redis.Redis.from_url(
            self.stack.redis_url,
            password=self.stack.redis_password,
            decode_responses=True,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
        )

    def note(self, what: str) -> None:
        self.events.append((round(time.monotonic() - self.started_at, 1), what))
        print(f"    [{self.name} +{time.monotonic() - self.started_at:6.1f}s] {what}", flush=True)

    # --- processes -------------------------------------------------------------------------------------

    def start_sim(self, **config: Any) -> SimProcess:
        self.sim = SimProcess(SimConfig(**{**SIM_DEFAULTS, **config}), world="combee")
        self.sim.start()
        return self.sim

    def env(self, **extra: str) -> dict[str, str]:
        assert self.sim is not None, "start the simulator first"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("COMBEE_", "OPENAI_"))}
        env.update(
            {
                "OPENAI_BASE_URL": self.sim.base_url,
                "OPENAI_API_KEY": self.api_key,
                "COMBEE_KAFKA_BOOTSTRAP": self.stack.bootstrap,
                "COMBEE_REDIS_URL": self.stack.redis_url,
                "COMBEE_REDIS_PASSWORD": self.stack.redis_password,
                "COMBEE_TOPIC_PREFIX": self.prefix,
                "COMBEE_KEY_PREFIX": self.prefix,
                "COMBEE_STATE_DIR": str(self.workdir / "state"),
                "PYTHONUNBUFFERED": "1",
                **WORKER_ENV,
                "COMBEE_PARTITIONS": str(self.partitions),
                **self.env_extra,
                **extra,
            }
        )
        return {k: v for k, v in env.items() if v != ""}  # "" unsets a variable

    def start_worker(self, role: str = "all", **env: str) -> WorkerProc:
        name = f"{role}-{sum(1 for w in self.workers if w.role == role)}"
        log = self.workdir / f"worker-{name}.log"
        with log.open("wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "combee.cli", "worker", "--role", role],
                env=self.env(**env),
                stdout=fh,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                preexec_fn=_die_with_parent,
            )
        worker = WorkerProc(name, role, proc, log, env=dict(env))
        self.workers.append(worker)
        self.note(f"started worker {name} (pid {proc.pid})")
        return worker

    def live(self, role: str | None = None) -> list[WorkerProc]:
        return [w for w in self.workers if w.alive() and (role is None or w.role == role)]

    def crashes(self) -> list[WorkerProc]:
        return [w for w in self.workers if w.crashed()]

    def check_no_crash(self) -> None:
        crashed = self.crashes()
        if crashed:
            w = crashed[0]
            raise AssertionError(
                f"worker {w.name} (pid {w.pid}) exited by itself with status {w.proc.returncode}:\n{w.tail()}"
            )

    def kill_and_restart(self, worker: WorkerProc) -> WorkerProc:
        worker.kill()
        self.note(f"SIGKILL worker {worker.name} (pid {worker.pid})")
        return self.start_worker(worker.role, **worker.env)

    # --- RSS sampling ----------------------------------------------------------------------------------

    def start_rss_sampling(self, every_s: float = 10.0) -> None:
        def sample() -> None:
            while not self._sampling.wait(every_s):
                t = round(time.monotonic() - self.started_at, 1)
                row: dict[str, Any] = {"t": t}
                for w in self.live():
                    kib = rss_kib(w.pid)
                    if kib is not None:
                        w.rss.append((t, kib))
                        row[w.name] = kib
                if self.sim is not None and self.sim.pid is not None:
                    kib = rss_kib(self.sim.pid)
                    if kib is not None:
                        row["simulator"] = kib
                self.rss_samples.append(row)

        self._sampler = threading.Thread(target=sample, daemon=True, name="rss-sampler")
        self._sampler.start()

    # --- Kafka views -----------------------------------------------------------------------------------

    def ensure_topics(self) -> None:
        """Create the run's topics (the workers would too, but the producer may start first)."""
        from streams.kafka_config import ensure_topics

        ensure_topics(self.stack.bootstrap, self.topics)

    def producer(self) -> Producer:
        return Producer(self.stack.bootstrap, self.topics.traces)

    def consumer_lag(self) -> int | None:
        """Sum over the traces partitions of end offset − the worker group's committed offset."""
        admin = KafkaAdminClient(bootstrap_servers=self.stack.bootstrap, request_timeout_ms=10_000)
        consumer = KafkaConsumer(bootstrap_servers=self.stack.bootstrap, group_id=None)
        try:
            group = f"{self.prefix}-worker"
            tps = [TopicPartition(self.topics.traces, p) for p in range(self.partitions)]
            committed = admin.list_group_offsets({group: tps}).get(group, {})
            ends = consumer.end_offsets(tps)
            total = 0
            for tp in tps:
                meta = committed.get(tp)
                done = meta.offset if meta is not None and meta.offset >= 0 else 0
                total += max(0, ends[tp] - done)
            return total
        except Exception:  # a sample, not a check: the broker may be restarting
            return None
        finally:
            admin.close()
            consumer.close()

    # --- end ---------------------------------------------------------------------------------------------

    def close(self) -> None:
        self._sampling.set()
        for w in self.workers:  # all leave at once: each takes about a second to shut down
            w.terminate()
        for w in self.workers:
            w.stop()
        if self.sim is not None:
            self.sim.stop()
        if self._sampler is not None:
            self._sampler.join(timeout=15)

    def save(self, name: str, obj: Any) -> Path:
        path = self.workdir / name
        path.write_text(json.dumps(obj, indent=2, default=str))
        return path


def published_playbook(raw: str | None) -> Playbook | None:
    return Playbook.model_validate_json(raw) if raw else None
