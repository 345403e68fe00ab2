"""Incremental execution of one window's reduce, as partial deltas arrive in any order (pure).

The reduce is fixed by the plan (a :class:`combee.plan.Forest`: one tree for the paper's shape, one per
section for a keyed one, or bare groups united), so the result does not depend on arrival order: a merge
node becomes *ready* the moment all of its own children are present — merges start while other groups are
still being curated (stragglers overlap with merging) — and its inputs are always taken in child-index
order; the window's operations are its roots', in order (united when the plan says so). Adding the same
partial twice is a no-op (partials are idempotent per (level, index)).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from combee.models import DeltaOp
from combee.plan import Forest, TreePlan
from combee.playbook import unite_ops

__all__ = ["ReadyNode", "ReduceTracker", "tree_shape"]

Shape = tuple[tuple[tuple[int, ...], ...], ...]


def tree_shape(tree: TreePlan | Forest) -> Shape:
    """The serialisable shape of a tree or forest: ``shape[i][j]`` = children of node j at level i + 2."""
    return tuple(tuple(node.children for node in level) for level in tree.levels)


@dataclass(frozen=True)
class ReadyNode:
    level: int
    index: int
    inputs: tuple[tuple[DeltaOp, ...], ...]


@dataclass
class ReduceTracker:
    """``groups`` level-1 nodes, merge levels ``shape``, and the ``roots`` whose operations make the window's
    delta (united when ``unite``). No roots: the last level's one node, taken as it is (plans written before
    reduce shapes existed). Raises ValueError for a root the shape does not have."""

    groups: int
    shape: Shape
    roots: tuple[tuple[int, int], ...] = ()
    unite: bool = False
    _have: dict[tuple[int, int], tuple[DeltaOp, ...]] = field(default_factory=dict)
    _started: set[tuple[int, int]] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not self.roots and self.groups:
            self.roots = ((1 + len(self.shape), 0),)
        for level, index in self.roots:
            if not self.expects(level, index):
                raise ValueError(f"root ({level}, {index}) is not a node of the plan")
        if len(self.roots) > 1 and not self.unite:
            raise ValueError("a plan with several roots must unite them")

    def expects(self, level: int, index: int) -> bool:
        if level == 1:
            return 0 <= index < self.groups
        return 2 <= level <= 1 + len(self.shape) and 0 <= index < len(self.shape[level - 2])

    def add(self, level: int, index: int, ops: Sequence[DeltaOp]) -> bool:
        """Record the partial of node (level, index). False if unexpected or already present."""
        key = (level, index)
        if not self.expects(level, index) or key in self._have:
            return False
        self._have[key] = tuple(ops)
        return True

    def has(self, level: int, index: int) -> bool:
        return (level, index) in self._have

    def ready(self) -> list[ReadyNode]:
        """Merge nodes whose children are all present and that are neither done nor started; marks them started."""
        out = []
        for i, level in enumerate(self.shape):
            lvl = i + 2
            for j, children in enumerate(level):
                key = (lvl, j)
                if key in self._have or key in self._started:
                    continue
                if all((lvl - 1, c) in self._have for c in children):
                    self._started.add(key)
                    out.append(ReadyNode(lvl, j, tuple(self._have[(lvl - 1, c)] for c in children)))
        return out

    def forget_started(self, level: int | None = None, index: int | None = None) -> None:
        """Allow started-but-unfinished merges to be offered again: one node (after its call failed), or all of
        them (after a restart)."""
        if level is None or index is None:
            self._started.clear()
        else:
            self._started.discard((level, index))

    def result(self) -> tuple[DeltaOp, ...] | None:
        """The window's operations once every root is present (empty for a window with no groups)."""
        if self.groups == 0:
            return ()
        if any(root not in self._have for root in self.roots):
            return None
        if self.unite:
            return unite_ops(self._have[root] for root in self.roots)
        return self._have[self.roots[0]]

    @property
    def missing_groups(self) -> int:
        return sum(1 for g in range(self.groups) if (1, g) not in self._have)
