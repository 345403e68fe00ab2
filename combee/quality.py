"""What a playbook costs the agent that reads it, beside what it teaches: the figures every quality number is
reported with (pure).

A retention or accuracy figure alone rewards bloat: a playbook that states one lesson five times, or keeps
200 bullets, costs every agent call its length and crowds out what matters. So every figure comes with:

* ``entries`` — bullets;
* ``distinct_lessons`` — groups of bullets that say the same thing (single-link clusters under a
  near-duplicate rule: the project's embedder at its threshold for real text; the simulator's insight keys
  for simulated text);
* ``bullets_per_lesson`` — ``entries / distinct_lessons`` (1.0: no redundancy);
* ``prompt_tokens`` — the tokens of the rendered playbook, which an agent pays on every call.

:func:`within_budget` renders a playbook under a token budget by the project's own eviction rule (the one
:func:`combee.playbook.apply_delta` applies), so that methods can be compared at equal prompt size: where
redundant bullets take room, other lessons are evicted, as in a real prompt of that size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from combee.models import Playbook
from combee.playbook import ApplyPolicy, fit_budget, playbook_tokens

__all__ = ["Bloat", "bloat", "clusters", "within_budget"]


def clusters(texts: Sequence[str], same: Callable[[str, str], bool]) -> list[list[int]]:
    """Single-link clusters of ``texts`` under ``same`` (indices, each cluster in order, clusters by first
    member). Deterministic; ``same`` is asked once per unordered pair."""
    parent = list(range(len(texts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            ri, rj = root(i), root(j)
            if ri != rj and same(texts[i], texts[j]):
                parent[max(ri, rj)] = min(ri, rj)
    groups: dict[int, list[int]] = {}
    for i in range(len(texts)):
        groups.setdefault(root(i), []).append(i)
    return [groups[r] for r in sorted(groups)]


@dataclass(frozen=True)
class Bloat:
    """A playbook's size figures (module docstring)."""

    entries: int
    distinct_lessons: int
    prompt_tokens: int

    @property
    def bullets_per_lesson(self) -> float:
        return self.entries / self.distinct_lessons if self.distinct_lessons else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "entries": self.entries,
            "distinct_lessons": self.distinct_lessons,
            "bullets_per_lesson": round(self.bullets_per_lesson, 3),
            "playbook_tokens": self.prompt_tokens,
        }


def bloat(playbook: Playbook, same: Callable[[str, str], bool]) -> Bloat:
    """The size figures of ``playbook``, its lessons grouped by ``same`` (e.g. :meth:`Similarity.near`)."""
    texts = [b.content for b in playbook.bullets]
    return Bloat(len(texts), len(clusters(texts, same)), playbook_tokens(playbook))


def within_budget(playbook: Playbook, tokens: int) -> Playbook:
    """``playbook`` as it would be kept under a ``tokens`` budget: the bullets the apply rule evicts last
    (highest helpful−harmful, then most recently updated, then oldest), same version."""
    return fit_budget(playbook, ApplyPolicy(token_budget=max(64, tokens)))
