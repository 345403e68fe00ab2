"""``combee bench --streaming``: latency of the streaming pipeline at a steady trace rate (SIMULATED model).

For every applied window it measures, on the wall clock of this machine:

* ``latency_s`` — from the moment the window's *last trace* was published (its Kafka record timestamp) to
  the moment a :class:`streams.client.PromptClient` watcher first read the window's version from Redis;
* ``critical_path_s`` — the window's ideal processing time if the framework added nothing: the slowest
  reflector call plus the longest chain of curator/merge service times through its reduce tree, as the
  simulator reported them (``x-combee-service-time``);
* ``overhead_s = latency_s − critical_path_s`` — everything else: Kafka hops, queueing behind the previous
  window, scheduling, the LLM client, the Redis publish. Split into ``close_wait_s`` (last trace → window
  closed) and the rest.

It starts what it needs (Kafka + Redis via deploy/local/ unless ``COMBEE_KAFKA_BOOTSTRAP`` and
``COMBEE_REDIS_URL`` are set; the simulator; one worker) and stops what it started.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from deploy.worker import spawn_worker

__all__ = ["StreamingConfig", "applied_deltas", "local_services", "run_streaming_bench", "wait_worker_ready"]


@dataclass(frozen=True)
class StreamingConfig:
    rate: float = 20.0  # traces per second (all namespaces together)
    duration_s: float = 60.0
    namespaces: int = 2
    time_scale: float = 0.05
    seed: int = 1
    max_wait_s: float = 5.0
    out: Path = Path("var/bench-streaming")


def _quantile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def run_streaming_bench(cfg: StreamingConfig) -> dict[str, Any]:
    from combee.sim.config import SimConfig
    from combee.sim.runner import SimProcess

    cfg.out.mkdir(parents=True, exist_ok=True)
    bootstrap, redis_url, stop_services = local_services()
    prefix = f"sbench{int(time.time())}"
    namespaces = [f"stream-{i}" for i in range(cfg.namespaces)]
    worker: subprocess.Popen[bytes] | None = None
    try:
        with SimProcess(SimConfig(seed=cfg.seed, time_scale=cfg.time_scale), world="combee") as sim:
            worker = spawn_worker(
                cfg.out / "worker.log",
                base_url=sim.base_url,
                bootstrap=bootstrap,
                redis_url=redis_url,
                prefix=prefix,
                max_wait_s=cfg.max_wait_s,
            )
            wait_worker_ready(cfg.out / "worker.log", worker)
            watchers = [_Watcher(redis_url, prefix, ns) for ns in namespaces]
            for w in watchers:
                w.start()
            published = _publish(bootstrap, prefix, namespaces, cfg)
            _wait_applied(bootstrap, prefix, published, worker, timeout_s=cfg.duration_s * 3 + 120)
            time.sleep(2.0)  # let the watchers see the last versions
            seen = {w.namespace: w.stop() for w in watchers}
            rows = _windows(bootstrap, prefix, namespaces, seen)
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=60)
        stop_services()
    result = _summarise(cfg, rows)
    (cfg.out / "streaming.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (cfg.out / "streaming.md").write_text(_markdown(result))
    return result


def wait_worker_ready(log: Path, worker: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Publishing starts once the worker has joined its group (its log says Ready), as in steady state."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "Worker]: Ready" in log.read_text(errors="replace"):
            time.sleep(1.0)
            return
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited during start-up (see {log})")
        time.sleep(0.2)
    raise TimeoutError(f"the worker was not ready within {timeout_s:.0f}s (see {log})")


def local_services() -> tuple[str, str, Any]:
    bootstrap, redis_url = os.environ.get("COMBEE_KAFKA_BOOTSTRAP"), os.environ.get("COMBEE_REDIS_URL")
    if bootstrap and redis_url:
        return bootstrap, redis_url, lambda: None
    from deploy import local

    services = local.up()
    return (
        services.kafka_bootstrap,
        services.redis_url,
        lambda: local.down(services=services.started) if services.started else None,
    )


class _Watcher(threading.Thread):
    """Records the wall-clock time each version of a namespace is first readable from Redis."""

    def __init__(self, redis_url: str, prefix: str, namespace: str) -> None:
        super().__init__(daemon=True)
        from streams.client import PromptClient

        self.namespace = namespace
        self.client = PromptClient(redis_url, namespace, key_prefix=prefix, poll_interval_s=0.2)
        self.first_seen: dict[int, float] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        last = None
        while not self._halt.is_set():
            for v in self.client.watch(timeout=0.5, after=last):
                self.first_seen.setdefault(v.version, time.time())
                last = v.version

    def stop(self) -> dict[int, float]:
        self._halt.set()
        self.join(timeout=5)
        self.client.close()
        return self.first_seen


def _publish(bootstrap: str, prefix: str, namespaces: list[str], cfg: StreamingConfig) -> dict[str, int]:
    from combee.sim.world import generate_traces
    from streams.publisher import TracePublisher
    from streams.topics import Topics

    total = int(cfg.rate * cfg.duration_s)
    per_ns = max(1, total // len(namespaces))
    sets = [generate_traces(per_ns, cfg.seed + i, namespace=ns, test_n=0)[0] for i, ns in enumerate(namespaces)]
    started = time.monotonic()
    with TracePublisher(bootstrap, Topics(prefix=prefix)) as pub:
        for i, trace in enumerate(t for group in zip(*sets, strict=True) for t in group):
            delay = started + i / cfg.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            pub.publish(trace)
            if i % 20 == 0:
                pub.flush(10)  # keep record timestamps close to the intended send times
        pub.flush(30)
    return {ns: per_ns for ns in namespaces}


def applied_deltas(bootstrap: str, prefix: str) -> list[Any]:
    from kafka import KafkaConsumer, TopicPartition

    from streams.deltalog import LogJudge
    from streams.envelopes import DeltaRecord
    from streams.topics import Topics

    topic = Topics(prefix=prefix).deltas
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        judge = LogJudge()  # only valid records count (streams/deltalog.py): no claim, no fenced record
        out = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for msgs in consumer.poll(timeout_ms=1000).values():
                for m in msgs:
                    verdict, rec = judge.judge(m.partition, m.offset, m.value)
                    if verdict == "valid" and isinstance(rec, DeltaRecord):
                        out.append(rec)
        return out
    finally:
        consumer.close()


def _wait_applied(
    bootstrap: str, prefix: str, expected: dict[str, int], worker: subprocess.Popen[bytes], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        learned: dict[str, int] = {}
        for rec in applied_deltas(bootstrap, prefix):
            learned[rec.namespace] = learned.get(rec.namespace, 0) + rec.trace_count
        if all(learned.get(ns, 0) >= n for ns, n in expected.items()):
            return
        if worker.poll() is not None:
            raise RuntimeError("the worker exited before learning every trace (see worker.log)")
        time.sleep(1.0)
    raise TimeoutError(f"not every trace was learned within {timeout_s:.0f}s")


def _trace_timestamps(bootstrap: str, prefix: str, wanted: set[tuple[int, int]]) -> dict[tuple[int, int], float]:
    """Kafka CreateTime (seconds) of the traces-topic records at the given (partition, offset)s."""
    from kafka import KafkaConsumer, TopicPartition

    from streams.topics import Topics

    topic = Topics(prefix=prefix).traces
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    out: dict[tuple[int, int], float] = {}
    try:
        for part, offset in sorted(wanted):
            tp = TopicPartition(topic, part)
            consumer.assign([tp])
            consumer.seek(tp, offset)
            for _ in range(10):
                msgs = consumer.poll(timeout_ms=1000).get(tp, [])
                hit = [m for m in msgs if m.offset == offset]
                if hit:
                    out[(part, offset)] = hit[0].timestamp / 1000.0
                    break
        return out
    finally:
        consumer.close()


@dataclass(frozen=True)
class WindowRow:
    namespace: str
    version: int
    window_id: str
    traces: int
    latency_s: float
    critical_path_s: float
    overhead_s: float
    close_wait_s: float


def _windows(bootstrap: str, prefix: str, namespaces: list[str], seen: dict[str, dict[int, float]]) -> list[WindowRow]:
    records = [r for r in applied_deltas(bootstrap, prefix) if r.namespace in namespaces and r.source and r.offsets]
    wanted = {(int(r.source[1:]), r.last_offset) for r in records if r.source.startswith("p")}
    stamps = _trace_timestamps(bootstrap, prefix, wanted)
    rows = []
    for r in records:
        last = stamps.get((int(r.source[1:]), r.last_offset))
        readable = seen.get(r.namespace, {}).get(r.version)
        if last is None or readable is None:
            continue
        latency = readable - last
        rows.append(
            WindowRow(
                namespace=r.namespace,
                version=r.version,
                window_id=r.window_id,
                traces=r.trace_count,
                latency_s=latency,
                critical_path_s=r.critical_path_s,
                overhead_s=latency - r.critical_path_s,
                close_wait_s=max(0.0, (r.closed_at or last) - last),
            )
        )
    return rows


def _summarise(cfg: StreamingConfig, rows: list[WindowRow]) -> dict[str, Any]:
    def stats(values: list[float]) -> dict[str, float | None]:
        if not values:
            return {"p50": None, "p95": None, "max": None}
        return {"p50": _quantile(values, 0.5), "p95": _quantile(values, 0.95), "max": max(values)}

    # Steady state: every window but each namespace's last one, which closes by max_wait because the
    # stream stopped (its last trace then waits up to max_wait by design, not by overhead).
    last: dict[str, int] = {}
    for r in rows:
        last[r.namespace] = max(last.get(r.namespace, 0), r.version)
    steady = [r for r in rows if r.version != last[r.namespace]]

    def block(selected: list[WindowRow]) -> dict[str, Any]:
        return {
            "windows": len(selected),
            "latency_s": stats([r.latency_s for r in selected]),
            "critical_path_s": stats([r.critical_path_s for r in selected]),
            "overhead_s": stats([r.overhead_s for r in selected]),
            "close_wait_s": stats([r.close_wait_s for r in selected]),
        }

    steady_block = block(steady)
    p95 = steady_block["overhead_s"]["p95"]
    return {
        "simulated": True,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
        "steady": steady_block,
        "all": block(rows),
        "target_p95_overhead_le_1s": p95 is not None and p95 <= 1.0,
        "rows": [asdict(r) for r in rows],
    }


def _markdown(result: dict[str, Any]) -> str:
    def fmt(d: dict[str, float | None]) -> str:
        return " / ".join("-" if d[k] is None else f"{d[k]:.3f}" for k in ("p50", "p95", "max"))

    c, st, al = result["config"], result["steady"], result["all"]
    return (
        "## Streaming latency (SIMULATED model)\n\n"
        f"{c['rate']} traces/s for {c['duration_s']} s over {c['namespaces']} namespaces, time scale "
        f"{c['time_scale']}, max_wait {c['max_wait_s']} s. Steady state = every window except each namespace's "
        f"last (closed by max_wait when the stream stopped): {st['windows']} of {al['windows']} windows.\n\n"
        "| seconds (p50 / p95 / max) | steady state | all windows |\n|---|---|---|\n"
        f"| last trace → version readable in Redis | {fmt(st['latency_s'])} | {fmt(al['latency_s'])} |\n"
        f"| window critical path (simulated service times) | {fmt(st['critical_path_s'])} | "
        f"{fmt(al['critical_path_s'])} |\n"
        f"| overhead above the critical path | {fmt(st['overhead_s'])} | {fmt(al['overhead_s'])} |\n"
        f"| of which: last trace → window closed | {fmt(st['close_wait_s'])} | {fmt(al['close_wait_s'])} |\n\n"
        f"Target p95 overhead ≤ 1 s (steady state): {'met' if result['target_p95_overhead_le_1s'] else 'MISSED'}.\n"
    )
