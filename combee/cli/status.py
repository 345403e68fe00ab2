"""``combee status``: the workers' dependencies (up or down, since when, what an outage holds up), then per
namespace: version, traces seen, lag, windows in flight, the controller's choice and why."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from combee.cli.base import EXIT_UNKNOWN_NAMESPACE, CliError, add_connection_options, service_errors, stream_settings
from combee.health import STALE_AFTER_S, describe_dependency, describe_duration
from combee.models import validate_namespace

__all__ = ["add_status_command", "cmd_status", "format_status"]


def add_status_command(sub: Any) -> None:
    """Register ``status`` on ``combee``'s subparsers."""
    p = sub.add_parser(
        "status", help="the workers' dependencies, then per namespace: version, traces seen, lag, controller"
    )
    p.add_argument("namespace", nargs="?")
    p.add_argument("--json", action="store_true")
    add_connection_options(p)
    p.set_defaults(func=service_errors(cmd_status))


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


SHOWN_VERSIONS = 3
"""Versions whose outcomes ``combee status`` prints per namespace (``combee prompt history`` lists them all)."""


def _outcome_lines(outcomes: dict[str, Any]) -> list[str]:
    """The newest versions' outcomes and those of unknown versions (``outcomes`` as :func:`collect_status` has it:
    version key -> :func:`combee.outcomes.as_json`, newest first)."""
    from combee.outcomes import UNKNOWN_VERSION, OutcomeCounts, describe

    def line(key: str) -> str:
        o = outcomes[key]
        counts = OutcomeCounts(o["success"], o["failure"], o["unknown"], o["score_sum"], o["score_count"])
        name = "unknown version" if key == UNKNOWN_VERSION else f"v{key}"
        return f"  outcomes {name}: {describe(counts)}"

    numbered = [k for k in outcomes if k.isdigit()]
    if not numbered and UNKNOWN_VERSION not in outcomes:
        return ["  outcomes: none reported (no trace named the version it ran with)"]
    rest = len(numbered) - SHOWN_VERSIONS
    tail = [f"  outcomes of {rest} older versions: `combee prompt history`"] if rest > 0 else []
    unknown = [line(UNKNOWN_VERSION)] if UNKNOWN_VERSION in outcomes else []
    return [line(k) for k in numbered[:SHOWN_VERSIONS]] + tail + unknown


def format_status(status: dict[str, Any], now: float) -> str:
    """``combee status``'s text: a block per worker (its dependencies), then two lines per namespace."""
    lines = []
    if status.get("kafka_error"):
        lines.append(f"kafka: {status['kafka_error']} (lag unknown)")
    workers = status.get("workers") or []
    if not workers:
        lines.append("workers: no health report (no worker running, or none has reached Redis)")
    for report in workers:
        age = report.get("age_s")
        stale = isinstance(age, int | float) and age > STALE_AFTER_S
        when = f"reported {describe_duration(age)} ago" if isinstance(age, int | float) else "report time unknown"
        lines.append(f"worker {report.get('worker', '?')} ({when}{'; STALE: is it still running?' if stale else ''}):")
        deps = report.get("dependencies") or {}
        for entry in deps.values() if isinstance(deps, dict) else ():
            lines.append(f"  {describe_dependency(entry, now)}")
    rows = status.get("namespaces") or []
    if not rows:
        lines.append("no namespaces yet (no worker has received a trace, nothing is published)")
    for row in rows:
        st = row.get("worker_status") or {}
        ctl = st.get("controller") or {}
        version = row.get("version")
        shown = f"version {version}" if version is not None else "no version published yet"
        lag = row.get("lag")
        lines.append(
            f"{row['namespace']}: {shown}, traces seen {_dash(st.get('traces_seen'))}, "
            f"lag {'unknown' if lag is None else lag}, windows in flight {_dash(st.get('windows_in_flight'))}, "
            f"buffered {_dash(st.get('buffered'))}"
        )
        lines.append(f"  controller: {ctl.get('why', 'no report from a worker (is one running?)')}")
        lines.extend(_outcome_lines(row.get("outcomes") or {}))
        lines.extend(promotion_lines(row.get("promotion") or {}, version))
    return "\n".join(lines) + "\n"


def promotion_lines(promotion: dict[str, Any], head: int | None) -> list[str]:
    """The policy, what is live and pending, and the newest decision (``combee prompt history``: all of them)."""
    from combee.promotion_text import describe_decision, serving_summary
    from combee.serving import Serving

    if not promotion:
        return []
    fields = {f: promotion[f] for f in ("policy", "live", "previous", "fraction", "rejected_through", "serial")}
    lines = [f"  promotion: {serving_summary(Serving(**fields), head)}"]
    decisions = promotion.get("decisions") or []
    if decisions:
        lines.append(f"  last decision: {describe_decision(decisions[-1])}")
    return lines


def cmd_status(args: argparse.Namespace) -> int:
    from streams.status import collect_status

    if args.namespace is not None:
        validate_namespace(args.namespace)
    settings = stream_settings(args)
    status = asyncio.run(collect_status(settings, args.namespace))
    if args.namespace is not None and status["namespaces"][0]["state"] == "unknown":
        raise CliError(
            f"unknown namespace {args.namespace!r}: no worker has received a trace of it and nothing is published "
            "(`combee status` lists the namespaces there are)",
            EXIT_UNKNOWN_NAMESPACE,
        )
    if args.json:
        print(json.dumps(status, indent=2, default=str))
    else:
        print(format_status(status, time.time()), end="")
    return 0
