"""``combee demo``: the main job end to end, on embedded defaults, with the SIMULATED model.

Streaming (default): start Kafka and Redis (deploy/local/; reused if already up), the simulator and a
worker; publish SIMULATED traces for two namespaces; wait until every trace is learned; print each
namespace's prompt and version *as read back from Redis*; stop everything this command started.

``--offline``: no Kafka/Redis — the simulator and the offline learner, then the prompt and the metrics.

``--llm local``: the same streaming job against a REAL model — the project's local llama.cpp server
(deploy/llm.py, started here unless already running) or any endpoint ``OPENAI_BASE_URL`` names with
``--llm endpoint``. Its traces are real too: the model answers Formula questions from the ACE finance data
(``../shared/data``) with an empty playbook, each answer graded against the ground truth. Sized for a CPU:
a handful of traces, one namespace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from combee.cli.base import batch_size, positive_int
from combee.sim.traceset import write_trace_set
from combee.tasks.data import TASKS, Question, default_data_dir, load_questions, pick
from combee.wiring import build_llm
from deploy.worker import spawn_worker

__all__ = ["add_demo_command", "formula_questions", "real_traces", "run_demo"]

NAMESPACES = (("finance-formula", "formula", 1), ("finance-finer", "finer", 2))


def _say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def add_demo_command(sub: Any) -> None:
    """Register ``demo`` on ``combee``'s subparsers."""
    d = sub.add_parser("demo", help="the main job end to end on embedded defaults (simulated model)")
    d.add_argument(
        "--traces", type=positive_int, help="traces to learn from (default: 300 SIMULATED, or 6 real with --llm)"
    )
    d.add_argument("--batch-size", type=batch_size, default=50)
    d.add_argument("--time-scale", type=float, default=0.02)
    d.add_argument("--out", type=Path, help="where results go (default var/demo; --closed-loop: var/demo-closed-loop)")
    d.add_argument("--rate", type=float, help="traces per second the SIMULATED fleet publishes (default 80; 25 with "
                   "--closed-loop)")  # fmt: skip
    d.add_argument("--offline", action="store_true", help="learn in-process only (no Kafka/Redis)")
    d.add_argument("--timeout", type=float, default=600.0, help="give up waiting for the workers after SECONDS")
    d.add_argument(
        "--llm",
        choices=["sim", "local", "endpoint"],
        default="sim",
        help="sim: the SIMULATED model (default); local: the real local model (combee llm serve; needs the llm "
        "extra) on real Formula traces; endpoint: the real model at OPENAI_BASE_URL",
    )
    d.add_argument(
        "--closed-loop",
        action="store_true",
        help="SIMULATED agents read the prompt, answer, publish outcomes; a bad version is injected and each "
        "promotion policy answers it (docs/promotion.md, 'The closed loop')",
    )
    d.add_argument("--bench", action="store_true", help="with --closed-loop: write under docs/results/closed-loop-sim")
    d.add_argument("--policies", help="with --closed-loop: comma-separated, default gate,canary,direct")
    d.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    if getattr(args, "closed_loop", False):
        from combee.cli.demo_loop import run_closed_loop_demo

        return run_closed_loop_demo(args)
    if args.out is None:
        args.out = Path("var/demo")
    if args.rate is None:
        args.rate = 80.0
    if args.traces is None:
        args.traces = 300 if getattr(args, "llm", "sim") == "sim" else 6
    if args.offline:
        return _offline(args)
    if getattr(args, "llm", "sim") != "sim":
        return _streaming_real(args)
    return _streaming(args)


