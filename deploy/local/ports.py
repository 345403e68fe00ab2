"""Ports: is one free, and if not, who holds it (for an error message that names the culprit)."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from pathlib import Path

from deploy.local.config import HOST, DeployError
from deploy.local.process import read_proc

__all__ = [
    "ephemeral_range",
    "listening_inodes",
    "port_in_use",
    "port_owner",
    "require_free",
]


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


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def require_free(port: int, what: str) -> None:
    if not port_in_use(port):
        return
    owner = port_owner(port)
    if owner:
        detail = f" by {owner} — not a process started from this state dir; stop it or pick another port"
    else:
        low, high = ephemeral_range()
        detail = " (no listener: probably a recently closed connection still in TIME_WAIT; wait a minute"
        detail += f", and prefer a port outside the ephemeral range {low}-{high})" if low <= port <= high else ")"
    raise DeployError(f"port {port} ({what}) on {HOST} is already in use{detail}")
