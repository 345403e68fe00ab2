"""The promotion bookkeeping a fault must not break, read from what a run left (issue 24, the fault suite's item).

Pure functions over the namespace's decision records (Redis ``<prefix>:{NS}:decisions``), its serving state, the
decision lines the workers logged when a decision script applied one (workers/promotion.py ``_record``), the
outcome counts in Redis and the traces the scenario's agents published. Each returns violations (empty: it holds):

* :func:`decision_violations` — every recorded decision was applied exactly once (the serving state's ``serial``
  grows once per applied script, and each decision has exactly one "applied" line in the workers' logs), each
  version has exactly one decision (:func:`decisions_on`), no version is promoted twice and what is live only moves
  forward, no promoted or live version was rejected and none was served after its rejection, and nothing is left
  pending at the end (every candidate decided);
* :func:`outcome_violations` — the outcome counts per version equal what the published traces say, to the trace.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from combee.outcomes import OutcomeCounts
from combee.serving import Serving, pending_candidate

__all__ = [
    "APPLIED",
    "RECORDED_WITHIN_S",
    "applied_decisions",
    "decision_violations",
    "decisions_on",
    "expected_outcomes",
    "outcome_violations",
]

#: A decision's ``at`` is the time its check began, a moment before the decision script ran (the gate's: before its
#: evaluation too). A read that began this long after ``at`` began after the decision was recorded.
RECORDED_WITHIN_S = 2.0
#: The line workers/promotion.py logs when the decision script applied a decision (not when it refused one).
APPLIED = re.compile(
    r"(?P<ns>\S+): (?P<action>promote|reject|rollback) v(?P<version>\d+) by (?P<by>\S+) under (?P<policy>\w+) "
    r"\(serving v(?P<serve>\w+)\)"
)


def applied_decisions(logs: Iterable[str], namespace: str) -> Counter[str]:
    """How many times each decision id of ``namespace`` was applied, from the workers' log texts."""
    out: Counter[str] = Counter()
    for text in logs:
        for m in APPLIED.finditer(text):
            if m["ns"] != namespace:
                continue
            target = f"-to-v{m['serve']}" if m["action"] == "rollback" else ""
            out[f"{m['action']}/v{m['version']}{target}"] += 1
    return out


def _reject_range(d: Mapping[str, Any]) -> range:
    """The versions a rejection certainly rejected: from its first version to the candidate its evidence names."""
    first = int(d["version"])
    return range(first, max(first, int((d.get("evidence") or {}).get("candidate_version") or first)) + 1)


