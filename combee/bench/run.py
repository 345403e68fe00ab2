"""The benchmark orchestrator: trace sets, simulator, training phases, evaluation, scoring, files.

Order of work (each step's reason is in ``docs/benchmarks-history.md``):

1. Write one SIMULATED trace set per (seed, size) to ``DIR/traces/`` (traces, held-out tasks, ground truth).
2. Start the simulator as a child process (:class:`~combee.sim.runner.SimProcess`, so it never shares the
   client's interpreter), or use ``--base-url``; its ``time_scale`` is read from its admin API.
3. Train. *Shared phase*: the narrow runs (at most ``shared_max_width`` calls in flight, e.g. sequential)
   run concurrently in a pool of worker processes, longest first. *Exclusive phase*: each wide run (a map
   stage of 50+ calls) runs alone in one worker, so its wall time is not inflated by its neighbours.
4. Evaluate every final playbook on its seed's held-out tasks through the generator role (real requests
   through the OpenAI client), after all training, so evaluation traffic never overlaps a timed run.
5. Score insight retention against the ground truth (the learner never saw it), aggregate, check the
   acceptance criteria, and write ``results.json``, ``results.md`` and the PNG plots.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import multiprocessing
import os
import platform
import resource
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from combee.bench import report, tables
from combee.bench.size import FIXED_BUDGET
from combee.bench.spec import BenchConfig, RunSpec, factor_label, is_shared, plan_runs
from combee.bench.worker import SIM_START_TIMEOUT_S, exit_with_parent, train
from combee.sim.traceset import test_path, truth_path, write_trace_set
from combee.wiring import simulator_llm

__all__ = ["BenchResult", "run_bench"]

Log = Callable[[str], None]

TRAIN_TIMEOUT_S = 3600.0
"""Per-request client timeout of the training runs (a 2,000-call stage queues at the simulator)."""


@dataclass(frozen=True)
class TraceSet:
    seed: int
    n: int
    path: Path
    test_path: Path
    truth: dict[str, Any]
    tests: list[dict[str, Any]]


@dataclass
class BenchResult:
    document: dict[str, Any]
    out: Path


def _machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import openai

    return {
        "cpu": cpu or "unknown",
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "openai": openai.__version__,
    }


def _machine_cpu_s() -> float | None:
    """CPU seconds all processes of this machine have used since boot (``/proc/stat``), or None off Linux."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process and its waited-for children (worker processes, the simulator)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def _load_report(machine_before: float | None, own_before: float, wall_s: float) -> dict[str, Any]:
    """How busy the machine was during the run, and how much of that was other people's work.

    Timings are only meaningful on a quiet machine; ``foreign_cpu_share`` (CPU used by processes that are not
    this bench's, as a share of all cores over the run) says how quiet it was.
    """
    machine_after = _machine_cpu_s()
    own = _own_cpu_s() - own_before
    cores = os.cpu_count() or 1
    doc: dict[str, Any] = {"bench_cpu_s": own, "cores": cores, "wall_s": wall_s}
    if machine_before is not None and machine_after is not None and wall_s > 0:
        total = machine_after - machine_before
        doc["machine_cpu_s"] = total
        doc["foreign_cpu_s"] = max(0.0, total - own)
        doc["foreign_cpu_share"] = doc["foreign_cpu_s"] / (cores * wall_s)
    return doc


def _write_trace_sets(config: BenchConfig, runs: list[RunSpec], log: Log) -> dict[tuple[int, int], TraceSet]:
    from combee.sim.world import generate_traces

    sets: dict[tuple[int, int], TraceSet] = {}
    for seed, n in sorted({(r.seed, r.n_traces) for r in runs}):
        path = config.out / "traces" / f"{config.world}-n{n}-s{seed}.jsonl"
        traces, tests, truth = generate_traces(n, seed, namespace="bench", world=config.world, test_n=config.test_n)
        write_trace_set(path, traces, tests, truth)
        test_docs = [asdict(t) for t in tests]
        sets[(seed, n)] = TraceSet(seed, n, path, test_path(path), json.loads(truth_path(path).read_text()), test_docs)
        log(f"wrote {n} SIMULATED traces (seed {seed}, {len(truth['insights'])} hidden insights) to {path}")
    return sets


