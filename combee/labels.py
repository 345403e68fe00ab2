"""Bounded metric labels: namespaces are chosen by producers, Prometheus series must not be.

:class:`BoundedLabels` gives the first ``limit`` distinct values a label of their own and folds every later one
into :data:`OTHER`, which is not a valid namespace (so it never collides with one). Deterministic: the same
values in the same order get the same labels. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["OTHER", "BoundedLabels"]

OTHER = "(other)"
"""The label of every namespace past the limit."""


class BoundedLabels:
    """Maps a value to itself while fewer than ``limit`` values have a label of their own, else to :data:`OTHER`.
    ``exempt`` values (e.g. "" for records that name no namespace) are always themselves and count for nothing."""

    def __init__(self, limit: int, exempt: Iterable[str] = ("",)) -> None:
        if limit < 1:
            raise ValueError("a label limit must be at least 1")
        self.limit = limit
        self.exempt = frozenset(exempt)
        self.own: set[str] = set()
        self.folded = 0  # values seen past the limit (their calls, not distinct values)

    def __call__(self, value: str) -> str:
        if value in self.own or value in self.exempt:
            return value
        if len(self.own) < self.limit:
            self.own.add(value)
            return value
        self.folded += 1
        return OTHER
