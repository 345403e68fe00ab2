"""Starting and stopping one service (the single broker, Redis, or anything else recorded in a state dir):
launch, wait until it answers, signal only the verified process."""

from __future__ import annotations

import base64
import os
import shlex
import signal
import string
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from deploy.local.binaries import fetch_kafka, find_java, find_redis_server
from deploy.local.config import DEPLOY_DIR, HOST, KAFKA_HEAP, DeployError, StackConfig, say
from deploy.local.ports import port_in_use, require_free
from deploy.local.process import (
    CHILDREN,
    ProcessRecord,
    forget,
    is_same_process,
    live_record,
    log_path,
    read_proc,
    read_record,
    reap,
    tail,
    write_record,
)
from deploy.local.readiness import kafka_answering, redis_ping

__all__ = [
    "ensure_service",
    "kafka_broker_argv",
    "kafka_tool",
    "new_cluster_id",
    "port_of",
    "redis_argv",
    "redis_config_text",
    "send_signal",
    "spawn",
    "start_service",
    "stop_service",
    "wait_gone",
    "wait_ready",
    "write_private",
]

_STOP_GRACE_S = 30.0


def spawn(
    state_dir: Path,
    name: str,
    argv: list[str],
    cwd: Path,
    port: int,
    other_ports: tuple[int, ...] = (),
    secrets: tuple[str | None, ...] = (),
) -> ProcessRecord:
    log_file = log_path(state_dir, name)
    with open(log_file, "ab") as log:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"=== {stamp} deploy.local starting {name}: {shlex.join(argv)}\n".encode())
        log.flush()
        # Own session: Ctrl-C in the terminal that ran `up`/`exec` does not reach the servers directly;
        # they are stopped by down(), in order.
        child = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    CHILDREN[child.pid] = child
    info = read_proc(child.pid)
    if info is None:  # already gone
        code = child.wait()
        raise DeployError(
            f"{name} exited at once (exit {code}); last lines of {log_file}:\n{tail(log_file, secrets=secrets)}"
        )
    record = ProcessRecord(name, child.pid, tuple(argv), info.start_ticks, port, info.exe or "", other_ports)
    write_record(state_dir, record)
    return record


def wait_ready(
    state_dir: Path,
    record: ProcessRecord,
    answering: Callable[[], bool],
    deadline: float,
    timeout_s: float,
    secrets: tuple[str | None, ...] = (),
) -> None:
    log_file = log_path(state_dir, record.name)
    while True:
        if answering():
            return
        code = reap(record.pid)
        if not is_same_process(record, read_proc(record.pid)):
            how = f"exit code {code}" if code is not None else "process gone"
            raise DeployError(
                f"{record.name} stopped during startup ({how}); last lines of {log_file}:\n"
                f"{tail(log_file, secrets=secrets)}"
            )
        if time.monotonic() >= deadline:
            raise DeployError(
                f"{record.name} (pid {record.pid}) did not answer on {HOST}:{record.port} within "
                f"{timeout_s:g} s; last lines of {log_file}:\n{tail(log_file, secrets=secrets)}"
            )
        time.sleep(0.25)