@contextlib.contextmanager
def _evaluation_simulator(config: BenchConfig, log: Log) -> Iterator[str]:
    """The base URL evaluation uses: the external simulator, or one started for it (answers do not depend on
    the serving profile or the merge law; evaluation is not timed). Training runs start their own."""
    from combee.sim.config import SimConfig
    from combee.sim.runner import SimProcess

    if config.base_url is not None:
        yield config.base_url
        return
    sim_config = SimConfig(
        seed=config.sim_seed, time_scale=config.time_scale, max_concurrency=config.sim_max_concurrency
    )
    # started with the training simulators' allowance: on a loaded machine the child takes more than 30 s
    with SimProcess(sim_config, world="combee").start(timeout=SIM_START_TIMEOUT_S) as sim:
        log(f"SIMULATED model for evaluation (pid {sim.pid}) at {sim.base_url}, time_scale {config.time_scale}")
        yield sim.base_url


def run_sim_config(run: RunSpec, config: BenchConfig) -> Any:
    """The simulator a training run gets: the bench's profile, the run's merge law and time scale."""
    from combee.sim.config import SimConfig

    fields: dict[str, Any] = {
        "seed": config.sim_seed,
        "time_scale": _time_scale_of(run, config),
        "merge_capacity_factor": run.merge_factor,
        "labels": config.labels,
    }
    if config.profile == "unlimited":
        fields["max_concurrency"] = config.sim_max_concurrency
    if config.requests_per_minute is not None:
        fields["requests_per_minute"] = config.requests_per_minute
    if config.tokens_per_minute is not None:
        fields["tokens_per_minute"] = config.tokens_per_minute
    return SimConfig.for_profile(config.profile, **fields)


