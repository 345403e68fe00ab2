"""The ``combee`` command line. Every verb is documented in README.md.

Errors a user can cause (missing file, bad option, unreachable endpoint, invalid namespace) end the command
with one line on stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from combee.errors import CombeeError, ConfigError, LLMRateLimited, LLMUnavailable
from combee.playbook import ApplyStats

__all__ = ["main"]

EXIT_USAGE = 2
EXIT_LLM = 3
EXIT_SERVICE = 4


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status ``code``."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


# --- progress -------------------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on a TTY; a line every 10 % otherwise; nothing when quiet."""

    def __init__(self, label: str, stream: TextIO = sys.stderr, quiet: bool = False) -> None:
        self.label = label
        self.stream = stream
        self.quiet = quiet
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self._last_decile = -1

    def update(self, done: int, total: int, note: str = "") -> None:
        if self.quiet or total <= 0:
            return
        frac = min(1.0, done / total)
        elapsed = time.monotonic() - self.started
        if self.tty:
            width = 28
            filled = int(frac * width)
            bar = "#" * filled + "." * (width - filled)
            self.stream.write(f"\r{self.label} [{bar}] {done}/{total} {note} {elapsed:5.1f}s ")
            self.stream.flush()
        else:
            decile = int(frac * 10)
            if decile != self._last_decile:
                self._last_decile = decile
                self.stream.write(f"{self.label}: {done}/{total} {note} ({elapsed:.1f}s)\n")
                self.stream.flush()

    def close(self) -> None:
        if self.tty and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()


# --- shared option groups -------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _batch_size(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"batch size must be a positive integer or 'auto', got {text!r}") from None


