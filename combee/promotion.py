"""Candidates and the decisions that move what agents are served: candidates, promotion, rejection, rollback. Pure.

Every version the combiner makes is published (``current``, the *head*) as before. What agents are *served*
is the namespace's :class:`Serving` state, kept in Redis beside the versions (``streams/redis_promotion.py``):

* policy ``direct`` (the default, and the meaning of "no state at all"): agents are served the head, as before
  the promotion work existed.
* any other policy: agents are served the ``live`` version; every version above it (and above
  ``rejected_through``) is a *candidate*. Under ``canary`` an agent in the canary arm (:func:`in_canary_arm`) is
  served the head instead. Under ``manual`` candidates wait for an operator; under ``gate`` a validation set
  decides (:mod:`combee.gate`), with the generator's graded answers for evidence instead of the fleet's outcomes.

Windows that arrive while candidates are pending build on the head (the newest candidate), so candidates form a
chain from ``live`` up to the head. A *promotion* serves a candidate (usually the head: everything below it is
promoted with it). A *rejection* rejects every pending candidate (``rejected_through`` := head) and the combiner
returns the head to the live version's playbook, as a rollback does, so the next window builds on what agents
run. A *rollback* serves the live version's predecessor again (and rejects the candidates built on the bad one).

Every decision is a :class:`Decision`: what, which version, who or what decided, under which policy, why, and
the evidence (a comparison of outcomes, :mod:`combee.compare`; the gate's paired scores, :mod:`combee.gate`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Final, Literal

from combee.compare import Comparison, compare_rates
from combee.outcomes import OutcomeCounts, as_json
from combee.serving import Policy, Serving, pending_candidate
from combee.validation import ValidationTask

__all__ = [
    "ACTIONS",
    "Action",
    "Decision",
    "GateRule",
    "PromotionConfig",
    "Rule",
    "candidate_counts",
    "decide_canary",
    "decide_rollback",
    "plan_operator",
]

Action = Literal["promote", "reject", "rollback", "policy"]
ACTIONS: Final[tuple[Action, ...]] = ("promote", "reject", "rollback", "policy")


@dataclass(frozen=True)
class Rule:
    """The sequential non-inferiority rule of a canary and of a rollback (:func:`combee.compare.compare_rates`):
    each side needs ``min_decided`` traces with a known outcome, and is judged at level ``alpha`` with
    ``margin``."""

    margin: float = 0.05
    min_decided: int = 200
    alpha: float = 0.05


@dataclass(frozen=True)
class GateRule:
    """The validation gate's paired non-inferiority rule (:func:`combee.compare.compare_paired`): at least
    ``min_pairs`` validation tasks, judged at level ``alpha`` with ``margin``; ``concurrency`` generator (and
    judge) requests in flight during an evaluation."""

    margin: float = 0.05
    min_pairs: int = 30
    alpha: float = 0.05
    concurrency: int = 4


@dataclass(frozen=True)
class PromotionConfig:
    """A worker's promotion settings: the policy of a namespace that has none in Redis, the canary fraction it
    starts with, the test, whether live versions are rolled back on outcomes, and how often outcomes are read."""

    default_policy: Policy = "direct"
    canary_fraction: float = 0.1
    rule: Rule = field(default_factory=Rule)
    rollback_on_outcomes: bool = True
    check_s: float = 5.0
    gate: GateRule = field(default_factory=GateRule)
    # the default validation set of the gate (a namespace may keep its own in Redis), and where it was read from
    gate_tasks: tuple[ValidationTask, ...] = ()
    gate_source: str = ""
    gate_grader: str = "exact"  # the grader of a namespace's own validation lines that name none
    gate_holdout: float = 0.0  # the share of traces with ground truth held out as validation tasks (0: none)
    gate_holdout_max: int = 1000  # held-out tasks kept per namespace


@dataclass(frozen=True)
class Decision:
    """One decision on a namespace's versions. ``version``: the version acted on (promoted, first rejected, rolled
    back from); ``serve``: the version served afterwards (None: unchanged, or the head under ``direct``).
    ``decided_by``: ``operator:<name>``, ``canary``, ``outcomes`` (a rollback on outcomes), ``gate``.
    ``evidence``: what the decider saw (for a comparison: the verdict, bounds and both sides' counts)."""

    action: Action
    version: int
    decided_by: str
    policy: Policy
    reason: str
    serve: int | None = None
    evidence: Mapping[str, object] = field(default_factory=dict)
    at: float = 0.0

    @property
    def id(self) -> str:
        """The decision's identity: the same decision taken twice (a redelivered request, a restarted worker)
        has the same id, and is recorded and acted on once. A rollback names its target too."""
        if self.action == "policy":  # every change of policy is a record of its own
            return f"policy/{self.at:.6f}"
        target = f"-to-v{self.serve}" if self.action == "rollback" else ""
        return f"{self.action}/v{self.version}{target}"

    def as_json(self) -> dict[str, object]:
        return {**asdict(self), "evidence": dict(self.evidence), "id": self.id}


def candidate_counts(serving: Serving, head: int, counts: Mapping[str, OutcomeCounts]) -> OutcomeCounts:
    """The canary arm's evidence: the outcomes of every pending candidate (the chain from the live version to the
    head, above ``rejected_through``). The arm is served the head of the moment, and the head moves with every
    window, so the arm's outcomes are pooled over the chain it was served."""
    low = max(serving.live or 0, serving.rejected_through)
    total = OutcomeCounts()
    for version in range(low + 1, head + 1):
        total = total + counts.get(str(version), OutcomeCounts())
    return total


def _evidence(cmp: Comparison, candidate: OutcomeCounts, baseline: OutcomeCounts, **names: int) -> dict[str, object]:
    return {"comparison": asdict(cmp), "candidate": as_json(candidate), "baseline": as_json(baseline), **names}


def decide_canary(
    serving: Serving, head: int, counts: Mapping[str, OutcomeCounts], rule: Rule, *, at: float
) -> Decision | None:
    """The canary's decision on the pending candidate, or None (no canary, nothing pending, or undecided).

    Promote the head when the arm's outcomes are not worse than the live version's by more than the margin;
    reject the candidates when they are worse by more than the margin. With nothing live there is no baseline
    to protect: the head is promoted at once (the first version of a namespace)."""
    candidate = pending_candidate(serving, head)
    if serving.policy != "canary" or candidate is None:
        return None
    if serving.live is None:
        return Decision(
            "promote", candidate, "canary", "canary", "nothing is live: no baseline", serve=candidate, at=at
        )
    arm = candidate_counts(serving, head, counts)
    baseline = counts.get(str(serving.live), OutcomeCounts())
    cmp = compare_rates(arm, baseline, margin=rule.margin, min_decided=rule.min_decided, alpha=rule.alpha)
    evidence = _evidence(cmp, arm, baseline, candidate_version=candidate, baseline_version=serving.live)
    if cmp.verdict == "not_worse":
        return Decision("promote", candidate, "canary", "canary", cmp.reason, candidate, evidence, at)
    if cmp.verdict == "worse":
        first = max(serving.live, serving.rejected_through) + 1
        return Decision("reject", first, "canary", "canary", cmp.reason, serving.live, evidence, at)
    return None


def decide_rollback(
    policy: Policy,
    live: int,
    predecessor: int | None,
    counts: Mapping[str, OutcomeCounts],
    rule: Rule,
    *,
    at: float,
) -> Decision | None:
    """Roll back from ``live`` to ``predecessor`` when the live version's outcomes are worse than its
    predecessor's by more than the margin (the same test as the canary's), under any policy; None otherwise.
    The caller names the predecessor: the version served before ``live`` (None: there is none, or ``live``
    itself came from a rollback, which the rule never undoes: only an operator does)."""
    if predecessor is None or predecessor >= live:
        return None
    current = counts.get(str(live), OutcomeCounts())
    before = counts.get(str(predecessor), OutcomeCounts())
    cmp = compare_rates(current, before, margin=rule.margin, min_decided=rule.min_decided, alpha=rule.alpha)
    if cmp.verdict != "worse":
        return None
    evidence = _evidence(cmp, current, before, candidate_version=live, baseline_version=predecessor)
    return Decision("rollback", live, "outcomes", policy, cmp.reason, predecessor, evidence, at)


def plan_operator(
    action: Action,
    version: int,
    serving: Serving,
    head: int,
    counts: Mapping[str, OutcomeCounts],
    *,
    actor: str | None,
    at: float,
) -> Decision | str:
    """An operator's ``promote`` or ``reject`` of ``version`` as a decision, or why it is refused (a string).

    Only a pending candidate (above the live version and above ``rejected_through``, at most the head) can be
    promoted or rejected, and only under a policy other than ``direct``. Promoting serves it (and the candidates
    below it); rejecting rejects every pending candidate, whichever was named (the head returns to the live
    playbook). The evidence
    is the outcomes of both sides at the time of the decision."""
    if action not in ("promote", "reject"):
        return f"an operator cannot {action} through this request"
    if serving.policy == "direct":
        return "the namespace's policy is direct: every version is served, nothing is a candidate"
    low = max(serving.live or 0, serving.rejected_through)
    if not low < version <= head:
        return (
            f"v{version} is not a pending candidate (candidates: v{low + 1}..v{head})"
            if low < head
            else (f"v{version} is not a pending candidate (there is none; live v{serving.live})")
        )
    arm = candidate_counts(serving, version, counts)
    baseline = counts.get(str(serving.live), OutcomeCounts()) if serving.live is not None else OutcomeCounts()
    evidence = {"candidate": as_json(arm), "baseline": as_json(baseline), "candidate_version": version}
    if serving.live is not None:
        evidence["baseline_version"] = serving.live
    who = f"operator:{actor or 'unknown'}"
    if action == "promote":
        return Decision("promote", version, who, serving.policy, "promoted by an operator", version, evidence, at)
    return Decision("reject", version, who, serving.policy, f"v{version} rejected by an operator", serving.live,
                    evidence, at)  # fmt: skip
