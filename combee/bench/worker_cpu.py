"""Worker CPU per trace and throughput for one namespace (issue 16's measurement; SIMULATED model).

``python -m combee.bench.worker_cpu --traces 3000 --workers 1 --time-scale 0.001 --out var/bench-cpu``

Starts the simulator (``--time-scale 0.001``: it answers almost at once, so the workers' own CPU shows) and
``--workers`` ``combee worker`` processes, waits until every worker has joined its group, publishes the
traces as fast as the producer goes, and waits until the delta log covers every trace. It reports, per worker,
the CPU time (user + system, from ``/proc/<pid>/stat``) spent between "ready" and "every trace applied",
divided by the traces published, the reflector calls each worker made (its ``/metrics``), and the traces per
second from the first publish to the last window applied. Kafka and Redis come from ``COMBEE_KAFKA_BOOTSTRAP``
and ``COMBEE_REDIS_URL`` (run it under ``python -m deploy.local exec --``) or are started by deploy/local.

Linux only (``/proc``). The figures are this machine's, with whatever else runs on it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from combee.bench.streaming import applied_deltas, local_services, wait_worker_ready
from deploy.worker import spawn_worker

__all__ = ["main", "measure"]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _reflector_calls(port: int) -> float:
    from combee.metrics_prometheus import sample_sum

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sample_sum(text, "combee_llm_calls_total", role="reflector")


def measure(
    *,
    traces: int,
    workers: int,
    time_scale: float,
    out: Path,
    namespace: str = "cpu-bench",
    seed: int = 1,
    profile: bool = False,
) -> dict[str, Any]:
    """Run the measurement (module docstring); with ``profile``, each worker runs under cProfile and writes
    ``out/worker-N.prof`` when it stops (start-up included: read it for the per-trace functions)."""
    from combee.sim.config import SimConfig
    from combee.sim.runner import SimProcess
    from combee.sim.world import generate_traces
    from streams.publisher import TracePublisher
    from streams.topics import Topics

    out.mkdir(parents=True, exist_ok=True)
    bootstrap, redis_url, stop_services = local_services()
    prefix = f"cpubench{int(time.time())}"
    records = generate_traces(traces, seed, namespace=namespace, test_n=0)[0]
    procs: list[subprocess.Popen[bytes]] = []
    ports: list[int] = []
    try:
        with SimProcess(SimConfig(seed=seed, time_scale=time_scale), world="combee") as sim:
            for i in range(workers):
                ports.append(_free_port())
                os.environ["COMBEE_METRICS_PORT"] = str(ports[-1])
                procs.append(
                    spawn_worker(
                        out / f"worker-{i}.log",
                        base_url=sim.base_url,
                        bootstrap=bootstrap,
                        redis_url=redis_url,
                        prefix=prefix,
                        max_wait_s=2.0,
                        python_args=("-m", "cProfile", "-o", str(out / f"worker-{i}.prof")) if profile else (),
                    )
                )
            os.environ.pop("COMBEE_METRICS_PORT", None)
            for i, proc in enumerate(procs):
                wait_worker_ready(out / f"worker-{i}.log", proc, timeout_s=900)
            time.sleep(3.0)  # the last joiner's rebalance settles
            cpu0 = [_cpu_s(p.pid) for p in procs]
            started = time.monotonic()
            with TracePublisher(bootstrap, Topics(prefix=prefix)) as pub:
                for record in records:
                    pub.publish(record)
                pub.flush(60)
            published_s = time.monotonic() - started
            deadline = started + 1800
            while sum(r.trace_count for r in applied_deltas(bootstrap, prefix) if r.namespace == namespace) < traces:
                if time.monotonic() > deadline:
                    raise TimeoutError("not every trace was learned within 30 minutes")
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a worker exited (see {out})")
                time.sleep(0.5)
            elapsed = time.monotonic() - started
            cpu = [_cpu_s(p.pid) - c for p, c in zip(procs, cpu0, strict=True)]
            calls = [_reflector_calls(port) for port in ports]
            windows = len([r for r in applied_deltas(bootstrap, prefix) if r.namespace == namespace])
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        stop_services()
    result = {
        "traces": traces,
        "workers": workers,
        "time_scale": time_scale,
        "publish_s": round(published_s, 2),
        "elapsed_s": round(elapsed, 2),
        "traces_per_s": round(traces / elapsed, 1),
        "worker_cpu_s": [round(c, 2) for c in cpu],
        "cpu_ms_per_trace": round(1000 * sum(cpu) / traces, 3),
        "reflector_calls": calls,
        "reflector_share": [round(c / max(1.0, sum(calls)), 3) for c in calls],
        "windows": windows,
    }
    (out / "worker_cpu.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m combee.bench.worker_cpu", description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--time-scale", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("var/bench-cpu"))
    parser.add_argument("--profile", action="store_true", help="run the workers under cProfile (OUT/worker-N.prof)")
    args = parser.parse_args(argv)
    result = measure(
        traces=args.traces,
        workers=args.workers,
        time_scale=args.time_scale,
        out=args.out,
        seed=args.seed,
        profile=args.profile,
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
