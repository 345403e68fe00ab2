"""Spreading one window's reflections over a pool of workers: the tasks, and gathering their answers.

A window's traces are cut into consecutive *reflection tasks* of at most ``task_size`` traces
(:func:`task_slices`); any worker may reflect a task. :class:`ReflectionGather` takes the answers back in any
order, any number of times, and gives the reflections in trace order once every task has answered, so the
reduce that follows sees exactly the list a single process would have made: the same window gives the same
plan whichever workers reflected it and in whatever order their answers came back.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from combee.models import Reflection

__all__ = ["ReflectionGather", "task_slices"]


def task_slices(n: int, task_size: int) -> tuple[range, ...]:
    """Consecutive ranges of at most ``task_size`` trace positions covering ``0..n-1`` (none when n is 0).

    Raises ValueError when ``task_size`` is not positive.
    """
    if task_size < 1:
        raise ValueError(f"task_size must be at least 1, got {task_size}")
    return tuple(range(start, min(n, start + task_size)) for start in range(0, n, task_size))


@dataclass
class ReflectionGather:
    """The answers of one window's reflection tasks, computed against playbook ``base_version``.

    :meth:`add` is idempotent: the first well-formed answer of a task is kept, later ones (a redelivered
    task, a task sent again by a new owner) are ignored, and so are answers computed against another
    playbook version or of the wrong length.
    """

    slices: tuple[range, ...]
    base_version: int
    _answers: dict[int, tuple[Reflection | None, ...]] = field(default_factory=dict)
    service_s: float = 0.0  # the slowest task's slowest reflection (the map's contribution to a critical path)

    def add(
        self, index: int, base_version: int, reflections: Sequence[Reflection | None], service_s: float = 0.0
    ) -> bool:
        """Record task ``index``'s answer; True when it was new and kept."""
        if base_version != self.base_version or not 0 <= index < len(self.slices) or index in self._answers:
            return False
        if len(reflections) != len(self.slices[index]):
            return False
        self._answers[index] = tuple(reflections)
        self.service_s = max(self.service_s, service_s)
        return True

    def missing(self) -> list[int]:
        """Tasks without an answer yet, in order."""
        return [i for i in range(len(self.slices)) if i not in self._answers]

    @property
    def complete(self) -> bool:
        return len(self._answers) == len(self.slices)

    def reflections(self) -> list[Reflection | None]:
        """Every trace's reflection in trace order (None: the trace's answers never parsed).

        Raises ValueError while a task is missing.
        """
        if not self.complete:
            raise ValueError(f"tasks {self.missing()} have not answered")
        return [r for i in range(len(self.slices)) for r in self._answers[i]]
