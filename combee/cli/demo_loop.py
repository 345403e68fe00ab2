"""``combee demo --closed-loop``: a SIMULATED fleet learns through the real pipeline, then each promotion policy
answers an injected bad version (combee/bench/closed_loop.py; docs/promotion.md, "The closed loop").

It starts what it needs (Kafka and Redis through deploy/local/, reused when already up; the simulator; one worker
with the loop's settings), runs the policies, prints the tables and writes the result files under ``--out``
(``--bench``: under docs/results/closed-loop-sim/ unless ``--out`` says otherwise), and stops what it started.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import cast

from combee.bench.closed_loop import LoopConfig, run_closed_loop, worker_env
from combee.closedloop import EXPECTED
from combee.serving import Policy

__all__ = ["BENCH_OUT", "loop_config", "run_closed_loop_demo"]

BENCH_OUT = Path("docs/results/closed-loop-sim")


def _say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def _state_dir() -> Path | None:
    return Path(os.environ["COMBEE_STATE_DIR"]) if os.environ.get("COMBEE_STATE_DIR") else None


def _ports() -> tuple[int, int]:
    from deploy.local.config import DEFAULT_KAFKA_PORT, DEFAULT_REDIS_PORT, env_int

    return env_int("COMBEE_KAFKA_PORT", DEFAULT_KAFKA_PORT), env_int("COMBEE_REDIS_PORT", DEFAULT_REDIS_PORT)


def loop_config(args: argparse.Namespace) -> LoopConfig:
    """The loop's sizes from the demo's options (defaults: :class:`LoopConfig`)."""
    cfg = LoopConfig(time_scale=args.time_scale)
    if getattr(args, "policies", None):
        names = tuple(p.strip() for p in args.policies.split(",") if p.strip())
        unknown = sorted(set(names) - set(EXPECTED))
        if unknown or not names:
            raise SystemExit(f"--policies: choose among {', '.join(EXPECTED)}; got {args.policies!r}")
        cfg = replace(cfg, policies=cast(tuple[Policy, ...], names))
    if getattr(args, "rate", None) is not None:
        cfg = replace(cfg, rate=args.rate)
    return cfg


def _delete_topics(bootstrap: str, prefix: str) -> None:
    from streams.kafka_config import delete_prefixed_topics

    try:
        delete_prefixed_topics(bootstrap, prefix)
    except Exception as exc:  # the broker may be gone already: say what is left behind
        _say(f"could not delete the topics under {prefix} ({type(exc).__name__}: {exc}); delete them by hand")


def run_closed_loop_demo(args: argparse.Namespace) -> int:
    from combee.sim.config import SimConfig
    from combee.sim.runner import SimProcess
    from deploy import local
    from deploy.worker import spawn_worker

    cfg = loop_config(args)
    out: Path = args.out if args.out is not None else (BENCH_OUT if args.bench else Path("var/demo-closed-loop"))
    out.mkdir(parents=True, exist_ok=True)
    bootstrap, redis_url = os.environ.get("COMBEE_KAFKA_BOOTSTRAP"), os.environ.get("COMBEE_REDIS_URL")
    started: list[str] = []
    if not (bootstrap and redis_url):
        services = local.up(_state_dir(), *_ports())
        bootstrap, redis_url, started = services.kafka_bootstrap, services.redis_url, list(services.started)
    _say(f"Kafka at {bootstrap}, Redis at {redis_url}")
    prefix = f"loop{int(time.time())}"
    worker: subprocess.Popen[bytes] | None = None
    try:
        from streams.kafka_config import ensure_topics
        from streams.topics import Topics

        ensure_topics(bootstrap, Topics(prefix=prefix))
        with SimProcess(SimConfig(seed=cfg.seed, time_scale=cfg.time_scale), world="combee") as sim:
            _say(f"SIMULATED model serving at {sim.base_url}")
            worker = spawn_worker(out / "worker.log", base_url=sim.base_url, bootstrap=bootstrap, redis_url=redis_url,
                                  prefix=prefix, max_wait_s=cfg.max_wait_s, env=worker_env(cfg))  # fmt: skip
            _say(f"worker pid {worker.pid} (log: {out / 'worker.log'})")
            doc = run_closed_loop(cfg, out, bootstrap=bootstrap, redis_url=redis_url, prefix=prefix,
                                  base_url=sim.base_url)  # fmt: skip
        print((out / "closed-loop.txt").read_text())  # the summary table, then per policy the versions
        _say(f"results: {out / 'closed-loop.json'}" + (f", plot {out / doc['plot']}" if doc.get("plot") else ""))
        _say("SIMULATED: the agents, their tasks and the model are simulated; Kafka, Redis and the worker are real")
        return 0 if all(p["assessment"]["passed"] for p in doc["policies"].values()) else 1
    finally:
        if worker is not None and worker.poll() is None:
            worker.terminate()
            worker.wait(timeout=60)
        _delete_topics(bootstrap, prefix)
        if started:
            local.down(_state_dir(), services=started)
            _say(f"stopped {', '.join(started)}")