def external_sim_config(base_url: str) -> dict[str, Any]:
    """The configuration of a running Combee simulator (``time_scale``, latency model), from its admin API.

    Raises ValueError if ``base_url`` is not a Combee simulator (the bench needs its world model).
    """
    import urllib.request

    root = base_url.rstrip("/").removesuffix("/v1")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(root + "/admin/config", timeout=10) as response:
            config: dict[str, Any] = json.loads(response.read())
        float(config["time_scale"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{base_url} does not answer like the Combee simulator ({exc!r})") from None
    return config


def _time_scale_of(run: RunSpec, config: BenchConfig) -> float:
    return config.time_scale if run.time_scale is None or config.base_url is not None else run.time_scale


def _train_all(
    config: BenchConfig,
    runs: list[RunSpec],
    sets: dict[tuple[int, int], TraceSet],
    external: dict[str, Any] | None,
    log: Log,
) -> dict[str, dict[str, Any]]:
    shared = sorted((r for r in runs if is_shared(r, config)), key=lambda r: -r.cost)
    exclusive = [r for r in runs if not is_shared(r, config)]
    workers = config.workers or max(1, min(len(shared), 8))
    records: dict[str, dict[str, Any]] = {}
    done = 0

    def submit(pool: ProcessPoolExecutor, run: RunSpec) -> Future[dict[str, Any]]:
        from combee.sim.config import SimConfig

        path = str(sets[(run.seed, run.n_traces)].path)
        if config.base_url is not None:  # an external simulator: whatever it was started with
            known = SimConfig.model_validate(external).model_dump_json() if external is not None else None
            return pool.submit(train, run, config.base_url, path, config.client_concurrency, TRAIN_TIMEOUT_S, known)
        sim_json = run_sim_config(run, config).model_dump_json()
        return pool.submit(train, run, None, path, config.client_concurrency, TRAIN_TIMEOUT_S, sim_json)

    def collect(run: RunSpec, future: Future[dict[str, Any]], phase: str) -> None:
        nonlocal done
        done += 1
        try:
            record = future.result()
        except Exception as exc:  # one failed run must not lose the others; it is reported as failed
            record = {
                "key": run.key,
                "config_key": run.config_key,
                **asdict(run),
                "error": f"{type(exc).__name__}: {exc}",
            }
            log(f"[{done}/{len(runs)}] {run.key} FAILED: {record['error']}")
        else:
            log(
                f"[{done}/{len(runs)}] {run.key} ({phase}): wall {record['wall_s']:.1f}s, critical path "
                f"{record['critical_path_s']:.1f}s, {record['llm_calls']} calls, {record['playbook_entries']} entries"
            )
        record["phase"] = phase
        record["time_scale_used"] = _time_scale_of(run, config)
        records[run.key] = record

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=exit_with_parent, initargs=(os.getpid(),)
    ) as pool:
        if shared:
            log(f"shared phase: {len(shared)} narrow runs on {workers} worker processes")
            futures = {submit(pool, r): r for r in shared}
            for future in as_completed(futures):
                collect(futures[future], future, "shared")
        if exclusive:
            log(f"exclusive phase: {len(exclusive)} wide runs, one at a time")
        for run in exclusive:
            future = submit(pool, run)
            collect(run, future, "exclusive")
    return records


async def _evaluate_all(
    records: dict[str, dict[str, Any]], sets: dict[tuple[int, int], TraceSet], base_url: str, config: BenchConfig
) -> None:
    from combee.learner import EvalTask, evaluate
    from combee.models import Playbook

    llm = simulator_llm(base_url, max_concurrency=config.client_concurrency, timeout_s=TRAIN_TIMEOUT_S)

    async def one(record: dict[str, Any]) -> None:
        tests = sets[(record["seed"], record["n_traces"])].tests
        tasks = [EvalTask(t["task_id"], t["task"], t["ground_truth"]) for t in tests]
        playbook = Playbook.model_validate_json(record["playbook_json"])
        result = await evaluate(tasks, playbook, llm, concurrency=config.eval_concurrency)
        record["sim_accuracy"] = result.accuracy
        record["eval_correct"] = result.correct
        record["eval_total"] = result.total
        record["eval_unparsed"] = result.unparsed

    try:
        await asyncio.gather(*(one(r) for r in records.values() if not r.get("error")))
    finally:
        await llm.aclose()


def _score_quality(records: dict[str, dict[str, Any]], sets: dict[tuple[int, int], TraceSet]) -> None:
    """Retention (plain, at sequential's prompt size on the same traces, at 2,000 tokens) and the size figures
    of every playbook, against the ground truth the learner never saw (combee.bench.size)."""
    from combee.bench.size import score
    from combee.models import Playbook

    playbooks = {
        key: Playbook.model_validate_json(r["playbook_json"]) for key, r in records.items() if not r.get("error")
    }
    # one sequential run per trace set (seed, size) is the yardstick of every run on it
    seq_tokens = {
        (r["seed"], r["n_traces"]): r["playbook_tokens"]
        for r in records.values()
        if r["method"] == "sequential" and not r.get("error")
    }
    for key, playbook in playbooks.items():
        record = records[key]
        truth = sets[(record["seed"], record["n_traces"])].truth
        record.update(score(playbook, truth["insights"], seq_tokens.get((record["seed"], record["n_traces"]))))
        record["truth_insights"] = len(truth["insights"])


def _write_run_files(out: Path, records: dict[str, dict[str, Any]]) -> None:
    from combee.models import Playbook
    from combee.playbook import render_prompt

    for key, record in records.items():
        folder = out / "runs" / key
        folder.mkdir(parents=True, exist_ok=True)
        if "playbook_json" in record:
            playbook = Playbook.model_validate_json(record["playbook_json"])
            (folder / "playbook.json").write_text(playbook.model_dump_json(indent=1) + "\n")
            (folder / "prompt.md").write_text(render_prompt(playbook))
        metrics = {k: v for k, v in record.items() if k != "playbook_json"}
        (folder / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")


_SUMMARY_DROP = ("playbook_json", "per_iteration")


def _is_default(config: BenchConfig) -> bool:
    baseline = BenchConfig(out=config.out)
    return replace(config, workers=baseline.workers, extra={}) == baseline


def run_bench(
    config: BenchConfig, log: Log = lambda line: print(f"[bench] {line}", file=sys.stderr, flush=True)
) -> BenchResult:
    """Run the benchmark ``config`` describes; write ``results.json``, ``results.md`` and plots to ``config.out``.

    Raises ValueError for a ``base_url`` that is not a Combee simulator, and :class:`SimStartupError` if the
    simulator does not start. Failed runs are recorded (with their error) rather than raised.
    """
    started = time.monotonic()
    started_at = datetime.datetime.now(datetime.UTC)
    machine_before, own_before = _machine_cpu_s(), _own_cpu_s()
    external: dict[str, Any] | None = None
    if config.base_url is not None:
        external = external_sim_config(config.base_url)
        config = replace(config, time_scale=float(external["time_scale"]), sim_seed=int(external.get("seed", 0)))
    config.out.mkdir(parents=True, exist_ok=True)
    runs = plan_runs(config)
    log(f"{len(runs)} runs planned (SIMULATED model; time_scale {config.time_scale})")
    sets = _write_trace_sets(config, runs, log)
    log(f"serving profile {config.profile!r}; merge capacity factors {[factor_label(f) for f in config.merge_factors]}")
    records = _train_all(config, runs, sets, external, log)
    log(f"training done in {time.monotonic() - started:.0f}s; evaluating {len(records)} playbooks")
    with _evaluation_simulator(config, log) as eval_url:
        eval_started = time.monotonic()
        asyncio.run(_evaluate_all(records, sets, eval_url, config))
        log(f"evaluation done in {time.monotonic() - eval_started:.0f}s")
    load = _load_report(machine_before, own_before, time.monotonic() - started)
    if load.get("foreign_cpu_share", 0.0) > 0.05:
        log(f"warning: other processes used {load['foreign_cpu_share']:.0%} of the machine's CPU during the run")
    _score_quality(records, sets)
    _write_run_files(config.out, records)
    ordered = [records[r.key] for r in runs]
    summary_runs = [{k: v for k, v in r.items() if k not in _SUMMARY_DROP} for r in ordered]
    bench_wall = time.monotonic() - started
    meta = {"n_traces": config.n_traces, "bench_wall_s": bench_wall, "default": _is_default(config)}
    checks = report.acceptance(summary_runs, meta)
    document: dict[str, Any] = {
        "simulated": True,
        "label": "SIMULATED: Combee simulator (behaviour and latency model), not a real LLM",
        "profile": config.profile if external is None else external.get("profile", "external"),
        "merge_capacity_factors": list(config.merge_factors),
        "labels": config.labels,
        "corroboration": {
            "min_traces": config.corroborate,
            "trace_cap": config.trace_cap,
            "harmful_tags": config.harmful_tags,
        },
        "fixed_budget_tokens": FIXED_BUDGET,
        "n_traces": config.n_traces,
        "seed": config.seeds[0],
        "seeds": list(config.seeds),
        "time_scale": config.time_scale,
        "world": config.world,
        "test_n": config.test_n,
        "sim_seed": config.sim_seed,
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "bench_wall_s": bench_wall,
        "default_configuration": meta["default"],
        "machine": _machine(),
        "machine_load": load,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
        "simulator": _sim_settings(config, external),
        "runs": summary_runs,
        "summary": report.aggregate(summary_runs),
        "merge_factors": tables.factor_table(summary_runs),
        "controllers": tables.controller_table(summary_runs),
        "calibration": report.calibration(summary_runs, config.n_traces),
        "acceptance": [asdict(c) for c in checks],
    }
    try:
        from combee.bench.plots import write_plots

        document["plots"] = [p.name for p in write_plots(document, config.out)]
    except ImportError as exc:  # matplotlib is in the bench/dev extras only
        document["plots"] = []
        log(f"plots skipped: {exc} (pip install 'combee[bench]')")
    (config.out / "results.json").write_text(json.dumps(document, indent=1) + "\n")
    (config.out / "results.md").write_text(tables.markdown(document))
    log(f"wrote {config.out / 'results.json'}, {config.out / 'results.md'} in {bench_wall / 60:.1f} min")
    return BenchResult(document, config.out)


def _sim_settings(config: BenchConfig, external: dict[str, Any] | None) -> dict[str, Any]:
    from combee.sim.config import SimConfig
    from combee.sim.world import WORLDS, Behaviour

    if external is None:
        fields: dict[str, Any] = {"seed": config.sim_seed, "time_scale": config.time_scale, "labels": config.labels}
        if config.profile == "unlimited":
            fields["max_concurrency"] = config.sim_max_concurrency
        for name in ("requests_per_minute", "tokens_per_minute"):
            if getattr(config, name) is not None:
                fields[name] = getattr(config, name)
        settings = SimConfig.for_profile(config.profile, **fields).model_dump()
    else:
        settings = external
    return {
        "external": external is not None,
        "latency": {k: v for k, v in settings.items() if not k.startswith("fault") and k not in ("models", "outage")},
        "faults": {k: v for k, v in settings.items() if k.startswith("fault") or k == "outage"},
        "behaviour": asdict(Behaviour(seed=config.sim_seed, labels=str(settings.get("labels", config.labels)))),
        "world": asdict(WORLDS[config.world]),
    }
