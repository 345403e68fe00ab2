"""What a namespace's promotion state and decisions say, as text (pure): shared by `combee prompt policy`,
`combee status` and the web page (docs/promotion.md)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from combee.serving import Serving, pending_candidate

__all__ = ["decision_why", "describe_decision", "serving_summary"]


def serving_summary(serving: Serving, head: int | None) -> str:
    """One line: the policy, what is live, the pending candidate."""
    if serving.policy == "direct":
        return f"policy direct: every new version is served (head v{head or 0})"
    fraction = f" (fraction {serving.fraction:g})" if serving.policy == "canary" else ""
    live = f"v{serving.live}" if serving.live is not None else "none"
    candidate = pending_candidate(serving, head)
    pending = f"candidate v{candidate} pending" if candidate is not None else "no candidate pending"
    rejected = f", rejected through v{serving.rejected_through}" if serving.rejected_through else ""
    return f"policy {serving.policy}{fraction}: live {live}, {pending}{rejected}"


def decision_why(d: Mapping[str, Any]) -> str:
    """Why a recorded decision was taken: the comparison's verdict when there is one, the reason, and both sides'
    counts when the evidence has them."""
    evidence = d.get("evidence") or {}
    cmp = evidence.get("comparison") if isinstance(evidence, dict) else None
    sides = ""
    if isinstance(evidence, dict) and isinstance(evidence.get("candidate"), dict):
        c, b = evidence["candidate"], evidence.get("baseline") or {}
        cand, base = f"n={c.get('n')} success={c.get('success')}", f"n={b.get('n')} success={b.get('success')}"
        sides = f" [candidate {cand}; baseline {base}]"
    verdict = f"{cmp.get('verdict')}: " if isinstance(cmp, dict) else ""
    return f"{verdict}{d.get('reason')}{sides}"


def describe_decision(d: Mapping[str, Any]) -> str:
    """One line per recorded decision: when, what, by whom, what is served after it, and why."""
    when = datetime.fromtimestamp(float(d.get("at") or 0)).isoformat(timespec="seconds")
    serve = d.get("serve")
    served = f", serving v{serve}" if serve is not None else ""
    line = f"{when}  {d.get('action')} v{d.get('version')} by {d.get('decided_by')} under {d.get('policy')}{served}"
    return f"{line}: {decision_why(d)}"
