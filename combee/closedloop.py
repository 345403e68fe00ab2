"""The closed loop's bookkeeping (``combee demo --closed-loop``, issue 24 item 4): what the agents' own records say
about each version, and whether a policy answered an injected bad version as it should. Pure.

An agent records every task it answered (:class:`AgentRecord`): when, which agent, the version it was served and
whether the answer was right. From those records alone, never from the workers' counts:

* :func:`per_version` and :func:`timeline`: the success rate per version, overall and over time (consecutive
  blocks of tasks);
* :func:`served_share`: the share of tasks in a stretch of time that ran one of a set of versions (a canary's arm
  is served the candidates: that share should be the canary fraction);
* :func:`assess`: given the decisions recorded in Redis after the bad version was injected, the decision that
  answered it, how many traces the fleet published until then (and how many ran a bad version), and the checks
  the issue asks for: ``gate`` rejects it and no agent ever ran it; ``canary`` drops it and the arm's served share
  is within 2 points of the fraction; ``direct`` serves it and a rollback on outcomes undoes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from combee.outcomes import OutcomeCounts, as_json
from combee.serving import Policy

__all__ = [
    "EXPECTED",
    "SHARE_TOLERANCE",
    "AgentRecord",
    "Assessment",
    "TimelineRow",
    "answering_decision",
    "assess",
    "counts_json",
    "per_version",
    "seq_at",
    "served_share",
    "text_chart",
    "timeline",
    "version_table",
]

SHARE_TOLERANCE: Final = 0.02
"""A canary's served share must be within this of its fraction (issue 24's acceptance: 2 points)."""

EXPECTED: Final[Mapping[str, tuple[str, str]]] = {
    "gate": ("reject", "gate"),
    "canary": ("reject", "canary"),
    "direct": ("rollback", "outcomes"),
}
"""Per policy, the decision (action, decided by) that must answer an injected bad version."""


@dataclass(frozen=True)
class AgentRecord:
    """One task an agent answered: wall-clock time ``at``, the fleet's task number ``seq``, the ``phase`` of the
    run, the agent's id, the version it was served (0: nothing was served, it ran with an empty playbook) and
    whether its answer was right."""

    at: float
    seq: int
    phase: str
    agent: str
    version: int
    success: bool

    def as_json(self) -> dict[str, Any]:
        return {"at": self.at, "seq": self.seq, "phase": self.phase, "agent": self.agent, "version": self.version,
                "success": self.success}  # fmt: skip


def per_version(records: Iterable[AgentRecord]) -> dict[int, OutcomeCounts]:
    """Successes and failures per version the agents ran with, versions ascending."""
    out: dict[int, OutcomeCounts] = {}
    for r in records:
        before = out.get(r.version, OutcomeCounts())
        out[r.version] = OutcomeCounts(success=before.success + r.success, failure=before.failure + (not r.success))
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class TimelineRow:
    """One version's tasks within one block of ``size`` consecutive tasks starting at task ``start``."""

    start: int
    size: int
    version: int
    n: int
    success: int

    @property
    def rate(self) -> float:
        return self.success / self.n