def _rejected(decisions: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """Versions certainly rejected, each with the time of its rejection."""
    out: dict[int, float] = {}
    for d in decisions:
        if d.get("action") == "reject":
            for version in _reject_range(d):
                out.setdefault(version, float(d.get("at") or 0.0))
    return out


def decisions_on(decisions: Sequence[Mapping[str, Any]], version: int, by: str) -> list[Mapping[str, Any]]:
    """The decisions of ``by`` (``gate``, ``canary``) that decided ``version``. A decision's evidence names the
    live version it compared with and the candidate it looked at; it decided the chain between them, except the
    versions a rejection had taken out of it before (a promotion serves the chain above the rejected ones)."""
    rejected = _rejected(decisions)
    out = []
    for d in decisions:
        evidence = d.get("evidence") or {}
        if d.get("decided_by") != by or "candidate_version" not in evidence:
            continue
        if d.get("action") == "reject":
            decided = version in _reject_range(d)
        else:  # a promotion serves the chain above the live version, except the versions rejected before
            chain = int(evidence["baseline_version"]) < version <= int(evidence["candidate_version"])
            decided = chain and version not in rejected
        if decided:
            out.append(d)
    return out


def decision_violations(
    decisions: Sequence[Mapping[str, Any]],
    state: Serving,
    head: int,
    applied: Mapping[str, int],
    *,
    served: Iterable[tuple[float, int]] = (),
    served_only_live: bool = False,
    settled: bool = True,
    by: str | None = None,
) -> list[str]:
    """Violations of the decision bookkeeping (see the module docstring). ``decisions``: the records, oldest
    first (:func:`streams.redis_promotion.parse_decisions`); ``state`` and ``head``: the serving state and the
    newest version at the end; ``applied``: :func:`applied_decisions`; ``served``: (wall time an agent asked,
    version it was served) for every read (a canary's arm is served candidates that are rejected later, but never
    after); ``served_only_live``: the policy serves agents nothing but promoted versions (the gate); ``settled``:
    every candidate must be decided (nothing pending at the end); ``by`` (``gate``, ``canary``): every version
    after the first one served, up to the head (``settled``) or the newest version promoted or rejected, must have
    exactly one decision of ``by`` (:func:`decisions_on`)."""
    v: list[str] = []
    ids = [str(d.get("id")) for d in decisions]
    if state.serial != len(decisions):
        v.append(
            f"the serving state changed {state.serial} times for {len(decisions)} recorded decisions: "
            "a decision was applied more than once, or applied without its record"
        )
    for did in ids:
        if did.startswith("policy/"):
            continue
        if applied.get(did, 0) != 1:
            v.append(f"decision {did} was applied {applied.get(did, 0)} times by the workers (once expected)")
    for did in sorted(set(applied) - set(ids)):
        v.append(f"a worker applied decision {did}, which Redis does not record")
    promotes = [d for d in decisions if d.get("action") == "promote"]
    promoted = [int(d["serve"]) for d in promotes]
    for version, n in Counter(promoted).items():
        if n > 1:
            v.append(f"v{version} was promoted {n} times")
    for before, after in itertools.pairwise(promoted):
        if after <= before:
            v.append(f"the live version went from v{before} back to v{after}")
    if any(d.get("action") == "rollback" for d in decisions):
        v.append("a rollback was recorded: the scenario runs without rollback on outcomes")
    rejected = _rejected(decisions)
    both = sorted(set(rejected) & set(promoted))
    if both:
        v.append(f"versions {both} were both promoted and rejected")
    if state.live is None or state.live in rejected:
        v.append(f"the live version at the end is v{state.live}, a rejected version or none")
    reads = list(served)
    late = sorted(
        {version for at, version in reads if version in rejected and at > rejected[version] + RECORDED_WITHIN_S}
    )
    if late:
        v.append(f"agents were served versions after their rejection: {late}")
    seen = {version for _, version in reads}
    if served_only_live and not seen <= set(promoted):
        v.append(f"agents were served versions never promoted: {sorted(seen - set(promoted))}")
    if by is not None and promoted:
        last = head if settled else max(state.live or 0, state.rejected_through)
        for version in range(promoted[0] + 1, last + 1):
            on = [str(d.get("id")) for d in decisions_on(decisions, version, by)]
            if len(on) != 1:
                v.append(f"v{version} has {len(on)} decisions of the {by}: {on} (exactly one expected)")
    waiting = pending_candidate(state, head)
    if settled and (waiting is not None or state.live != head):
        v.append(f"not every candidate was decided: head v{head}, live v{state.live}, pending {waiting}")
    return v


def expected_outcomes(traces: Iterable[Mapping[str, Any]]) -> dict[str, OutcomeCounts]:
    """The outcome counts the published traces call for: per version they name, successes, failures, unknown."""
    tally: dict[str, Counter[str]] = {}
    for t in traces:
        version = t.get("playbook_version")
        if version is None:
            continue
        success = (t.get("feedback") or {}).get("success")
        outcome = "unknown" if success is None else ("success" if success else "failure")
        tally.setdefault(str(version), Counter())[outcome] += 1
    return {
        k: OutcomeCounts(success=c["success"], failure=c["failure"], unknown=c["unknown"]) for k, c in tally.items()
    }


def outcome_violations(expected: Mapping[str, OutcomeCounts], counted: Mapping[str, OutcomeCounts]) -> list[str]:
    """Per version, the counted successes, failures and unknowns must be exactly the expected ones."""
    v: list[str] = []
    for key in sorted(set(expected) | set(counted), key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k)):
        want, got = expected.get(key, OutcomeCounts()), counted.get(key, OutcomeCounts())
        w, g = (want.success, want.failure, want.unknown), (got.success, got.failure, got.unknown)
        if w != g:
            v.append(f"outcomes of v{key}: counted (success, failure, unknown) = {g}, the traces say {w}")
    return v