def _offline(args: argparse.Namespace) -> int:
    from combee.sim.config import SimConfig
    from combee.sim.runner import SimProcess
    from combee.sim.world import generate_traces

    out: Path = args.out
    traces, tests, truth = generate_traces(args.traces, 1, namespace="demo")
    write_trace_set(out / "traces.jsonl", traces, tests, truth)
    _say(f"wrote {len(traces)} SIMULATED traces to {out / 'traces.jsonl'}")
    with SimProcess(SimConfig(seed=1, time_scale=args.time_scale), world="combee") as sim:
        _say(f"SIMULATED model serving at {sim.base_url} (time scale {args.time_scale})")
        env = {**os.environ, "OPENAI_BASE_URL": sim.base_url}
        cmd = [sys.executable, "-m", "combee.cli", "learn", "--traces", str(out / "traces.jsonl"),
               "--method", "combee", "--batch-size", str(args.batch_size), "--out", str(out / "learned"),
               "--test", str(out / "traces.test.jsonl")]  # fmt: skip
        rc = subprocess.call(cmd, env=env)
    if rc != 0:
        return rc
    print((out / "learned" / "prompt.md").read_text())
    metrics = json.loads((out / "learned" / "metrics.json").read_text())
    keep = ("method", "batch_sizes", "iterations", "wall_s", "llm_calls", "prompt_tokens", "completion_tokens",
            "playbook_entries", "playbook_tokens", "simulated", "eval")  # fmt: skip
    print(json.dumps({k: metrics[k] for k in keep if k in metrics}, indent=2))
    return 0


def _streaming(args: argparse.Namespace) -> int:
    from combee.sim.config import SimConfig
    from combee.sim.runner import SimProcess
    from deploy import local

    state_dir = _state_dir()
    kafka_port, redis_port = _ports()
    services = local.up(state_dir, kafka_port, redis_port)
    started = services.started
    bootstrap, redis_url = services.kafka_bootstrap, services.redis_url
    _say(f"Kafka at {bootstrap}, Redis at {redis_url}" + (f" (started {', '.join(started)})" if started else ""))
    prefix = f"demo{int(time.time())}"
    worker: subprocess.Popen[bytes] | None = None
    try:
        _create_topics(bootstrap, prefix)
        with SimProcess(SimConfig(seed=1, time_scale=args.time_scale), world="combee") as sim:
            _say(f"SIMULATED model serving at {sim.base_url} (time scale {args.time_scale})")
            log_path = args.out / "worker.log"
            args.out.mkdir(parents=True, exist_ok=True)
            worker = spawn_worker(
                log_path,
                "--until-idle",
                "10",
                base_url=sim.base_url,
                bootstrap=bootstrap,
                redis_url=redis_url,
                prefix=prefix,
                max_wait_s=3,
            )
            _say(f"worker pid {worker.pid} (log: {log_path})")
            expected = _publish(bootstrap, prefix, args.traces, args.rate)
            results = asyncio.run(_wait_learned(redis_url, prefix, expected, worker, timeout_s=args.timeout))
            worker.wait(timeout=60)
            worker = None
        for ns, (version, prompt, learned) in results.items():
            print(f"\n===== namespace {ns}: version {version} (read from Redis; {learned} traces learned) =====")
            print(prompt)
        _say("SIMULATED model: the prompts above were learned from synthetic traces by a simulated LLM")
        return 0 if all(r[2] == expected[ns] for ns, r in results.items()) else 1
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=30)
        _delete_topics(bootstrap, prefix)  # its own prefix: nothing another run uses
        if started:
            local.down(state_dir, services=started)
            _say(f"stopped {', '.join(started)}")


def _create_topics(bootstrap: str, prefix: str) -> None:
    """The deployment step before any worker or publisher runs (``combee topics create``)."""
    from streams.kafka_config import ensure_topics
    from streams.topics import Topics

    report = ensure_topics(bootstrap, Topics(prefix=prefix))
    _say(f"topics under prefix {prefix}: {len(report.created)} created, {len(report.existing)} already there")


def _delete_topics(bootstrap: str, prefix: str) -> None:
    """The demo's topics (its own prefix) go when it ends: a second run does not find the first one's."""
    from streams.kafka_config import delete_prefixed_topics

    try:
        names = delete_prefixed_topics(bootstrap, prefix)
    except Exception as exc:  # the broker may be gone already; say what is left behind
        _say(f"could not delete the topics under {prefix} ({type(exc).__name__}: {exc}); delete them by hand")
        return
    _say(f"deleted the {len(names)} topics under prefix {prefix}")


