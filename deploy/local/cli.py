"""`python -m deploy.local`: the command line, and `exec` (run a command with the services up)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deploy.local.binaries import fetch_kafka
from deploy.local.cluster import ClusterServices, cluster_up, restart_node
from deploy.local.config import DEFAULT_KAFKA_PORT, DEFAULT_REDIS_PORT, SERVICE_NAMES, DeployError, env_int, say
from deploy.local.process import exit_on_signal
from deploy.local.stack import Services, down, restart_kafka, restart_redis, status, up

__all__ = [
    "build_parser",
    "main",
    "run_with_services",
]


def _run_child(cmd: Sequence[str], env: dict[str, str]) -> int:
    """Run ``cmd`` in the foreground; SIGTERM/SIGHUP to us are passed on to it, and Ctrl-C (which the
    terminal sends to it as well) does not interrupt our cleanup. Returns a shell-style exit code."""
    try:
        child = subprocess.Popen(list(cmd), env=env)
    except OSError as exc:
        say(f"cannot run {cmd[0]!r}: {exc.strerror}")
        return 127 if isinstance(exc, FileNotFoundError) else 126

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    if threading.current_thread() is not threading.main_thread():
        code = child.wait()
        return 128 - code if code < 0 else code
    previous = {
        sig: signal.signal(sig, forward if sig != signal.SIGINT else signal.SIG_IGN)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    }
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def run_with_services(cmd: Sequence[str], state_dir: Path | None = None, nodes: int = 1, **up_args: Any) -> int:
    """`exec`: bring the stack up, run ``cmd`` with COMBEE_KAFKA_BOOTSTRAP / COMBEE_REDIS_URL set, then stop
    what this call started (services that were already running are left alone). Returns cmd's exit code.
    ``nodes`` > 1 brings up a local cluster of that many nodes instead of one broker (see cluster_up)."""
    services: Services | ClusterServices
    services = up(state_dir, **up_args) if nodes <= 1 else cluster_up(state_dir, nodes, **up_args)
    try:
        return _run_child(cmd, {**os.environ, **services.env(), "COMBEE_STATE_DIR": str(services.state_dir)})
    finally:
        if services.started:
            down(services.state_dir, services.started)


def _add_up_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kafka-port",
        type=int,
        default=env_int("COMBEE_KAFKA_PORT", DEFAULT_KAFKA_PORT),
        help="Kafka client port (env COMBEE_KAFKA_PORT; default %(default)s); the controller uses the next",
    )
    parser.add_argument(
        "--redis-port",
        type=int,
        default=env_int("COMBEE_REDIS_PORT", DEFAULT_REDIS_PORT),
        help="Redis port (env COMBEE_REDIS_PORT; default %(default)s)",
    )
    parser.add_argument(
        "--redis-password",
        default=os.environ.get("COMBEE_REDIS_PASSWORD") or None,
        help="require this Redis password (env COMBEE_REDIS_PASSWORD; default: none)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds to wait for the services to answer (default %(default)s)",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="Kafka nodes: 1 (default) is one broker; N > 1 is a local KRaft cluster replicating every topic N "
        "times (node i on --kafka-port + 2(i-1) and the next port)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.local",
        description="Run a real Kafka broker and redis-server on 127.0.0.1 for Combee development and tests.",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="PID files, logs and Kafka data (env COMBEE_STATE_DIR; default var/dev in the repo)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_up_arguments(sub.add_parser("up", help="start (or reuse) Kafka and Redis; print export lines"))
    sub.add_parser("down", help="stop the services recorded in the state dir")
    status_parser = sub.add_parser("status", help="pid, alive, port, answering per service")
    status_parser.add_argument("--json", action="store_true", help="print JSON")
    exec_parser = sub.add_parser("exec", help="up, run CMD with the env set, stop what this started")
    _add_up_arguments(exec_parser)
    exec_parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    restart_parser = sub.add_parser("restart", help="restart one service (fault injection by hand)")
    restart_parser.add_argument("service", choices=SERVICE_NAMES)
    restart_parser.add_argument("--kill", action="store_true", help="Kafka: SIGKILL instead of SIGTERM")
    restart_parser.add_argument("--node", type=int, default=None, help="Kafka in a cluster: the node id to restart")
    sub.add_parser("fetch", help="only fetch (and cache) the Kafka jars")
    for command_parser in sub.choices.values():  # also accepted after the command
        command_parser.add_argument("--state-dir", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def _format_status(report: dict[str, Any]) -> str:
    version = f"  (Kafka {report['kafka_version']})" if "kafka_version" in report else ""
    lines = [f"state dir: {report['state_dir']}{version}"]
    for name in report.get("services", SERVICE_NAMES):
        item = report[name]
        lines.append(
            f"{name:<6} pid={item['pid'] if item['pid'] is not None else '-':<8} "
            f"alive={'yes' if item['alive'] else 'no':<4} port={item['port'] or '-':<6} "
            f"answering={'yes' if item['answering'] else 'no':<4} log={item['log']}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    state_dir: Path | None = args.state_dir
    if threading.current_thread() is threading.main_thread():  # signal.signal() works only there
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, exit_on_signal)
    try:
        if args.command in ("up", "exec"):
            up_args: dict[str, Any] = {
                "kafka_port": args.kafka_port,
                "redis_port": args.redis_port,
                "redis_password": args.redis_password,
                "timeout_s": args.timeout,
            }
            if args.command == "up":
                services: Services | ClusterServices
                services = cluster_up(state_dir, args.nodes, **up_args) if args.nodes > 1 else up(state_dir, **up_args)
                sys.stdout.write(services.export_lines())
                return 0
            cmd = list(args.cmd)
            if cmd and cmd[0] == "--":
                cmd = cmd[1:]
            if not cmd:
                build_parser().error("exec needs a command: exec -- CMD [ARGS...]")
            return run_with_services(cmd, state_dir, args.nodes, **up_args)
        if args.command == "down":
            stopped = down(state_dir)
            if not stopped:
                say("nothing of ours was running")
            return 0
        if args.command == "status":
            report = status(state_dir)
            print(json.dumps(report, indent=2) if args.json else _format_status(report))
            return 0
        if args.command == "restart":
            if args.service == "kafka" and args.node is not None:
                restart_node(state_dir, args.node, kill=args.kill)
            elif args.service == "kafka":
                restart_kafka(state_dir, kill=args.kill)
            else:
                restart_redis(state_dir)
            return 0
        if args.command == "fetch":
            print(fetch_kafka())
            return 0
    except DeployError as exc:
        print(f"deploy.local: error: {exc}", file=sys.stderr)
        return 1
    raise AssertionError(f"unhandled command {args.command!r}")
