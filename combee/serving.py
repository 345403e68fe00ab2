"""Which version an agent is served: the namespace's serving state and the canary arm. Pure.

The agent-side reader (:mod:`streams.client`) needs this and nothing of the decisions (:mod:`combee.promotion`),
so it stays a module of its own with no import beyond the standard library.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["POLICIES", "Policy", "Serving", "arm_position", "in_canary_arm", "pending_candidate", "served_version"]

Policy = Literal["direct", "manual", "canary", "gate"]
POLICIES: Final[tuple[Policy, ...]] = ("direct", "manual", "canary", "gate")


@dataclass(frozen=True)
class Serving:
    """A namespace's serving state. ``live``: the version served under a non-direct policy (None: nothing is
    live yet, agents get no prompt). ``previous``: the version live before it (a rollback's target).
    ``rejected_through``: candidates up to this version were rejected and are never served. ``serial`` grows
    with every change, so a client can tell a deliberate move to a lower version (a rollback) from a stale read.
    """

    policy: Policy = "direct"
    live: int | None = None
    previous: int | None = None
    fraction: float = 0.0
    rejected_through: int = 0
    serial: int = 0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown promotion policy {self.policy!r}; one of {', '.join(POLICIES)}")
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"the canary fraction must be in [0, 1], got {self.fraction}")


def arm_position(namespace: str, agent_id: str) -> float:
    """A uniform number in [0, 1) fixed by (namespace, agent id): the agent's place for every canary of the
    namespace, so it keeps its arm (and a larger fraction only adds agents to the arm)."""
    digest = hashlib.sha256(f"{namespace}\x00{agent_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def in_canary_arm(namespace: str, agent_id: str | None, fraction: float) -> bool:
    """Whether the agent is in the canary arm at ``fraction``; an agent with no id never is."""
    return agent_id is not None and arm_position(namespace, agent_id) < fraction


def pending_candidate(serving: Serving, head: int | None) -> int | None:
    """The newest candidate waiting for a decision (the head), or None (direct policy, or nothing pending)."""
    if head is None or serving.policy == "direct":
        return None
    if head > (serving.live or 0) and head > serving.rejected_through:
        return head
    return None


def served_version(serving: Serving, head: int | None, *, canary_arm: bool) -> int | None:
    """The version an agent is served: the head under ``direct``; under ``canary`` the pending candidate for an
    agent of the arm; otherwise the live version (None: nothing to serve)."""
    if head is None or serving.policy == "direct":
        return head
    candidate = pending_candidate(serving, head)
    if canary_arm and serving.policy == "canary" and candidate is not None:
        return candidate
    return serving.live if serving.live is None else min(serving.live, head)