def _publish(bootstrap: str, prefix: str, n: int, rate: float) -> dict[str, int]:
    """Publish like a fleet would: the namespaces' traces interleaved, at ``rate`` traces per second."""
    from combee.sim.world import generate_traces
    from streams.publisher import TracePublisher
    from streams.topics import Topics

    sets = {ns: generate_traces(n, seed, namespace=ns, world=world)[0] for ns, world, seed in NAMESPACES}
    _say(f"publishing {n} SIMULATED traces per namespace at {rate:g} traces/s")
    started = time.monotonic()
    with TracePublisher(bootstrap, Topics(prefix=prefix)) as publisher:
        for i, trace in enumerate(t for group in zip(*sets.values(), strict=True) for t in group):
            publisher.publish(trace)
            delay = started + (i + 1) / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        publisher.flush(30)
    expected = {ns: len(traces) for ns, traces in sets.items()}
    _say(f"published {sum(expected.values())} traces: " + ", ".join(f"{k}={v}" for k, v in expected.items()))
    return expected


async def _wait_learned(
    redis_url: str, prefix: str, expected: dict[str, int], worker: subprocess.Popen[bytes], timeout_s: float
) -> dict[str, tuple[int, str, int]]:
    """Poll Redis until every namespace's published versions cover all its traces (or the worker ends)."""
    from streams.client import AsyncPromptClient

    clients = {ns: AsyncPromptClient(redis_url, ns, key_prefix=prefix) for ns in expected}
    deadline = time.monotonic() + timeout_s
    results: dict[str, tuple[int, str, int]] = {}
    try:
        while time.monotonic() < deadline:
            for ns, client in clients.items():
                learned = await _traces_learned(client)
                try:
                    current = await client.get()
                except Exception:
                    continue
                results[ns] = (current.version, current.prompt, learned)
            if results and all(results.get(ns, (0, "", 0))[2] >= n for ns, n in expected.items()):
                break
            if worker.poll() is not None:
                break
            await asyncio.sleep(1.0)
    finally:
        for client in clients.values():
            await client.aclose()
    return results


async def _traces_learned(client: Any) -> int:
    history = await client.history(limit=10_000)
    return sum(int((h.meta or {}).get("traces") or 0) for h in history)


# --- against a real model ----------------------------------------------------------------------------------

REAL_NAMESPACE = "finance-formula"


def _real_endpoint(args: argparse.Namespace) -> tuple[str, str, bool]:
    """(base URL, model, started here) of the real model the demo uses."""
    if args.llm == "endpoint":
        base_url = os.environ.get("OPENAI_BASE_URL")
        if not base_url:
            raise SystemExit("combee demo --llm endpoint: set OPENAI_BASE_URL (and COMBEE_MODEL) first")
        return base_url, os.environ.get("COMBEE_MODEL", "local"), False
    from deploy import llm

    cfg, started = llm.up(state_dir=_state_dir())
    return cfg.base_url, llm.ALIAS, started


def _ports() -> tuple[int, int]:
    """The local Kafka's and Redis's ports, as ``combee dev up`` takes them (COMBEE_KAFKA_PORT, COMBEE_REDIS_PORT)."""
    from deploy.local.config import DEFAULT_KAFKA_PORT, DEFAULT_REDIS_PORT, env_int

    return env_int("COMBEE_KAFKA_PORT", DEFAULT_KAFKA_PORT), env_int("COMBEE_REDIS_PORT", DEFAULT_REDIS_PORT)


def _state_dir() -> Path | None:
    return Path(os.environ["COMBEE_STATE_DIR"]) if os.environ.get("COMBEE_STATE_DIR") else None


def formula_questions(n: int, *, seed: int = 0, data_dir: Path | None = None) -> list[Question]:
    """``n`` Formula training questions drawn with ``seed`` from ``data_dir`` (default: :func:`default_data_dir`).

    Raises ConfigError, one line saying where to get the data, when the file is missing."""
    spec = TASKS["formula"]
    return pick(load_questions((data_dir or default_data_dir()) / spec.train_file), n, seed, "train")


