"""What ``combee ui`` shows, read from Redis and returned as plain data: the namespaces, a namespace's versions
and recent windows, one version, the diff of two versions, and the worker's report (the controller's decision).

Every read is one the other readers make: the store's ``namespaces``, ``current``, ``history``, ``get_version``,
``get_status`` and ``version_record`` (the read of ``combee prompt diff``); the diff itself is
:func:`combee.promptdiff.diff_versions` over :func:`combee.promptdiff.diff_span`. Nothing here renders.

What Redis holds about a window: its id, the version it produced, its trace ids (``meta["provenance"]`` of the
version that published it) and the publish time of that version. Its closing, mapping and applying times are
not stored (the workers' Prometheus histogram ``combee_window_latency_seconds`` has them); the worker's report
carries close-to-applied quantiles over its recent windows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from combee.health import STALE_AFTER_S, describe_dependency
from combee.models import Playbook
from combee.outcomes import OutcomeCounts
from combee.promptdiff import PromptDiff, VersionRecord, WindowProvenance, bound_span, diff_span, diff_versions
from combee.store import PublishedPrompt
from streams.redis_records import HistoryEntry
from streams.redis_store import DEFAULT_HISTORY_LIMIT

__all__ = [
    "DEFAULT_VERSIONS",
    "DEFAULT_WINDOWS",
    "NamespaceOverview",
    "NamespaceSummary",
    "OverviewStore",
    "VersionDetail",
    "WindowRow",
    "WorkerHealth",
    "WorkerReport",
    "as_float",
    "as_int",
    "health_view",
    "namespace_overview",
    "namespace_summaries",
    "prompt_diff",
    "version_detail",
    "worker_report",
]

DEFAULT_VERSIONS = 20
"""Versions listed on a namespace's page (newest first)."""
DEFAULT_WINDOWS = 10
"""Published versions whose windows are listed as the recent windows."""


class OverviewStore(Protocol):
    """The reads of :class:`streams.redis_store.RedisPromptStore` this module makes."""

    async def namespaces(self) -> list[str]: ...
    async def current(self, namespace: str) -> PublishedPrompt | None: ...
    async def get_version(self, namespace: str, version: int) -> PublishedPrompt | None: ...
    async def history(self, namespace: str, limit: int = 20) -> list[HistoryEntry]: ...
    async def version_record(self, namespace: str, version: int) -> VersionRecord | None: ...
    async def get_status(self, namespace: str) -> dict[str, Any] | None: ...
    async def seen_namespaces(self) -> list[str]: ...
    async def health_reports(self) -> list[dict[str, Any]]: ...
    async def outcomes(self, namespace: str) -> dict[str, OutcomeCounts]: ...
    async def promotion(self, namespace: str, head: int | None) -> dict[str, Any]: ...


@dataclass(frozen=True)
class WorkerHealth:
    """One worker's health report: each dependency that is down, described (since when, the last error, what it
    holds up), and the names of those up. ``stale``: the report is older than :data:`combee.health.STALE_AFTER_S`
    (the worker stopped, or cannot write to Redis)."""

    worker: str
    updated_at: float | None
    age_s: float | None
    stale: bool
    down: tuple[str, ...]
    up: tuple[str, ...]
    unchecked: tuple[str, ...]


@dataclass(frozen=True)
class WorkerReport:
    """What the worker that owns a namespace last reported (the ``status`` key, which expires when no worker
    refreshes it). ``decision`` is the controller's explanation; latencies are close-to-applied seconds over the
    worker's last ``latency_windows`` windows."""

    worker: str | None
    updated_at: float | None
    traces_seen: int | None
    buffered: int | None
    windows_in_flight: int | None
    batch_size: int | None
    profiling: bool
    next_trial: int | None
    decision: str
    latency_p50_s: float | None
    latency_p95_s: float | None
    latency_windows: int


@dataclass(frozen=True)
class NamespaceSummary:
    namespace: str
    version: int | None
    published_at: float | None
    report: WorkerReport | None


