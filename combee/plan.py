"""Pure planning: window identity, seeds, the augmented shuffle, level-1 groups and the merge tree.

Nothing here calls a model or touches I/O; the engine and the stream workers only *execute* these plans.

Shape of a reduce: ``n`` reflections are each duplicated ``p`` times and shuffled with an RNG
seeded from the window's identity; the augmented list is split into ``k`` near-equal level-1 groups,
``k = ⌊√n⌋`` (the paper's rule), raised to ``⌈p·n / max_group_items⌉`` when a group would otherwise exceed
``max_group_items``. Level-1 partial deltas are then merged by calls taking at most ``max_fan_in`` inputs each,
level after level, until one delta remains. With p = 2 and n ≤ 144 (defaults 24 / 12) that is two levels:
the groups, then one merge over all partials — the paper's scheme.

A keyed reduce (:func:`plan_keyed`) makes one such plan per key; :class:`Forest` lays any reduce out as one
numbered forest, which is how the stream workers carry it between stages.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = [
    "DEFAULT_P",
    "DEFAULT_SHUFFLE_KEY",
    "SHUFFLE_KEYS",
    "Forest",
    "GroupPlan",
    "KeyedPlan",
    "MergeNode",
    "ReducePlan",
    "ShuffleKey",
    "TreePlan",
    "augmented_shuffle",
    "default_p",
    "flatten_keyed",
    "flatten_reduce",
    "group_count",
    "plan_groups",
    "plan_keyed",
    "plan_reduce",
    "plan_tree",
    "seed_of",
    "window_id",
]


ShuffleKey = Literal["none", "section", "section-union"]
SHUFFLE_KEYS: tuple[str, ...] = get_args(ShuffleKey)
DEFAULT_SHUFFLE_KEY: ShuffleKey = "section-union"
"""The default reduce shape: how a window's reflections are routed and reduced. The evidence for it, real model
and SIMULATED, with the files it comes from: docs/benchmarks.md (figures are kept there, not here, so that they
cannot go stale in the code)."""


DEFAULT_P: dict[str, int] = {"none": 2, "section": 2, "section-union": 1}
"""The duplication factor p of each reduce shape unless ``COMBEE_P`` sets one. The shapes that merge keep the
paper's p = 2 (a merge call selects among proposals, and a second copy of a reflection guards against a merge
dropping it); ``section-union`` merges nothing, so a second copy only makes duplicates and fuller groups. On the
local model it also learned fewer lessons, more slowly (docs/benchmarks.md)."""


def default_p(shape: str) -> int:
    """The duplication factor of reduce shape ``shape`` by default (:data:`DEFAULT_P`)."""
    return DEFAULT_P[shape]


def window_id(namespace: str, source: str, first_offset: int, last_offset: int) -> str:
    """The identity of a window: ``namespace/source/first-last``.

    ``source`` names where the offsets come from: ``p3`` for Kafka partition 3, ``file:e0`` for epoch 0 of an
    offline trace file. Re-forming the same window from the same records always yields the same id.
    """
    if last_offset < first_offset:
        raise ValueError(f"window offsets out of order: {first_offset} > {last_offset}")
    return f"{namespace}/{source}/{first_offset}-{last_offset}"


def seed_of(key: str) -> int:
    """A 64-bit seed derived from a string (stable across processes and Python versions)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")


def augmented_shuffle(n: int, p: int, rng: random.Random) -> list[int]:
    """Indices ``0..n-1``, each repeated ``p`` times, in a shuffled order drawn from ``rng``."""
    if n < 0 or p < 1:
        raise ValueError(f"need n >= 0 and p >= 1, got n={n}, p={p}")
    items = [i for i in range(n) for _ in range(p)]
    rng.shuffle(items)
    return items


def group_count(n: int, p: int, max_group_items: int = 24, group_factor: float = 1.0) -> int:
    """Number of level-1 groups for ``n`` reflections duplicated ``p`` times.

    ``⌊group_factor·√n⌋`` (at least 1; factor 1 is the paper's rule), raised so that no group holds more
    than ``max_group_items`` items, and never more groups than items.
    """
    if n <= 0:
        return 0
    if max_group_items < 1:
        raise ValueError("max_group_items must be >= 1")
    k = max(1, math.floor(group_factor * math.sqrt(n)))
    items = p * n
    if math.ceil(items / k) > max_group_items:
        k = math.ceil(items / max_group_items)
    return min(k, items)