def real_traces(base_url: str, model: str, questions: list[Question], *, concurrency: int = 4) -> list[dict[str, Any]]:
    """One trace of a real agent per question: the model answers the Formula ``questions`` with an empty playbook
    and each answer is graded against the ground truth (the finance task harness's agent and grader)."""
    from combee.models import Playbook
    from combee.settings import Settings
    from combee.tasks.agent import answer_all, to_trace

    settings = Settings(openai_base_url=base_url, model=model, llm_max_concurrency=concurrency, llm_timeout_s=900.0)

    async def run() -> list[Any]:
        llm = build_llm(settings)
        try:
            return await answer_all(
                llm, "formula", questions, Playbook(namespace=REAL_NAMESPACE), concurrency=concurrency,
                progress=lambda done, total: _say(f"agent answered {done}/{total}"),
            )  # fmt: skip
        finally:
            await llm.aclose()

    attempts = asyncio.run(run())
    right = sum(a.grade.success for a in attempts)
    _say(f"the agent answered {right} of {len(attempts)} Formula questions correctly (graded against the truth)")
    return [to_trace(a, namespace=REAL_NAMESPACE).model_dump(mode="json", exclude_none=True) for a in attempts]


def _streaming_real(args: argparse.Namespace) -> int:
    from deploy import llm, local

    questions = formula_questions(args.traces)  # before any model starts: a missing data file is one line
    base_url, model, llm_started = _real_endpoint(args)
    _say(f"REAL model {model!r} at {base_url}" + (" (started here)" if llm_started else ""))
    services = None
    worker: subprocess.Popen[bytes] | None = None
    created: str | None = None
    try:
        traces = real_traces(base_url, model, questions)
        kafka_port, redis_port = _ports()
        services = local.up(_state_dir(), kafka_port, redis_port)
        bootstrap, redis_url = services.kafka_bootstrap, services.redis_url
        _say(f"Kafka at {bootstrap}, Redis at {redis_url}")
        prefix = f"demo{int(time.time())}"
        args.out.mkdir(parents=True, exist_ok=True)
        log_path = args.out / "worker.log"
        os.environ.setdefault("COMBEE_MODEL", model)
        os.environ.setdefault("COMBEE_LLM_TIMEOUT_S", "900")
        os.environ.setdefault("COMBEE_LLM_MAX_CONCURRENCY", "4")
        # one window holds every trace: the demo shows one Combee iteration (map, shuffle, scan) on real data
        os.environ.setdefault("COMBEE_BS_CANDIDATES", f"[{len(traces)}]")
        os.environ.setdefault("COMBEE_BS_MIN", "1")
        created = prefix
        _create_topics(bootstrap, prefix)
        worker = spawn_worker(log_path, "--until-idle", "30", base_url=base_url, bootstrap=bootstrap,
                              redis_url=redis_url, prefix=prefix, max_wait_s=5)  # fmt: skip
        _say(f"worker pid {worker.pid} (log: {log_path})")
        from streams.publisher import TracePublisher
        from streams.topics import Topics

        with TracePublisher(bootstrap, Topics(prefix=prefix)) as publisher:
            for trace in traces:
                publisher.publish(trace)
            publisher.flush(30)
        _say(f"published {len(traces)} real traces to {prefix}; waiting for the worker (a CPU model is slow)")
        expected = {REAL_NAMESPACE: len(traces)}
        results = asyncio.run(_wait_learned(redis_url, prefix, expected, worker, timeout_s=args.timeout))
        version, prompt, learned = results.get(REAL_NAMESPACE, (0, "", 0))
        print(f"\n===== namespace {REAL_NAMESPACE}: version {version} (read from Redis; {learned} real traces "
              f"learned; model {model}) =====")  # fmt: skip
        print(prompt)
        return 0 if learned >= len(traces) and prompt.strip() else 1
    finally:
        if worker is not None and worker.poll() is None:
            worker.terminate()
            worker.wait(timeout=60)
        if created is not None and services is not None:
            _delete_topics(services.kafka_bootstrap, created)
        if services is not None and services.started:
            local.down(_state_dir(), services=services.started)
        if llm_started:
            llm.down(_state_dir())
            _say("stopped the local model")