def send_signal(record: ProcessRecord, sig: signal.Signals) -> bool:
    """Send ``sig`` to the recorded process if it is still that process. Uses a pidfd where available, so
    the identity check and the signal refer to the same process even if the PID were recycled in between."""
    child = CHILDREN.get(record.pid)
    if child is not None and child.poll() is None:
        # Our own unreaped child: its PID cannot have been recycled.
        child.send_signal(sig)
        return True
    try:
        pidfd = os.pidfd_open(record.pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        if not is_same_process(record, read_proc(record.pid)):
            return False
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(record.pid, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def wait_gone(record: ProcessRecord, timeout_s: float) -> bool:
    """Wait until the process has exited and its listening ports are released.

    The thread-group leader of a dying JVM can already show as a zombie while other threads still hold its
    sockets, so "not alive" alone is not enough for a restart on the same ports."""
    deadline = time.monotonic() + timeout_s
    while True:
        reap(record.pid)
        if not is_same_process(record, read_proc(record.pid)):
            CHILDREN.pop(record.pid, None)
            break
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    ports = (record.port, *record.other_ports)
    while any(port_in_use(port) for port in ports) and time.monotonic() < deadline + 10:
        time.sleep(0.1)
    return True


def stop_service(state_dir: Path, name: str, *, kill: bool = False, grace_s: float = _STOP_GRACE_S) -> bool:
    """Stop the process recorded for ``name`` (SIGTERM, then SIGKILL after ``grace_s``; SIGKILL at once if
    ``kill``). Returns True if it was running. A PID file whose process is gone or is now a different
    program is removed without signalling anything."""
    record = read_record(state_dir, name)
    if record is None:
        forget(state_dir, name)
        return False
    reap(record.pid)
    if not send_signal(record, signal.SIGKILL if kill else signal.SIGTERM):
        forget(state_dir, name)
        return False
    if not wait_gone(record, 10.0 if kill else grace_s):
        say(f"{name} (pid {record.pid}) ignored SIGTERM for {grace_s:g} s: sending SIGKILL")
        send_signal(record, signal.SIGKILL)
        if not wait_gone(record, 10.0):
            raise DeployError(f"{name} (pid {record.pid}) did not exit even after SIGKILL")
    forget(state_dir, name)
    return True


def _render_server_properties(cfg: StackConfig, log_dir: Path) -> str:
    template = string.Template((DEPLOY_DIR / "server.properties").read_text())
    return template.substitute(kafka_port=cfg.kafka_port, controller_port=cfg.controller_port, log_dir=str(log_dir))


def kafka_broker_argv(java: str, lib: Path, props: Path, heap: str) -> list[str]:
    """The JVM command line of one Kafka broker (a single node or a node of the local cluster)."""
    return [
        java, f"-Xms{heap}", f"-Xmx{heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
        "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={DEPLOY_DIR / 'log4j2.properties'}",
        "-cp", f"{lib}/*", "kafka.Kafka", str(props),
    ]  # fmt: skip


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding — what StorageTool random-uuid
    prints, without a JVM start (~2 s of CPU) for it. Kafka never hands out one starting with '-', which a
    command line would read as an option."""
    while True:
        text = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def kafka_tool(java: str, lib: Path, args: list[str], log_file: Path) -> str:
    cmd = [java, "-Xmx256m", f"-Dlog4j2.configurationFile={DEPLOY_DIR / 'log4j2.properties'}",
           "-cp", f"{lib}/*", "kafka.tools.StorageTool", *args]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    with open(log_file, "a") as log:
        log.write(f"=== deploy.local: {shlex.join(cmd)}\n{proc.stdout}{proc.stderr}")
    if proc.returncode != 0:
        raise DeployError(
            f"kafka.tools.StorageTool {args[0]} failed (exit {proc.returncode}); "
            f"last lines of {log_file}:\n{tail(log_file)}"
        )
    return proc.stdout


def _launch_kafka(state_dir: Path, cfg: StackConfig) -> ProcessRecord:
    lib = fetch_kafka(cfg.kafka_version)
    java = find_java()
    require_free(cfg.kafka_port, "Kafka")
    require_free(cfg.controller_port, "Kafka controller")
    kafka_dir = state_dir / "kafka"
    data_dir = kafka_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    props = kafka_dir / "server.properties"
    props.write_text(_render_server_properties(cfg, data_dir))
    log_file = log_path(state_dir, "kafka")
    if not (data_dir / "meta.properties").exists():
        # First start only: a formatted log dir is reused so topics and offsets survive restarts.
        kafka_tool(java, lib, ["format", "-t", new_cluster_id(), "-c", str(props), "--ignore-formatted"], log_file)
    argv = kafka_broker_argv(java, lib, props, os.environ.get("COMBEE_KAFKA_HEAP", KAFKA_HEAP))
    return spawn(state_dir, "kafka", argv, kafka_dir, cfg.kafka_port, (cfg.controller_port,))


def redis_config_text(password: str | None) -> str:
    """The lines of redis.conf that must not be on a command line: ``requirepass`` (every byte of the password
    but letters and digits written as a ``\\xHH`` escape, so no password can break out of the quoted string)."""
    if not password:
        return "# no password: deploy.local was started without --redis-password\n"
    quoted = "".join(chr(b) if b < 128 and chr(b).isalnum() else f"\\x{b:02x}" for b in password.encode())
    return f'requirepass "{quoted}"\n'


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (mode 0600 from the first byte, not chmod after)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    tmp.replace(path)


def redis_argv(binary: str, cfg: StackConfig, redis_dir: Path) -> list[str]:
    """redis-server's command line: its secrets are in ``redis_dir/redis.conf`` (written here, mode 0600), never
    in argv, which every local user can read in /proc and which the log records."""
    conf = redis_dir / "redis.conf"
    write_private(conf, redis_config_text(cfg.redis_password))
    return [
        binary, str(conf), "--bind", HOST, "--port", str(cfg.redis_port), "--save", "", "--appendonly", "no",
        "--dir", str(redis_dir), "--dbfilename", "dump.rdb", "--daemonize", "no",
    ]  # fmt: skip


def _launch_redis(state_dir: Path, cfg: StackConfig) -> ProcessRecord:
    binary = find_redis_server()
    require_free(cfg.redis_port, "Redis")
    redis_dir = state_dir / "redis"
    redis_dir.mkdir(parents=True, exist_ok=True)
    argv = redis_argv(binary, cfg, redis_dir)
    return spawn(state_dir, "redis", argv, redis_dir, cfg.redis_port, secrets=(cfg.redis_password,))


def _answering(name: str, cfg: StackConfig) -> Callable[[], bool]:
    if name == "kafka":
        return lambda: kafka_answering(cfg.kafka_port)
    return lambda: redis_ping(cfg.redis_port, cfg.redis_password)


def port_of(name: str, cfg: StackConfig) -> int:
    return cfg.kafka_port if name == "kafka" else cfg.redis_port


def start_service(state_dir: Path, name: str, cfg: StackConfig, deadline: float, timeout_s: float) -> None:
    started = time.monotonic()
    record = _launch_kafka(state_dir, cfg) if name == "kafka" else _launch_redis(state_dir, cfg)
    try:
        wait_ready(state_dir, record, _answering(name, cfg), deadline, timeout_s, (cfg.redis_password,))
    except BaseException:
        stop_service(state_dir, name, kill=True)
        raise
    say(f"{name}: started pid {record.pid} on {HOST}:{record.port} in {time.monotonic() - started:.1f} s")


def ensure_service(state_dir: Path, name: str, cfg: StackConfig, deadline: float, timeout_s: float) -> bool:
    """Reuse the recorded ``name`` if it runs, else start it. Returns True if it was started here."""
    record = live_record(state_dir, name)
    if record is None:
        forget(state_dir, name)
        start_service(state_dir, name, cfg, deadline, timeout_s)
        return True
    if record.port != port_of(name, cfg):
        raise DeployError(
            f"{name} from {state_dir} already runs on port {record.port}, not {port_of(name, cfg)}: "
            "run `python -m deploy.local down` first, or use another COMBEE_STATE_DIR"
        )
    wait_ready(state_dir, record, _answering(name, cfg), deadline, timeout_s, (cfg.redis_password,))
    say(f"{name}: reusing pid {record.pid} on {HOST}:{record.port}")
    return False