@dataclass(frozen=True)
class WindowRow:
    """One applied window: the version it produced, its id and size (None: trace ids not recorded), the
    version that published it (a superseded version's window is published by a newer one) and when."""

    version: int
    window_id: str | None
    size: int | None
    trace_ids: tuple[str, ...] | None
    published_in: int
    published_at: float | None


@dataclass(frozen=True)
class NamespaceOverview:
    namespace: str
    current: int | None
    versions: tuple[HistoryEntry, ...]
    windows: tuple[WindowRow, ...]
    report: WorkerReport | None
    outcomes: Mapping[str, OutcomeCounts] = field(default_factory=dict)
    """Outcomes per version key (:mod:`combee.outcomes`): the success-rate-by-version chart."""
    promotion: Mapping[str, Any] = field(default_factory=dict)
    """The serving state, pending candidate and newest decisions (:func:`streams.redis_promotion.promotion_summary`)."""


@dataclass(frozen=True)
class VersionDetail:
    namespace: str
    version: int
    prompt: str
    window_id: str | None
    published_at: float | None
    playbook: Playbook
    windows: tuple[WindowProvenance, ...]
    previous: int | None
    """The published version before this one (None for the first retained one): the diff page's default."""
    current: int | None


def as_int(value: Any) -> int | None:
    """``value`` when it is an int (a bool is not), else None: a field of the wrong type reads as unknown."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_float(value: Any) -> float | None:
    """``value`` as a float when it is a number (a bool is not), else None."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def worker_report(status: Mapping[str, Any] | None) -> WorkerReport | None:
    """The report in a ``status`` value (as ``workers/status.py`` writes it); None when there is none. A field of
    the wrong type reads as unknown, never as an error."""
    if not status:
        return None
    ctl = status.get("controller")
    ctl = ctl if isinstance(ctl, dict) else {}
    lat = status.get("latency_close_to_applied_s")
    lat = lat if isinstance(lat, dict) else {}
    why = ctl.get("why")
    worker = status.get("worker")
    return WorkerReport(
        worker=worker if isinstance(worker, str) else None,
        updated_at=as_float(status.get("updated_at")),
        traces_seen=as_int(status.get("traces_seen")),
        buffered=as_int(status.get("buffered")),
        windows_in_flight=as_int(status.get("windows_in_flight")),
        batch_size=as_int(ctl.get("batch_size")),
        profiling=ctl.get("profiling") is True,
        next_trial=as_int(ctl.get("next_trial")),
        decision=why if isinstance(why, str) else "not reported",
        latency_p50_s=as_float(lat.get("p50")),
        latency_p95_s=as_float(lat.get("p95")),
        latency_windows=as_int(lat.get("n")) or 0,
    )


async def health_view(store: OverviewStore, now: float) -> tuple[WorkerHealth, ...]:
    """Every worker's health report (newest first), its outages described as of ``now``."""
    out = []
    for report in await store.health_reports():
        deps = report.get("dependencies")
        entries = [d for d in deps.values() if isinstance(d, dict)] if isinstance(deps, dict) else []
        updated = as_float(report.get("updated_at"))
        age = None if updated is None else max(0.0, now - updated)
        worker = report.get("worker")
        out.append(
            WorkerHealth(
                worker=worker if isinstance(worker, str) else "?",
                updated_at=updated,
                age_s=age,
                stale=age is None or age > STALE_AFTER_S,
                down=tuple(describe_dependency(d, now) for d in entries if d.get("state") == "down"),
                up=tuple(str(d.get("name")) for d in entries if d.get("state") == "up"),
                unchecked=tuple(str(d.get("name")) for d in entries if d.get("state") not in ("up", "down")),
            )
        )
    return tuple(out)