def timeline(records: Iterable[AgentRecord], block: int) -> list[TimelineRow]:
    """The success rate per version over time: the records in task order cut into blocks of ``block`` tasks,
    one row per (block, version) present. Raises ValueError for a block below 1."""
    if block < 1:
        raise ValueError(f"a block holds at least one task, got {block}")
    rows: dict[tuple[int, int], list[AgentRecord]] = {}
    for r in sorted(records, key=lambda r: r.seq):
        rows.setdefault((r.seq // block * block, r.version), []).append(r)
    return [
        TimelineRow(start, block, version, len(rs), sum(r.success for r in rs))
        for (start, version), rs in sorted(rows.items())
    ]


def seq_at(records: Iterable[AgentRecord], at: float) -> int | None:
    """The number of the first task answered at or after ``at`` (None: none was)."""
    return min((r.seq for r in records if r.at >= at), default=None)


def served_share(records: Iterable[AgentRecord], versions: Iterable[int]) -> float | None:
    """The share of ``records`` that ran one of ``versions`` (None: no record)."""
    wanted = set(versions)
    rs = list(records)
    return sum(r.version in wanted for r in rs) / len(rs) if rs else None


def answering_decision(
    decisions: Sequence[Mapping[str, Any]], policy: str, *, after: float
) -> Mapping[str, Any] | None:
    """The first decision recorded at or after ``after`` (the injection) with the action and decider ``policy``
    expects (:data:`EXPECTED`), or None. Decisions are taken in the order of their ``at``."""
    action, by = EXPECTED[policy]
    for d in sorted(decisions, key=lambda d: float(d.get("at") or 0.0)):
        if float(d.get("at") or 0.0) >= after and d.get("action") == action and d.get("decided_by") == by:
            return d
    return None


@dataclass(frozen=True)
class Assessment:
    """A policy's answer to the injected bad version, measured from the agents' records and the decisions."""

    policy: Policy
    live_before: int
    bad_version: int
    bad_versions: tuple[int, int]  # the versions counted as bad: from the injected one to the last built on it
    decision: Mapping[str, Any] | None
    traces_to_decide: int | None  # traces the fleet published from the injection until the decision
    bad_traces_to_decide: int | None  # of those, the ones that ran a bad version
    served_bad_total: int  # tasks run with a bad version from the injection to the end of the run
    served_share: float | None  # share of tasks run with a bad version until the decision
    fraction: float | None
    checks: Mapping[str, bool] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(self.checks.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "live_before": self.live_before, "bad_version": self.bad_version,
            "bad_versions": list(self.bad_versions), "decision": dict(self.decision) if self.decision else None,
            "traces_to_decide": self.traces_to_decide, "bad_traces_to_decide": self.bad_traces_to_decide,
            "served_bad_total": self.served_bad_total, "served_share": self.served_share, "fraction": self.fraction,
            "checks": dict(self.checks), "passed": self.passed,
        }  # fmt: skip


def assess(
    policy: Policy,
    records: Sequence[AgentRecord],
    decisions: Sequence[Mapping[str, Any]],
    *,
    injected_at: float,
    live_before: int,
    bad_version: int,
    last_bad: int,
    fraction: float | None = None,
) -> Assessment:
    """How ``policy`` answered the bad version ``bad_version`` (published at ``injected_at`` over the live
    ``live_before``); versions ``bad_version``..``last_bad`` are the bad one and those built on it before the
    decision. The checks:

    * every policy: the expected decision (:data:`EXPECTED`) was recorded after the injection;
    * ``gate``: no task ran a bad version, ever;
    * ``canary``: the share of tasks that ran a bad version until the decision is within
      :data:`SHARE_TOLERANCE` of ``fraction``;
    * ``direct``: agents ran the bad version (it was served);
    * every policy: no task of the ``after`` phase (once the decision is applied) ran a bad version.
    """
    bad = range(bad_version, last_bad + 1)
    after = [r for r in records if r.at >= injected_at]
    decision = answering_decision(decisions, policy, after=injected_at)
    decided_at = float(decision["at"]) if decision is not None else None
    until = [r for r in after if decided_at is None or r.at < decided_at]
    bad_until = sum(r.version in bad for r in until)
    share = served_share(until, bad)
    checks: dict[str, bool] = {"decided": decision is not None}
    served_bad = sum(r.version in bad for r in after)
    if policy == "gate":
        checks["never_served"] = served_bad == 0
    elif policy == "canary":
        checks["share_within_2_points"] = (
            share is not None and fraction is not None and abs(share - fraction) <= SHARE_TOLERANCE
        )
    elif policy == "direct":
        checks["served"] = bad_until > 0
    checks["none_after"] = not any(r.version in bad for r in after if r.phase == "after")
    return Assessment(
        policy, live_before, bad_version, (bad_version, last_bad), decision,
        len(until) if decision is not None else None, bad_until if decision is not None else None,
        served_bad, share, fraction, checks,
    )  # fmt: skip


def version_table(records: Iterable[AgentRecord]) -> str:
    """A text table: per version, tasks, successes, the success rate and its 95 % Wilson interval."""
    lines = ["version      n  success  rate   95% interval"]
    for version, c in per_version(records).items():
        lo, hi = c.interval() or (0.0, 0.0)
        lines.append(f"v{version:<6} {c.n:6d} {c.success:8d}  {c.success_rate or 0:5.1%}  [{lo:.1%}, {hi:.1%}]")
    return "\n".join(lines)


def text_chart(rows: Sequence[TimelineRow], width: int = 40) -> str:
    """The timeline as text bars: one line per (block, version), the bar's length the success rate."""
    lines = []
    for row in rows:
        bar = "#" * round(row.rate * width)
        lines.append(f"tasks {row.start:5d}+ v{row.version:<4} {bar:<{width}} {row.rate:5.1%} (n={row.n})")
    return "\n".join(lines)


def counts_json(records: Iterable[AgentRecord]) -> dict[str, dict[str, object]]:
    """:func:`per_version` as JSON: version -> the counts with their derived figures."""
    return {str(v): as_json(c) for v, c in per_version(records).items()}
