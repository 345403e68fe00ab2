"""Process identity: /proc, launch records, PID files. A process is recognised by PID, start time,
executable and command line, so a recycled PID is never taken for the process launched here."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.local.config import LOG_TAIL_LINES, write_json

__all__ = [
    "CHILDREN",
    "ProcInfo",
    "ProcessRecord",
    "cmdline_matches",
    "exit_on_signal",
    "forget",
    "indent",
    "is_same_process",
    "live_record",
    "log_path",
    "parse_proc_stat",
    "read_proc",
    "read_record",
    "reap",
    "tail",
    "write_record",
]

# Popen objects of the servers started by this interpreter: kept so that they are reaped (no zombies, no
# "subprocess still running" warnings) and so that an early exit can report its exit code.
CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


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


def log_path(state_dir: Path, name: str) -> Path:
    return state_dir / f"{name}.log"


def read_record(state_dir: Path, name: str) -> ProcessRecord | None:
    pid_file = _pid_path(state_dir, name)
    try:
        pid = int(pid_file.read_text().strip())
        record = ProcessRecord.from_json(json.loads(_record_path(state_dir, name).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if record.pid == pid else None


def write_record(state_dir: Path, record: ProcessRecord) -> None:
    write_json(_record_path(state_dir, record.name), record.to_json())
    _pid_path(state_dir, record.name).write_text(f"{record.pid}\n")


def forget(state_dir: Path, name: str) -> None:
    for path in (_pid_path(state_dir, name), _record_path(state_dir, name)):
        path.unlink(missing_ok=True)


def live_record(state_dir: Path, name: str) -> ProcessRecord | None:
    """The recorded process for ``name`` if it is still running, else None."""
    record = read_record(state_dir, name)
    if record is None:
        return None
    reap(record.pid)
    return record if is_same_process(record, read_proc(record.pid)) else None


def reap(pid: int) -> int | None:
    """Collect the exit status if ``pid`` is our exited child; return it (None if running or not ours)."""
    child = CHILDREN.get(pid)
    if child is not None:
        return child.poll()
    with contextlib.suppress(ChildProcessError, OSError):
        done, status_ = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status_)
    return None


def tail(path: Path, lines: int = LOG_TAIL_LINES, secrets: Sequence[str | None] = ()) -> str:
    """The last ``lines`` of a log, indented, with every one of ``secrets`` masked (a log written by an older
    version, or by a server that echoes a bad config line, may hold one)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return f"    ({path} is missing)"
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return indent(text.splitlines()[-lines:])


def indent(lines: Sequence[str]) -> str:
    return "\n".join("    " + line for line in lines)


def exit_on_signal(signum: int, _frame: object) -> None:
    # Unwind instead of dying on the spot, so that a half-done `up` stops what it started (see up()).
    raise SystemExit(128 + signum)
