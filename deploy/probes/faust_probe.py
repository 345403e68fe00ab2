"""Compatibility probe: faust-streaming against the broker deploy/local/ runs.

A tiny Faust app (store='memory://', web server on 127.0.0.1) counts words from a topic into a table with a
changelog. Phase 1: 100 records are produced, a worker process counts them and stops gracefully (SIGTERM, as
a real stop). Phase 2: 10 more records are produced and a NEW worker process starts with an empty in-memory
table: it can reach the expected totals only by recovering the table from the changelog topic, and only if
phase 1 committed its offsets (a re-read would over-count). Exit code 0 only if both phases pass.

    python -m deploy.local exec -- .venv/bin/python deploy/probes/faust_probe.py
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from deploy.probes import Checks

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon")


def _dump(path: Path, counts: dict[str, int]) -> None:
    path.write_text(json.dumps(counts))  # a few bytes, once: blocking the loop here is harmless


def _worker(app_id: str, bootstrap: str, target: int, result_path: Path, distinct: bool) -> None:
    """Child process: run one Faust worker until the table's total reaches ``target`` (with ``distinct``:
    until it has seen ``target`` different record values), dump the table, stop."""
    import faust

    with socket.socket() as sock:  # a free port for Faust's web server, on loopback only
        sock.bind(("127.0.0.1", 0))
        web_port = sock.getsockname()[1]
    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        datadir=str(result_path.parent / f"{app_id}-data"),  # default: ./<app id>-data in the cwd
        web_bind="127.0.0.1",
        web_host="127.0.0.1",
        web_port=web_port,
        topic_partitions=2,
        topic_replication_factor=1,
        broker_commit_interval=0.5,
    )
    topic = app.topic(f"{app_id}.words", key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
    counts = app.Table("counts", default=int, partitions=2)
    seen: set[bytes] = set()
    delivered: dict[int, set[int]] = {}  # partition -> offsets the agent received

    @app.agent(topic)
    async def count(stream: Any) -> None:
        async for event in stream.events():
            counts[event.key.decode()] += 1
            seen.add(event.value)
            delivered.setdefault(event.message.partition, set()).add(event.message.offset)
            if (len(seen) if distinct else sum(counts.values())) >= target:
                _dump(result_path, dict(counts.items()))
                os.kill(os.getpid(), signal.SIGTERM)  # graceful stop: commits offsets, flushes changelog

    @app.timer(5.0)
    async def progress() -> None:  # visible in the probe's output if a phase hangs
        gaps = {p: sorted(set(range(min(o), max(o) + 1)) - o) for p, o in delivered.items()}
        print(
            f"  worker {os.getpid()}: table total {sum(counts.values())}, distinct values {len(seen)}, "
            f"offsets never delivered to the agent (inside the range it saw): {gaps}",
            flush=True,
        )

    sys.argv = ["faust-probe", "worker", "-l", os.environ.get("PROBE_FAUST_LOGLEVEL", "warn")]
    app.main()


def remove_datadir(app_id: str) -> None:
    """Faust leaves its (here nearly empty) data directory behind; the probes clean up after themselves."""
    shutil.rmtree(Path(tempfile.gettempdir()) / f"{app_id}-data", ignore_errors=True)


class WorkerProcess:
    """A probe worker in a child process, counting until its table's total reaches ``target``."""

    def __init__(self, app_id: str, bootstrap: str, target: int, distinct: bool = False) -> None:
        self.target = target
        self.result_path = Path(tempfile.gettempdir()) / f"{app_id}-{target}.json"
        self.result_path.unlink(missing_ok=True)
        self.started = time.monotonic()
        argv = [sys.executable, __file__, "worker", app_id, bootstrap, str(target), str(self.result_path)]
        argv += ["distinct"] if distinct else []
        self.child = subprocess.Popen(argv)

    def wait(self, timeout_s: float) -> tuple[dict[str, int], float]:
        """The table's contents when the target was reached, and the seconds since the worker started."""
        try:
            self.child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.child.terminate()
            self.child.wait(30)
            raise AssertionError(f"worker did not reach {self.target} records within {timeout_s:g} s") from None
        if not self.result_path.exists():
            raise AssertionError(f"worker exited ({self.child.returncode}) without a result")
        result = json.loads(self.result_path.read_text())
        self.result_path.unlink()
        return result, time.monotonic() - self.started


def _run_worker(app_id: str, bootstrap: str, target: int, timeout_s: float) -> tuple[dict[str, int], float]:
    return WorkerProcess(app_id, bootstrap, target).wait(timeout_s)


def _offsets(app_id: str, bootstrap: str) -> str:
    """Source topic end offsets, the worker group's committed offsets and the changelog's contents."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.admin import KafkaAdminClient

    source = [TopicPartition(f"{app_id}.words", p) for p in (0, 1)]
    changelog = [TopicPartition(f"{app_id}-counts-changelog", p) for p in (0, 1)]
    reader = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=3000)
    ends = {tp.partition: offset for tp, offset in reader.end_offsets(source).items()}
    reader.assign(changelog)
    latest = {record.key.decode(): record.value.decode() for record in reader if record.key and record.value}
    reader.close()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    offsets = admin.list_group_offsets(app_id)[app_id]  # kafka-python 3.0: {group: {tp: OffsetAndMetadata}}
    committed = {tp.partition: meta.offset for tp, meta in offsets.items()}
    admin.close()
    return f"source end offsets {ends}, committed {committed}, changelog latest {latest}"


def main() -> int:
    bootstrap = os.environ["COMBEE_KAFKA_BOOTSTRAP"]
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    checks = Checks("faust")
    app_id = f"probe-faust-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(f"{app_id}.words", num_partitions=2, replication_factor=1)])
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    expected: Counter[str] = Counter()
    for i in range(100):
        word = WORDS[i % len(WORDS)]
        producer.send(f"{app_id}.words", key=word.encode(), value=b"x")
        expected[word] += 1
    producer.flush()

    with checks.step("worker consumes a topic and updates a changelog-backed table"):
        counts, elapsed = _run_worker(app_id, bootstrap, 100, 120)
        print(f"  phase 1: {counts} in {elapsed:.1f} s (including worker start and stop)")
        print(f"  after phase 1: {_offsets(app_id, bootstrap)}")
        assert counts == dict(expected), counts
    with checks.step("changelog topic exists and is compacted"):
        from kafka.admin import ConfigResource, ConfigResourceType

        changelog = f"{app_id}-counts-changelog"
        assert changelog in admin.list_topics()
        configs = repr(admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, changelog)]))
        assert "compact" in configs, configs[:400]

    for _ in range(10):
        producer.send(f"{app_id}.words", key=b"alpha", value=b"x")
        expected["alpha"] += 1
    producer.flush()
    with checks.step("a restarted worker recovers the table from the changelog and continues"):
        try:
            counts, elapsed = _run_worker(app_id, bootstrap, 110, 120)
        except AssertionError:
            print(f"  diagnosis: {_offsets(app_id, bootstrap)}")
            raise
        print(f"  phase 2: {counts} in {elapsed:.1f} s (including recovery)")
        assert counts == dict(expected), f"{counts} != {dict(expected)}"

    producer.close()
    admin.close()
    remove_datadir(app_id)
    return checks.report()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        _worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), Path(sys.argv[5]), "distinct" in sys.argv[6:])
    else:
        sys.exit(main())