def _split(items: list[int], k: int) -> list[list[int]]:
    """Split into ``k`` contiguous chunks whose sizes differ by at most one (larger chunks first)."""
    base, extra = divmod(len(items), k)
    out, start = [], 0
    for g in range(k):
        size = base + (1 if g < extra else 0)
        out.append(items[start : start + size])
        start += size
    return out


@dataclass(frozen=True)
class GroupPlan:
    """Level-1 groups. ``augmented[g]`` is group g's slice of the shuffled list (size differs by ≤ 1
    between groups); ``groups[g]`` is the same with repeated indices collapsed, in first-seen order — a
    curator is shown each reflection once even if both of its copies landed in the same group."""

    n: int
    p: int
    augmented: tuple[tuple[int, ...], ...]
    groups: tuple[tuple[int, ...], ...]

    @property
    def k(self) -> int:
        return len(self.groups)


def plan_groups(n: int, p: int, rng: random.Random, max_group_items: int = 24, group_factor: float = 1.0) -> GroupPlan:
    """Augmented shuffle of ``n`` reflections, split into :func:`group_count` near-equal groups."""
    k = group_count(n, p, max_group_items, group_factor)
    if k == 0:
        return GroupPlan(n=n, p=p, augmented=(), groups=())
    chunks = _split(augmented_shuffle(n, p, rng), k)
    return GroupPlan(
        n=n,
        p=p,
        augmented=tuple(tuple(c) for c in chunks),
        groups=tuple(tuple(dict.fromkeys(c)) for c in chunks),
    )


@dataclass(frozen=True)
class MergeNode:
    """A merge call at ``level`` (≥ 2) combining the outputs of nodes ``children`` of level ``level - 1``."""

    level: int
    index: int
    children: tuple[int, ...]


@dataclass(frozen=True)
class TreePlan:
    """The merge tree above ``leaves`` level-1 partials. ``levels[i]`` holds the nodes of level ``i + 2``.

    No merge levels when there is a single leaf (its partial is the window's delta)."""

    leaves: int
    max_fan_in: int
    levels: tuple[tuple[MergeNode, ...], ...]

    @property
    def depth(self) -> int:
        """Number of levels including the groups (1 = groups only)."""
        return 1 + len(self.levels)

    @property
    def merge_calls(self) -> int:
        return sum(len(level) for level in self.levels)

    @property
    def root(self) -> tuple[int, int]:
        """(level, index) of the node whose output is the window's delta."""
        return (self.depth, 0)


def plan_tree(leaves: int, max_fan_in: int = 12) -> TreePlan:
    """Merge levels of near-equal fan-in (each ≤ ``max_fan_in``) until one node remains."""
    if max_fan_in < 2:
        raise ValueError("max_fan_in must be >= 2")
    levels: list[tuple[MergeNode, ...]] = []
    count, level = leaves, 2
    while count > 1:
        nodes = math.ceil(count / max_fan_in)
        chunks = _split(list(range(count)), nodes)
        levels.append(tuple(MergeNode(level=level, index=i, children=tuple(c)) for i, c in enumerate(chunks)))
        count, level = nodes, level + 1
    return TreePlan(leaves=leaves, max_fan_in=max_fan_in, levels=tuple(levels))


@dataclass(frozen=True)
class ReducePlan:
    groups: GroupPlan
    tree: TreePlan


def plan_reduce(
    n: int,
    p: int,
    seed_key: str,
    *,
    max_group_items: int = 24,
    max_fan_in: int = 12,
    group_factor: float = 1.0,
) -> ReducePlan:
    """The whole reduce plan of a window, seeded from ``seed_key`` (a replay makes the same plan)."""
    groups = plan_groups(n, p, random.Random(seed_of(seed_key)), max_group_items, group_factor)
    return ReducePlan(groups=groups, tree=plan_tree(groups.k, max_fan_in))