def _add_llm_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LLM endpoint (default: $OPENAI_BASE_URL, $OPENAI_API_KEY, COMBEE_* settings)")
    g.add_argument("--base-url", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    g.add_argument("--model", help="model for every role (default: $COMBEE_MODEL or combee-sim)")
    for role in ("reflector", "curator", "merger", "generator"):
        g.add_argument(f"--{role}-model", help=f"model for the {role} role")
    g.add_argument("--structured-output", choices=["auto", "json_schema", "json_object_schema", "json_object", "none"])
    g.add_argument("--llm-concurrency", type=_positive_int, help="max requests in flight (default 64)")
    g.add_argument("--cache-dir", type=Path, help="on-disk response cache (replays and benchmarks reuse answers)")


def _add_method_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("method")
    g.add_argument("--p", type=_positive_int, dest="dup", help="augmented shuffle duplication factor (default 2)")
    g.add_argument("--max-group-items", type=_positive_int, help="reflections per level-1 group at most (default 24)")
    g.add_argument("--max-fan-in", type=_positive_int, help="partial deltas per merge call at most (default 12)")
    g.add_argument("--group-factor", type=float, default=1.0, help="k = floor(factor * sqrt(n)) groups (default 1)")
    g.add_argument("--token-budget", type=_positive_int, help="hard size budget of the prompt in tokens")


def given_options(args: argparse.Namespace, mapping: dict[str, str]) -> dict[str, Any]:
    """``{field: value}`` for each option of ``mapping`` (option name → field name) given on the command line."""
    return {field: value for arg, field in mapping.items() if (value := getattr(args, arg, None)) is not None}


def _settings(args: argparse.Namespace) -> Any:
    from combee.settings import Settings

    mapping = {
        "base_url": "openai_base_url",
        "model": "model",
        "reflector_model": "model_reflector",
        "curator_model": "model_curator",
        "merger_model": "model_merger",
        "generator_model": "model_generator",
        "structured_output": "structured_output",
        "llm_concurrency": "llm_max_concurrency",
        "cache_dir": "cache_dir",
        "dup": "p",
        "max_group_items": "max_group_items",
        "max_fan_in": "max_fan_in",
        "token_budget": "token_budget",
    }
    try:
        return Settings(**given_options(args, mapping))
    except Exception as exc:  # pydantic ValidationError: name the setting, not a traceback
        raise CliError(f"invalid setting: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return " ".join(line.strip() for line in text[:3])[:300] if text else type(exc).__name__


def build_llm(settings: Any) -> Any:
    """The OpenAI-compatible LLM client configured from settings (one per endpoint when roles have their own)."""
    from combee.llm import Role
    from combee.llm_openai import EndpointConfig, OpenAILLM, RoleRouter

    def endpoint(base_url: str) -> Any:
        return OpenAILLM(
            EndpointConfig(
                base_url=base_url,
                api_key=settings.openai_api_key,
                default_model=settings.model,
                models=settings.models(),
                structured_output=settings.structured_output,
                max_concurrency=settings.llm_max_concurrency,
                timeout_s=settings.llm_timeout_s,
                max_attempts=settings.llm_max_attempts,
                backoff_max_s=settings.llm_backoff_max_s,
                cache_dir=settings.cache_dir,
                context_tokens=settings.llm_context_tokens,
                reasoning_models=settings.llm_reasoning_models,
            )
        )

    default = endpoint(settings.openai_base_url)
    urls = {role: settings.base_url_for(role) for role in Role}
    if all(url == settings.openai_base_url for url in urls.values()):
        return default
    by_url: dict[str, Any] = {settings.openai_base_url: default}
    for url in urls.values():
        if url not in by_url:
            by_url[url] = endpoint(url)
    return RoleRouter(default, {role: by_url[url] for role, url in urls.items()})


def build_near_duplicates(settings: Any, *, log: Callable[[str], object] | None = None) -> Any:
    """The semantic de-duplicator configured from settings, or None (exact match only), saying which and why.

    ``embeddings``: ``endpoint`` (or ``auto`` with ``embeddings_url`` set) asks an OpenAI-compatible
    ``/v1/embeddings``; ``local`` (``auto`` otherwise) runs all-MiniLM-L6-v2 here when the ``embeddings``
    extra is installed; ``off`` — or ``local``/``auto`` without the extra — leaves the exact rule.
    """
    from combee.embeddings import NearDuplicates

    say = log or logging.getLogger("combee").info
    mode = settings.embeddings
    if mode == "off":
        say("semantic de-duplication off (COMBEE_EMBEDDINGS=off): bullets are de-duplicated by exact match only")
        return None
    if mode == "endpoint" or (mode == "auto" and settings.embeddings_url):
        from combee.embed_openai import OpenAIEmbedder

        embedder: Any = OpenAIEmbedder(
            settings.embeddings_url or settings.openai_base_url,
            settings.embeddings_model,
            settings.embeddings_api_key or settings.openai_api_key,
        )
    else:
        from combee.embed_local import MiniLMEmbedder, local_embedder_missing

        problem = local_embedder_missing(settings.embeddings_tokenizer)
        if problem is not None:
            say(f"semantic de-duplication off: {problem}; bullets are de-duplicated by exact match only")
            return None
        embedder = MiniLMEmbedder(settings.embeddings_tokenizer, threads=settings.embeddings_threads)
    say(f"semantic de-duplication: {embedder.name}, threshold {settings.embeddings_threshold}")
    return NearDuplicates(embedder, threshold=settings.embeddings_threshold)


def method_config(settings: Any, method: str, group_factor: float = 1.0) -> Any:
    from combee.engine import Method, MethodConfig
    from combee.playbook import ApplyPolicy

    return MethodConfig(
        method=Method(method),
        p=settings.p,
        max_group_items=settings.max_group_items,
        max_fan_in=settings.max_fan_in,
        group_factor=group_factor,
        parse_attempts=settings.parse_attempts,
        policy=ApplyPolicy(token_budget=settings.token_budget),
    )


# --- learn ----------------------------------------------------------------------------------------------


def _load_trace_file(path: Path, namespace: str | None, err: TextIO) -> tuple[list[Any], int]:
    from combee.models import validate_namespace
    from combee.tracefile import read_traces

    if namespace is not None:
        validate_namespace(namespace)
    if not path.exists():
        raise CliError(f"trace file not found: {path}")
    if path.is_dir():
        raise CliError(f"trace file is a directory: {path}")
    try:
        tf = read_traces(path, namespace=namespace)
    except PermissionError:
        raise CliError(f"cannot read trace file: {path} (permission denied)") from None
    for e in tf.errors[:20]:
        err.write(f"combee: {path}:{e.line}: skipped: {e.reason}\n")
    if len(tf.errors) > 20:
        err.write(f"combee: {path}: ... and {len(tf.errors) - 20} more malformed lines skipped\n")
    if not tf.traces:
        raise CliError(f"no valid traces in {path} ({len(tf.errors)} malformed lines)")
    return tf.traces, len(tf.errors)


def metrics_document(result: Any, *, method: str, settings: Any, extra: dict[str, Any] | None = None) -> dict:
    """``metrics.json``: what ran, how long, how many calls and tokens (total and per role), the playbook."""
    from combee.playbook import playbook_tokens

    meter = result.meter
    roles = {
        role: {
            "calls": s.calls,
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens,
            "cached": s.cached,
            "parse_failures": s.parse_failures,
            "max_prompt_tokens": s.max_prompt_tokens,
            "repairs": s.repairs,
            "repaired": s.repaired,
            "gave_up": s.gave_up,
            "salvaged": s.salvaged,
            "invalid_items": s.invalid_items,
            "failure_kinds": dict(sorted(s.failure_kinds.items())),
        }
        for role, s in sorted(meter.roles.items())
    }
    doc: dict[str, Any] = {
        "method": method,
        "namespace": result.playbook.namespace,
        "batch_sizes": result.batch_sizes,
        "iterations": len(result.iterations),
        "traces": sum(result.batch_sizes),
        "wall_s": round(result.wall_s, 4),
        "critical_path_s": round(result.critical_path_s, 4),
        "llm_calls": meter.calls,
        "prompt_tokens": meter.usage.prompt_tokens,
        "completion_tokens": meter.usage.completion_tokens,
        "roles": roles,
        "playbook_entries": len(result.playbook.bullets),
        "playbook_tokens": playbook_tokens(result.playbook),
        "playbook_version": result.playbook.version,
        "simulated": bool(meter.simulated and not meter.real),
        "skipped_traces": meter.skipped_traces,
        "skipped_groups": meter.skipped_groups,
        "merge_fallbacks": meter.merge_fallbacks,
        "dedup": {
            "folded_proposals": meter.folded_proposals,
            "folded_ops": meter.folded_ops,
            "seconds": round(meter.dedup_s, 4),
        },
        "endpoint": _display(settings.openai_base_url),
        "models": {r.value: m for r, m in settings.models().items()},
        "method_config": {
            "p": settings.p,
            "max_group_items": settings.max_group_items,
            "max_fan_in": settings.max_fan_in,
        },
        "per_iteration": [
            {
                "window_id": it.window_id,
                "batch_size": it.batch_size,
                "reflections": it.reflections,
                "llm_calls": it.llm_calls,
                "group_calls": it.group_calls,
                "merge_calls": it.merge_calls,
                "ops": it.ops,
                "wall_s": round(it.wall_s, 4),
                "critical_path_s": round(it.critical_path_s, 4),
                "playbook_entries": it.playbook_entries,
                "applied": _counted(it.applied),
                "trial": it.trial,
            }
            for it in result.iterations
        ],
        "applied": _counted(functools.reduce(ApplyStats.merge, (it.applied for it in result.iterations), ApplyStats())),
    }
    if result.decision is not None:
        doc["controller"] = result.decision.as_dict()
    if extra:
        doc.update(extra)
    return doc


def _counted(stats: ApplyStats) -> dict[str, int]:
    """The non-zero counts of an application (an op the playbook did not keep shows here: deduplicated, evicted)."""
    return {k: v for k, v in dataclasses.asdict(stats).items() if v}


def _display(url: str) -> str:
    from combee.settings import redact_url

    return redact_url(url)


async def _learn_async(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from combee.learner import LearnConfig, learn
    from combee.playbook import render_prompt

    settings = _settings(args)
    traces, skipped_lines = _load_trace_file(args.traces, args.namespace, err)
    namespaces = sorted({t.namespace for t in traces})
    if len(namespaces) > 1:
        raise CliError(
            f"{args.traces} holds traces of {len(namespaces)} namespaces ({', '.join(namespaces[:5])}); "
            "choose one with --namespace"
        )
    batch = 1 if args.method == "sequential" else args.batch_size
    controller = None
    if batch == "auto":
        from combee.controller import BatchSizeController

        controller = BatchSizeController(
            candidates=settings.bs_candidates, bs_min=settings.bs_min, bs_max=settings.bs_max
        )
    config = LearnConfig(
        method=method_config(settings, args.method, args.group_factor),
        batch_size=batch,
        epochs=args.epochs,
        controller=controller,
    )
    dedup = build_near_duplicates(settings, log=None if args.quiet else lambda m: err.write(f"combee: {m}\n"))
    progress = Progress(f"learning ({args.method})", err, quiet=args.quiet)
    llm = build_llm(settings)
    try:
        result = await learn(
            traces,
            llm,
            config,
            progress=lambda done, total, pb: progress.update(done, total, f"v{pb.version} {len(pb.bullets)} bullets"),
            dedup=dedup,
        )
        eval_doc: dict[str, Any] = {}
        if args.test is not None:
            eval_doc = await _evaluate_file(args.test, result.playbook, llm, err)
    finally:
        progress.close()
        await llm.aclose()
    if result.decision is not None:
        err.write(f"controller: {result.decision.explain()}\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "playbook.json").write_text(result.playbook.model_dump_json(indent=2) + "\n")
    (args.out / "prompt.md").write_text(render_prompt(result.playbook))
    doc = metrics_document(
        result,
        method=args.method,
        settings=settings,
        extra={"skipped_lines": skipped_lines, "epochs": args.epochs, "cost_usd": llm.stats.cost_usd, **eval_doc},
    )
    (args.out / "metrics.json").write_text(json.dumps(doc, indent=2) + "\n")
    label = " (SIMULATED endpoint)" if doc["simulated"] else ""
    out.write(
        f"learned {doc['playbook_entries']} bullets (version {doc['playbook_version']}) from {doc['traces']} traces "
        f"in {doc['iterations']} iterations, {doc['wall_s']:.1f}s, {doc['llm_calls']} LLM calls, "
        f"{doc['prompt_tokens'] + doc['completion_tokens']} tokens{label}\n"
        f"wrote {args.out / 'playbook.json'}, {args.out / 'prompt.md'}, {args.out / 'metrics.json'}\n"
    )
    return 0


async def _evaluate_file(path: Path, playbook: Any, llm: Any, err: TextIO) -> dict[str, Any]:
    from combee.learner import EvalTask, evaluate

    if not path.exists():
        raise CliError(f"test file not found: {path}")
    tasks = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            tasks.append(EvalTask(str(obj["task_id"]), str(obj["task"]), str(obj["ground_truth"])))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            err.write(f"combee: {path}:{number}: skipped test task: {type(exc).__name__}: {exc}\n")
    result = await evaluate(tasks, playbook, llm)
    return {"eval": {"accuracy": result.accuracy, "correct": result.correct, "total": result.total,
                     "unparsed": result.unparsed}}  # fmt: skip


def cmd_learn(args: argparse.Namespace) -> int:
    return asyncio.run(_learn_async(args, sys.stdout, sys.stderr))


# --- sim ------------------------------------------------------------------------------------------------


def cmd_sim_traces(args: argparse.Namespace) -> int:
    from combee.models import validate_namespace
    from combee.sim.world import WORLDS, generate_traces

    validate_namespace(args.namespace)
    if args.world not in WORLDS:
        raise CliError(f"unknown world {args.world!r}; choose one of {', '.join(sorted(WORLDS))}")
    traces, tests, truth = generate_traces(args.n, args.seed, namespace=args.namespace, world=args.world,
                                           test_n=args.test_n)  # fmt: skip
    write_trace_set(args.out, traces, tests, truth)
    print(
        f"wrote {len(traces)} SIMULATED traces to {args.out}, {len(tests)} held-out tasks to "
        f"{test_path(args.out)} and the ground truth to {truth_path(args.out)}"
    )
    return 0


def test_path(out: Path) -> Path:
    return out.with_name(out.stem + ".test.jsonl")


def truth_path(out: Path) -> Path:
    return out.with_name(out.stem + ".truth.json")


def write_trace_set(out: Path, traces: list[dict[str, Any]], tests: Sequence[Any], truth: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as fh:
        for t in traces:
            fh.write(json.dumps(t, separators=(",", ":")) + "\n")
    with test_path(out).open("w") as fh:
        for t in tests:
            fh.write(json.dumps({"task_id": t.task_id, "namespace": t.namespace, "task": t.task,
                                 "ground_truth": t.ground_truth, "insight": t.insight}) + "\n")  # fmt: skip
    truth_path(out).write_text(json.dumps(truth, indent=1) + "\n")


def cmd_sim_serve(args: argparse.Namespace) -> int:
    from combee.sim import runner

    argv = ["--host", args.host, "--port", str(args.port), "--seed", str(args.seed), "--world", args.world]
    argv += ["--time-scale", str(args.time_scale)]
    if args.max_concurrency is not None:
        argv += ["--max-concurrency", str(args.max_concurrency)]
    if args.profile is not None:
        argv += ["--profile", args.profile]
    if args.merge_capacity_factor is not None:
        argv += ["--merge-capacity-factor", args.merge_capacity_factor]
    for name in ("fault_500_rate", "fault_429_rate", "fault_timeout_rate", "fault_malformed_rate"):
        value = getattr(args, name)
        if value:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return runner.main(argv)


# --- demo -----------------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from combee.demo import run_demo

    return run_demo(args)


# --- parser ---------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"combee: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="combee", description="Combee: learn a better system prompt from agent traces, at scale.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("learn", help="learn a playbook offline from a JSON-lines trace file")
    p.add_argument("--traces", type=Path, required=True, help="JSON-lines file, one trace per line")
    p.add_argument("--method", choices=["combee", "sequential", "naive"], default="combee")
    p.add_argument("--batch-size", type=_batch_size, default=50, help="traces per iteration, or 'auto' (controller)")
    p.add_argument("--epochs", type=_positive_int, default=1)
    p.add_argument("--namespace", help="learn into this namespace (default: the traces' own)")
    p.add_argument("--test", type=Path, help="held-out tasks (JSON lines) to evaluate the final playbook on")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_method_options(p)
    _add_llm_options(p)
    p.set_defaults(func=cmd_learn)

    sim = sub.add_parser("sim", help="the SIMULATED OpenAI-compatible model (no real LLM)")
    simsub = sim.add_subparsers(dest="sim_command", required=True, parser_class=_Parser)
    s = simsub.add_parser("serve", help="serve the simulator over HTTP (OpenAI-compatible)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--world", default="combee", help="behaviour model: 'combee' (default) or 'none' (generic only)")
    s.add_argument("--time-scale", type=float, default=1.0, help="multiply every simulated delay (e.g. 0.05)")
    s.add_argument("--max-concurrency", type=_positive_int, help="server-side slots (default: the profile's, 256)")
    s.add_argument(
        "--profile",
        choices=("unlimited", "gpu", "api", "cpu"),
        help="serving profile (default unlimited; docs/simulator.md)",
    )
    s.add_argument(
        "--merge-capacity-factor",
        help="a merge of m proposals keeps at most factor x K(m), K the curator's law (default 1; 'unlimited')",
    )
    for name, help_ in (
        ("--fault-500-rate", "share of requests answered with HTTP 500"),
        ("--fault-429-rate", "share of requests answered with HTTP 429 + Retry-After"),
        ("--fault-timeout-rate", "share of requests that hang until the client times out"),
        ("--fault-malformed-rate", "share of answers with broken or schema-violating JSON"),
    ):
        s.add_argument(name, type=float, default=0.0, help=help_)
    s.set_defaults(func=cmd_sim_serve)
    t = simsub.add_parser("traces", help="write a SIMULATED trace set, held-out tasks and ground truth")
    t.add_argument("--n", type=_positive_int, required=True)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--namespace", default="demo")
    t.add_argument("--world", default="formula")
    t.add_argument("--test-n", type=int, default=400, help="held-out tasks to write next to the traces")
    t.set_defaults(func=cmd_sim_traces)

    d = sub.add_parser("demo", help="the main job end to end on embedded defaults (simulated model)")
    d.add_argument(
        "--traces", type=_positive_int, help="traces to learn from (default: 300 SIMULATED, or 6 real with --llm)"
    )
    d.add_argument("--batch-size", type=_batch_size, default=50)
    d.add_argument("--time-scale", type=float, default=0.02)
    d.add_argument("--out", type=Path, default=Path("var/demo"))
    d.add_argument("--rate", type=float, default=80.0, help="traces per second the SIMULATED fleet publishes")
    d.add_argument("--offline", action="store_true", help="learn in-process only (no Kafka/Redis)")
    d.add_argument("--timeout", type=float, default=600.0, help="give up waiting for the workers after SECONDS")
    d.add_argument(
        "--llm",
        choices=["sim", "local", "endpoint"],
        default="sim",
        help="sim: the SIMULATED model (default); local: the real local model (combee llm serve; needs the llm "
        "extra) on real Formula traces; endpoint: the real model at OPENAI_BASE_URL",
    )
    d.set_defaults(func=cmd_demo)

    from combee.bench.cli import add_bench_command
    from combee.cli_stream import add_stream_commands
    from combee.tasks.cli import add_task_command

    add_stream_commands(sub)
    add_bench_command(sub)
    add_task_command(sub)
    return parser


def _version() -> str:
    from combee import __version__

    return f"combee {__version__}"


HANDLED: tuple[type[BaseException], ...] = (CombeeError, CliError, OSError)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except CliError as exc:
        return _fail(str(exc), exc.code)
    except LLMRateLimited as exc:
        return _fail(f"the LLM endpoint keeps rate-limiting: {exc}", EXIT_LLM)
    except LLMUnavailable as exc:
        return _fail(f"cannot use the LLM endpoint: {exc}", EXIT_LLM)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except CombeeError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except OSError as exc:
        return _fail(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc), EXIT_USAGE)


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"combee: error: {message}\n")
    return code


if __name__ == "__main__":  # pragma: no cover
    # Run the package's module, not this __main__ copy, so that exception classes imported elsewhere
    # (combee.cli.CliError in combee.cli_stream) are the ones main() catches.
    from combee.cli import main as _main

    sys.exit(_main())
