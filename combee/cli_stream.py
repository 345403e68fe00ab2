"""``combee`` verbs of the streaming system: worker, publish, prompt, replay, status, dev, llm.

Thin: each verb reads settings, calls the SDK (:mod:`streams`) or the worker (:mod:`workers`), prints.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from combee.cli import EXIT_SERVICE, CliError, _load_trace_file, _positive_int, _settings

__all__ = ["add_stream_commands"]


def _stream_settings(args: argparse.Namespace) -> Any:
    settings = _settings(args)
    updates: dict[str, Any] = {}
    for arg, field in (("bootstrap", "kafka_bootstrap"), ("redis_url", "redis_url"), ("prefix", "topic_prefix")):
        value = getattr(args, arg, None)
        if value:
            updates[field] = value
    if getattr(args, "prefix", None):
        updates["key_prefix"] = args.prefix
    return settings.model_copy(update=updates) if updates else settings


def _service_errors(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Kafka or Redis unreachable, or refusing the credentials, ends a verb with one line and status 4."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        import redis.exceptions
        from aiokafka.errors import KafkaError as AIOKafkaError
        from kafka.errors import KafkaError

        try:
            return func(args)
        except (KafkaError, AIOKafkaError, redis.exceptions.RedisError) as exc:
            from streams.redis_store import redact

            service = "Redis" if isinstance(exc, redis.exceptions.RedisError) else "Kafka"
            try:
                s = _stream_settings(args)
                secrets = [x.get_secret_value() for x in (s.redis_password, s.kafka_sasl_password) if x is not None]
            except Exception:  # the settings themselves are fine by now; this is only for redaction
                secrets = []
            message = redact(f"{type(exc).__name__}: {exc}", secrets)[:400]
            raise CliError(f"{service}: {message}", EXIT_SERVICE) from None

    return run


def _add_connection_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("services (default: $COMBEE_KAFKA_BOOTSTRAP, $COMBEE_REDIS_URL, COMBEE_* settings)")
    g.add_argument("--bootstrap", help="Kafka bootstrap servers, e.g. 127.0.0.1:9092")
    g.add_argument("--redis-url", help="Redis URL, e.g. redis://127.0.0.1:6379/0 (password: $COMBEE_REDIS_PASSWORD)")
    g.add_argument("--prefix", help="topic and key prefix (default: combee)")


# --- worker ---------------------------------------------------------------------------------------------


def cmd_worker(args: argparse.Namespace) -> int:
    from workers.main import run_worker

    settings = _stream_settings(args)
    if args.concurrency:
        settings = settings.model_copy(update={"curate_concurrency": args.concurrency})
    roles = ("learner", "curate") if args.role == "all" else (args.role,)
    return run_worker(settings, roles=roles, until_idle_s=args.until_idle, loglevel=args.log_level)


# --- publish --------------------------------------------------------------------------------------------


def cmd_publish(args: argparse.Namespace) -> int:
    from streams.publisher import TracePublisher
    from streams.topics import Topics

    settings = _stream_settings(args)
    traces, skipped = _load_trace_file(args.traces, args.namespace, sys.stderr)
    topics = Topics(prefix=settings.topic_prefix, partitions=settings.partitions)
    with TracePublisher(settings, topics) as publisher:
        publisher.publish_many(traces)
        publisher.flush(60)
        failed = publisher.failed
    counts: dict[str, int] = {}
    for t in traces:
        counts[t.namespace] = counts.get(t.namespace, 0) + 1
    summary = ", ".join(f"{ns}: {n}" for ns, n in sorted(counts.items()))
    print(f"published {len(traces) - failed} traces to {topics.traces} ({summary}); {skipped} malformed lines skipped")
    return 1 if failed else 0


# --- prompt ---------------------------------------------------------------------------------------------


def _client(settings: Any, namespace: str) -> Any:
    from combee.models import validate_namespace
    from streams.client import PromptClient

    validate_namespace(namespace)
    return PromptClient(settings, namespace, key_prefix=settings.key_prefix)


def cmd_prompt(args: argparse.Namespace) -> int:
    from streams.client import PromptUnavailable

    settings = _stream_settings(args)
    if args.prompt_command == "rollback":
        return _rollback(settings, args)
    with _client(settings, args.namespace) as client:
        try:
            if args.prompt_command == "get":
                v = client.get()
                if args.json:
                    print(json.dumps({"namespace": v.namespace, "version": v.version, "prompt": v.prompt,
                                      "window_id": v.window_id, "published_at": v.published_at}))  # fmt: skip
                else:
                    print(f"# namespace {v.namespace} · version {v.version} · window {v.window_id}", file=sys.stderr)
                    print(v.prompt, end="")
            elif args.prompt_command == "history":
                for h in client.history(limit=args.limit):
                    when = (
                        datetime.fromtimestamp(h.published_at).isoformat(timespec="seconds") if h.published_at else "-"
                    )
                    note = (h.meta or {}).get("note") or ""
                    print(f"v{h.version:<6} {when}  bullets={h.bullets}  tokens={h.tokens}  {h.window_id or ''} {note}")
            else:  # watch
                for count, v in enumerate(client.watch(timeout=args.timeout), start=1):
                    print(f"--- version {v.version} (window {v.window_id}) ---", flush=True)
                    if not args.versions_only:
                        print(v.prompt, flush=True)
                    if args.count and count >= args.count:
                        break
        except PromptUnavailable as exc:
            raise CliError(str(exc), 4) from None
    return 0


def _rollback(settings: Any, args: argparse.Namespace) -> int:
    from kafka import KafkaProducer

    from combee.models import validate_namespace
    from streams.codec import encode
    from streams.envelopes import Control
    from streams.kafka_config import kafka_security_kwargs
    from streams.topics import Topics

    validate_namespace(args.namespace)
    with _client(settings, args.namespace) as client:
        before = client.get().version
        if not 1 <= args.to <= before:
            raise CliError(f"no version {args.to} to roll back to (current is {before})")
        topics = Topics(prefix=settings.topic_prefix, partitions=settings.partitions)
        producer = KafkaProducer(
            bootstrap_servers=settings.kafka_bootstrap, acks="all", **kafka_security_kwargs(settings)
        )
        ctrl = Control(namespace=args.namespace, kind="rollback", to_version=args.to, requested_at=time.time())
        producer.send(topics.partials, key=args.namespace.encode(), value=encode(ctrl)).get(timeout=30)
        producer.close()
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            v = client.get()
            if v.version > before:
                print(f"{args.namespace}: version {v.version} now holds the content of version {args.to}")
                return 0
            time.sleep(0.5)
    raise CliError(
        f"rollback requested, but no new version appeared within {args.timeout:g}s (is a worker running?)", 4
    )


# --- replay ---------------------------------------------------------------------------------------------


def cmd_replay(args: argparse.Namespace) -> int:
    from streams.replay import replay

    settings = _stream_settings(args)
    report = replay(
        settings,
        namespace=args.namespace,
        into=args.into,
        start=args.start,
        batch_size=args.batch_size,
        windows=args.windows,
    )
    print(
        f"replaying {report.traces} traces of {args.namespace} (partition {report.partition}, offsets "
        f"{report.first_offset}..{report.end_offset - 1}) into {args.into} as {report.windows} windows "
        f"({report.windows_from_log} as logged, {report.windows - report.windows_from_log} fresh)"
    )
    if not args.wait:
        return 0
    with _client(settings, args.into) as client:
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            try:
                v = client.get()
                if v.version >= report.windows:
                    print(f"{args.into}: learned version {v.version} from the replay")
                    return 0
            except Exception:
                pass
            time.sleep(1.0)
    raise CliError(f"replay sent, but {args.into} did not reach version {report.windows} in {args.timeout:g}s", 4)


# --- status ---------------------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    from streams.status import collect_status

    settings = _stream_settings(args)
    rows = asyncio.run(collect_status(settings, args.namespace))
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    if not rows:
        print("no namespaces published yet")
        return 0
    for row in rows:
        st = row.get("worker_status") or {}
        ctl = st.get("controller") or {}
        print(
            f"{row['namespace']}: version {row.get('version')}, traces seen {st.get('traces_seen', '-')}, "
            f"lag {row.get('lag', '-')}, windows in flight {st.get('windows_in_flight', '-')}, "
            f"buffered {st.get('buffered', '-')}"
        )
        print(f"  controller: {ctl.get('why', 'no report from a worker (is one running?)')}")
    return 0


# --- dev ------------------------------------------------------------------------------------------------


def cmd_dev(args: argparse.Namespace) -> int:
    from deploy import llm, local

    argv = [] if args.state_dir is None else ["--state-dir", str(args.state_dir)]
    with_llm = args.llm or "--llm" in args.rest
    llm_code = llm.main([*argv, "down", "--quiet"]) if args.dev_command == "down" else 0  # if one runs
    code = local.main([*argv, args.dev_command, *(a for a in args.rest if a != "--llm")])
    if code == 0 and with_llm and args.dev_command == "up":
        code = llm.main([*argv, "up"])
    return code or llm_code


# --- llm ------------------------------------------------------------------------------------------------


def cmd_llm(args: argparse.Namespace) -> int:
    from deploy import llm

    try:
        return llm.run_command({"serve": "up", "stop": "down"}.get(args.llm_command, args.llm_command), args)
    except llm.DeployError as exc:
        raise CliError(str(exc), EXIT_SERVICE) from None


def add_stream_commands(sub: Any) -> None:
    from deploy.llm import add_up_arguments  # standard library only: cheap, and needs no llm extra

    p = sub.add_parser("worker", help="run the streaming workers (Faust)")
    p.add_argument("--role", choices=["all", "learner", "curate"], default="all")
    p.add_argument("--until-idle", type=float, metavar="SECONDS", help="exit after SECONDS with nothing to do")
    p.add_argument("--concurrency", type=_positive_int, help="curator calls in flight (default 8)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    _add_connection_options(p)
    p.set_defaults(func=_service_errors(cmd_worker))

    p = sub.add_parser("publish", help="publish a JSON-lines trace file to the traces topic")
    p.add_argument("--traces", type=Path, required=True)
    p.add_argument("--namespace", help="publish every trace into this namespace")
    _add_connection_options(p)
    p.set_defaults(func=_service_errors(cmd_publish))

    p = sub.add_parser("prompt", help="read the learned prompt of a namespace from Redis")
    psub = p.add_subparsers(dest="prompt_command", required=True, parser_class=type(p))
    g = psub.add_parser("get", help="print the current prompt")
    g.add_argument("namespace")
    g.add_argument("--json", action="store_true")
    w = psub.add_parser("watch", help="print every new version as it is published")
    w.add_argument("namespace")
    w.add_argument("--count", type=_positive_int, help="stop after COUNT versions")
    w.add_argument("--timeout", type=float, help="stop after SECONDS without a new version")
    w.add_argument("--versions-only", action="store_true")
    h = psub.add_parser("history", help="list published versions, newest first")
    h.add_argument("namespace")
    h.add_argument("--limit", type=_positive_int, default=20)
    r = psub.add_parser("rollback", help="publish an earlier version's content as a new version")
    r.add_argument("namespace")
    r.add_argument("--to", type=_positive_int, required=True, metavar="VERSION")
    r.add_argument("--timeout", type=float, default=60.0)
    for q in (g, w, h, r):
        _add_connection_options(q)
    p.set_defaults(func=cmd_prompt)

    p = sub.add_parser("replay", help="relearn a namespace's traces from Kafka into another namespace")
    p.add_argument("--namespace", required=True, help="the namespace whose traces to replay")
    p.add_argument("--from", dest="start", default="earliest", help="earliest, an offset, or an ISO time")
    p.add_argument("--into", required=True, help="the namespace to learn into (fresh)")
    p.add_argument("--windows", choices=["logged", "fresh"], default="logged",
                   help="reuse the source's logged window boundaries (default) or cut fresh ones")  # fmt: skip
    p.add_argument("--batch-size", type=_positive_int, help="size of fresh windows (default: $COMBEE_BS_DEFAULT)")
    p.add_argument("--wait", action="store_true", help="wait until the replayed versions are published")
    p.add_argument("--timeout", type=float, default=600.0)
    _add_connection_options(p)
    p.set_defaults(func=_service_errors(cmd_replay))

    p = sub.add_parser("status", help="per namespace: version, traces seen, lag, windows in flight, controller")
    p.add_argument("namespace", nargs="?")
    p.add_argument("--json", action="store_true")
    _add_connection_options(p)
    p.set_defaults(func=_service_errors(cmd_status))

    p = sub.add_parser("dev", help="start/stop a local Kafka + Redis (deploy/local.py)")
    p.add_argument("dev_command", choices=["up", "down", "status", "restart", "fetch"])
    p.add_argument("rest", nargs=argparse.REMAINDER, help="options passed to deploy/local.py")
    p.add_argument("--state-dir", type=Path)
    p.add_argument("--llm", action="store_true", help="up: also start the real local model (combee llm serve)")
    p.set_defaults(func=cmd_dev)

    p = sub.add_parser("llm", help="a REAL local model: llama.cpp server on 127.0.0.1 (deploy/llm.py)")
    lsub = p.add_subparsers(dest="llm_command", required=True, parser_class=type(p))
    serve = lsub.add_parser("serve", help="start (or reuse) it in the background; print export lines")
    add_up_arguments(serve)
    lsub.add_parser("stop", help="stop it (by verified PID)")
    st = lsub.add_parser("status", help="pid, url, model alias, slots, context per slot")
    st.add_argument("--json", action="store_true")
    for q in lsub.choices.values():
        q.add_argument("--state-dir", type=Path, help="PID file and log (env COMBEE_STATE_DIR; default var/dev)")
    p.set_defaults(func=cmd_llm)