@dataclass(frozen=True)
class KeyedPlan:
    """A keyed shuffle: reflections are routed by a key (e.g. the section of their insight), each key's class
    is reduced on its own (``plans[c]`` over the reflections ``members[c]``, in window order), and the classes'
    deltas are *united*, not merged: classes with different keys hold unrelated items, so no call has to
    consolidate across them. With ``merge_within_key`` false, a class's level-1 partials are united too (no
    merge call at all; exact duplicates dropped)."""

    keys: tuple[str, ...]
    members: tuple[tuple[int, ...], ...]
    plans: tuple[ReducePlan, ...]
    merge_within_key: bool = True

    @property
    def curator_calls(self) -> int:
        return sum(plan.groups.k for plan in self.plans)

    @property
    def merge_calls(self) -> int:
        return sum(plan.tree.merge_calls for plan in self.plans) if self.merge_within_key else 0

    @property
    def depth(self) -> int:
        """Levels of calls on the longest chain (1 = curator calls only)."""
        if not self.plans:
            return 0
        return max(plan.tree.depth for plan in self.plans) if self.merge_within_key else 1


def plan_keyed(
    keys: Sequence[str],
    p: int,
    seed_key: str,
    *,
    max_group_items: int = 24,
    max_fan_in: int = 12,
    group_factor: float = 1.0,
    merge_within_key: bool = True,
) -> KeyedPlan:
    """One :func:`plan_reduce` per distinct key (sorted), each seeded from ``seed_key`` and its key."""
    classes = sorted(set(keys))
    members = tuple(tuple(i for i, k in enumerate(keys) if k == c) for c in classes)
    plans = tuple(
        plan_reduce(
            len(m),
            p,
            f"{seed_key}#{c}",
            max_group_items=max_group_items,
            max_fan_in=max_fan_in,
            group_factor=group_factor,
        )
        for c, m in zip(classes, members, strict=True)
    )
    return KeyedPlan(tuple(classes), members, plans, merge_within_key)


@dataclass(frozen=True)
class Forest:
    """A window's whole reduce laid out as one forest with window-wide node numbers — what the stream workers
    execute (the map stage sends it, the combiner runs its merges as children arrive, :mod:`combee.scan`).

    ``groups[g]`` lists the reflections (indices in the window's order) of level-1 node ``(1, g)``; ``levels[i]``
    holds the merge nodes of level ``i + 2``, whose children are nodes of the level below; ``roots`` are the
    nodes whose outputs make the window's delta, in order. With ``unite`` false there is exactly one root and its
    operations are the delta as they are (the paper's reduce); with ``unite`` true the roots' operations are
    united, exact duplicates dropped (:func:`combee.playbook.unite_ops`), as a keyed reduce unites its classes.
    """

    groups: tuple[tuple[int, ...], ...] = ()
    levels: tuple[tuple[MergeNode, ...], ...] = ()
    roots: tuple[tuple[int, int], ...] = ()
    unite: bool = False

    @property
    def merge_calls(self) -> int:
        return sum(len(level) for level in self.levels)


def flatten_reduce(plan: ReducePlan) -> Forest:
    """The paper's reduce as a forest: one tree, its root's operations taken as they are."""
    if plan.groups.k == 0:
        return Forest()
    return Forest(groups=plan.groups.groups, levels=plan.tree.levels, roots=(plan.tree.root,), unite=False)


def flatten_keyed(plan: KeyedPlan) -> Forest:
    """A keyed reduce as a forest: each class's groups and merge levels renumbered after the earlier classes'
    (classes in key order), one root per class — or, without merges within a key, every group a root — united.

    Uniting the roots in this order gives what :func:`combee.engine.run_window` gives for the keyed plan: it
    unites each class's partials, then the classes, and uniting is associative when order is kept."""
    groups: list[tuple[int, ...]] = []
    levels: list[list[MergeNode]] = []
    roots: list[tuple[int, int]] = []
    for members, sub in zip(plan.members, plan.plans, strict=True):
        first = len(groups)
        groups.extend(tuple(members[i] for i in group) for group in sub.groups.groups)
        if not plan.merge_within_key:
            roots.extend((1, first + g) for g in range(sub.groups.k))
            continue
        below = first  # where this class's nodes start on the level below
        for i, level_nodes in enumerate(sub.tree.levels):
            if len(levels) <= i:
                levels.append([])
            start = len(levels[i])
            levels[i].extend(
                MergeNode(level=node.level, index=start + node.index, children=tuple(below + c for c in node.children))
                for node in level_nodes
            )
            below = start
        roots.append((sub.tree.depth, below))
    return Forest(groups=tuple(groups), levels=tuple(tuple(level) for level in levels), roots=tuple(roots), unite=True)