async def namespace_summaries(store: OverviewStore) -> list[NamespaceSummary]:
    """Every namespace published or seen by a worker, sorted, with its current version and its worker's report."""
    out = []
    for ns in sorted(set(await store.namespaces()) | set(await store.seen_namespaces())):
        current = await store.current(ns)
        out.append(
            NamespaceSummary(
                namespace=ns,
                version=current.version if current else None,
                published_at=current.published_at if current else None,
                report=worker_report(await store.get_status(ns)),
            )
        )
    return out


def _windows(entries: Sequence[HistoryEntry], records: Mapping[int, VersionRecord]) -> list[WindowRow]:
    rows: list[WindowRow] = []
    for entry in entries:  # newest first
        record = records.get(entry.version)
        listed = record.provenance if record is not None and record.provenance else ()
        if not listed:  # published before provenance was stored, or a republish: only the version's own window
            traces = entry.meta.get("traces")
            size = as_int(traces) if entry.window_id is not None else None
            rows.append(WindowRow(entry.version, entry.window_id, size, None, entry.version, entry.published_at))
            continue
        for p in sorted(listed, key=lambda p: p.version, reverse=True):
            size = len(p.trace_ids) if p.trace_ids is not None else None
            rows.append(WindowRow(p.version, p.window_id, size, p.trace_ids, entry.version, entry.published_at))
    return rows


async def namespace_overview(
    store: OverviewStore, namespace: str, *, versions: int = DEFAULT_VERSIONS, windows: int = DEFAULT_WINDOWS
) -> NamespaceOverview:
    """``namespace``'s newest ``versions`` published versions (newest first), the windows of its newest
    ``windows`` published versions, its worker's report and its outcomes per version. A namespace with nothing
    published has none."""
    entries = await store.history(namespace, limit=max(versions, windows))
    records = {}
    for entry in entries[:windows]:
        record = await store.version_record(namespace, entry.version)
        if record is not None:
            records[entry.version] = record
    current = await store.current(namespace)
    head = current.version if current else None
    return NamespaceOverview(
        namespace=namespace,
        current=head,
        versions=tuple(entries[:versions]),
        windows=tuple(_windows(entries[:windows], records)),
        report=worker_report(await store.get_status(namespace)),
        outcomes=await store.outcomes(namespace),
        promotion=await store.promotion(namespace, head),
    )


async def version_detail(store: OverviewStore, namespace: str, version: int) -> VersionDetail | None:
    """Version ``version``'s prompt, playbook and windows; None when it is not published or no longer retained."""
    published = await store.get_version(namespace, version)
    record = await store.version_record(namespace, version)
    if published is None or record is None:
        return None
    held = [h.version for h in await store.history(namespace, limit=DEFAULT_HISTORY_LIMIT)]
    current = await store.current(namespace)
    return VersionDetail(
        namespace=namespace,
        version=version,
        prompt=published.prompt,
        window_id=published.window_id,
        published_at=published.published_at,
        playbook=record.playbook,
        windows=record.provenance,
        previous=max((v for v in held if v < version), default=None),
        current=current.version if current else None,
    )


async def prompt_diff(
    store: OverviewStore,
    namespace: str,
    from_version: int | None = None,
    to_version: int | None = None,
    *,
    max_versions: int | None = None,
) -> PromptDiff:
    """What ``combee prompt diff NS [--from V] [--to W]`` prints, as data (same defaults, same reads).
    Raises UnknownVersion (nothing published, or a version not retained), ConfigError (``from`` > ``to``) and,
    before reading any playbook, DiffTooWide when the diff would read more than ``max_versions`` versions."""
    published = [h.version for h in await store.history(namespace, limit=DEFAULT_HISTORY_LIMIT)]
    from_v, to_v, wanted = diff_span(published, from_version, to_version)
    if max_versions is not None:
        bound_span(from_v, to_v, wanted, max_versions)
    records = [r for r in [await store.version_record(namespace, v) for v in wanted] if r is not None]
    if from_v == 0:  # before the first version: the empty playbook
        records.append(VersionRecord(0, Playbook(namespace=namespace)))
    return diff_versions(records, from_v, to_v)
