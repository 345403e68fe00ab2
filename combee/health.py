"""What a worker knows of the services it depends on: up or down, since when, the last error, what waits.

Pure bookkeeping: the worker's probes and its LLM calls report outcomes with the time they saw them
(:meth:`HealthBoard.up`, :meth:`HealthBoard.down`); the board keeps one :class:`DependencyHealth` per dependency
and turns it into the plain data that ``combee status``, ``combee ui`` and the metrics show
(:meth:`HealthBoard.report`). No clock, no I/O: times come in as numbers (wall-clock seconds).

A dependency is named for its role in the pipeline: ``llm`` (the endpoint every role uses, or ``llm-<role>`` for
a role with its own), ``embeddings`` (an embeddings endpoint, when one is configured), ``kafka`` and ``redis``.
Errors are kept as one line of at most :data:`MAX_ERROR_CHARS` characters; the caller redacts them first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

__all__ = [
    "MAX_ERROR_CHARS",
    "STALE_AFTER_S",
    "DependencyHealth",
    "HealthBoard",
    "State",
    "describe_dependency",
    "describe_duration",
    "one_line",
]

State = Literal["unknown", "up", "down"]
MAX_ERROR_CHARS = 240
STALE_AFTER_S = 30.0
"""A worker's report older than this is shown as stale: the worker stopped writing it (or cannot reach Redis)."""


def one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` on one line (whitespace runs folded into single spaces), cut to ``limit`` characters."""
    folded = " ".join(text.split())
    return folded if len(folded) <= limit else folded[: limit - 1] + "…"


@dataclass(frozen=True)
class DependencyHealth:
    """One dependency: ``state`` since ``since`` (when it last changed), the last error seen while down (None
    once it is up again), when it was last checked, and how many failures in a row."""

    name: str
    target: str
    state: State = "unknown"
    since: float | None = None
    last_error: str | None = None
    checked_at: float | None = None
    failures: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target": self.target,
            "state": self.state,
            "since": self.since,
            "last_error": self.last_error,
            "checked_at": self.checked_at,
            "failures": self.failures,
        }


@dataclass
class HealthBoard:
    """Every dependency of one worker. ``targets`` names each one's address (redacted: no credentials)."""

    targets: Mapping[str, str]
    _deps: dict[str, DependencyHealth] = field(init=False)

    def __post_init__(self) -> None:
        self._deps = {name: DependencyHealth(name, target) for name, target in self.targets.items()}

    def __contains__(self, name: str) -> bool:
        return name in self._deps

    def get(self, name: str) -> DependencyHealth:
        """Raises KeyError for a dependency the board does not track."""
        return self._deps[name]

    def up(self, name: str, now: float) -> bool:
        """``name`` answered at ``now``; True when that changed its state. Unknown names are ignored."""
        dep = self._deps.get(name)
        if dep is None:
            return False
        changed = dep.state != "up"
        self._deps[name] = replace(
            dep, state="up", since=now if changed else dep.since, last_error=None, checked_at=now, failures=0
        )
        return changed

    def down(self, name: str, error: str, now: float) -> bool:
        """``name`` failed at ``now`` with ``error`` (already redacted); True when that changed its state."""
        dep = self._deps.get(name)
        if dep is None:
            return False
        changed = dep.state != "down"
        self._deps[name] = replace(
            dep,
            state="down",
            since=now if changed else dep.since,
            last_error=one_line(error),
            checked_at=now,
            failures=dep.failures + 1,
        )
        return changed

    def down_names(self) -> list[str]:
        return [name for name, dep in self._deps.items() if dep.state == "down"]

    def report(self, holds_up: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, dict[str, Any]]:
        """Each dependency as plain data, with ``holds_up`` (what waits on it: ``{"windows_waiting": 2}``, ...)
        attached to the dependencies that are down."""
        out = {}
        for name, dep in self._deps.items():
            entry = dep.as_dict()
            entry["holds_up"] = dict((holds_up or {}).get(name, {})) if dep.state == "down" else {}
            out[name] = entry
        return out


def describe_duration(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 4 min``: how long, for a person."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


_WAITING = (
    ("windows_waiting", "window"),
    ("traces_buffered", "trace buffered", "traces buffered"),
    ("tasks_in_flight", "task in flight", "tasks in flight"),
    ("versions_waiting", "version to publish", "versions to publish"),
)


def _holds_up(holds: Mapping[str, Any]) -> str:
    parts = []
    for key, one, *many in _WAITING:
        n = holds.get(key)
        if isinstance(n, int) and n > 0:
            parts.append(f"{n} {one if n == 1 else (many[0] if many else one + 's')}")
    return ", ".join(parts) if parts else "nothing yet"


def describe_dependency(entry: Mapping[str, Any], now: float) -> str:
    """One line for a dependency of a health report (:meth:`HealthBoard.report`): ``llm http://...: DOWN for
    2 min 5 s: <error>; holds up 1 window, 5 traces buffered`` or ``kafka 127.0.0.1:9092: up``."""
    name, target, state = entry.get("name", "?"), entry.get("target", ""), entry.get("state", "unknown")
    head = f"{name} {target}".strip()
    if state == "down":
        since = entry.get("since")
        how_long = f" for {describe_duration(now - since)}" if isinstance(since, int | float) else ""
        error = entry.get("last_error") or "no error recorded"
        holds = entry.get("holds_up")
        return f"{head}: DOWN{how_long}: {error}; holds up {_holds_up(holds if isinstance(holds, Mapping) else {})}"
    if state == "up":
        return f"{head}: up"
    return f"{head}: not checked yet"
