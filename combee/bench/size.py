"""What a benchmarked playbook costs, beside what it keeps: size figures and retention at equal prompt size (pure).

Plain insight retention (:func:`combee.sim.world.retention`) asks only whether a hidden insight's key appears
anywhere in the rendered prompt, so restating a lesson five times, or keeping 200 bullets, costs nothing. A real
agent pays for every token of its prompt on every call, and a real prompt has a size limit. So every simulated
quality figure comes with the playbook's size (:func:`size_figures`), and the headline figure is *retention at
equal prompt size* (:func:`retention_at`): the playbook cut to a token budget by the project's own rule
(:func:`combee.quality.within_budget`, the eviction :func:`combee.playbook.apply_delta` applies), then scored.
Where redundant bullets take room, other lessons are evicted, as they would be in a prompt of that size.

Two budgets are compared (:func:`score`): sequential's own playbook tokens on the same trace set, and a fixed
:data:`FIXED_BUDGET` tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from combee.models import Playbook
from combee.playbook import playbook_tokens, render_prompt
from combee.quality import Bloat, within_budget
from combee.sim.world import insight_keys_in, retention

__all__ = ["FIXED_BUDGET", "retention_at", "score", "size_figures"]

FIXED_BUDGET = 2_000
"""The fixed prompt budget (tokens) every playbook is also scored under."""


def size_figures(playbook: Playbook, insights: Iterable[str]) -> Bloat:
    """Entries, distinct lessons and prompt tokens of ``playbook``.

    In the simulated world a lesson is a hidden insight, so ``distinct_lessons`` is the number of distinct
    ground-truth keys (``insights``) the bullets name; a generic tip names none and counts as a bullet but not as a
    lesson (it teaches nothing the generator uses). ``bullets_per_lesson`` is then entries per lesson kept.
    """
    wanted = set(insights)
    keys = {k for b in playbook.bullets for k in insight_keys_in(b.content)} & wanted
    return Bloat(len(playbook.bullets), len(keys), playbook_tokens(playbook))


def retention_at(playbook: Playbook, insights: Iterable[str], budget: int) -> float:
    """Share of ``insights`` present in ``playbook`` rendered under a ``budget``-token prompt (the project's
    eviction rule decides which bullets stay)."""
    return retention(render_prompt(within_budget(playbook, budget)), insights)


def score(playbook: Playbook, insights: Iterable[str], sequential_tokens: int | None) -> dict[str, Any]:
    """Every quality and size figure of one run: plain retention, retention at ``sequential_tokens`` (None when
    sequential did not run on these traces) and at :data:`FIXED_BUDGET`, and the size figures."""
    wanted = sorted(set(insights))
    at_seq = None if sequential_tokens is None else retention_at(playbook, wanted, sequential_tokens)
    size = size_figures(playbook, wanted)
    return {
        "insight_retention": retention(render_prompt(playbook), wanted),
        "retention_at_seq_size": at_seq,
        "retention_at_2000": retention_at(playbook, wanted, FIXED_BUDGET),
        "seq_size_budget": sequential_tokens,
        "playbook_entries": size.entries,
        "distinct_lessons": size.distinct_lessons,
        "bullets_per_lesson": size.bullets_per_lesson,
        "playbook_tokens": size.prompt_tokens,
    }
