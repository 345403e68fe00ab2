import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from combee.plan import (
    augmented_shuffle,
    group_count,
    plan_groups,
    plan_reduce,
    plan_tree,
    seed_of,
    window_id,
)


def test_window_id_is_readable_and_ordered():
    assert window_id("ns", "p3", 10, 19) == "ns/p3/10-19"
    with pytest.raises(ValueError):
        window_id("ns", "p3", 5, 4)


def test_seed_is_stable():
    assert seed_of("ns/p0/0-9") == seed_of("ns/p0/0-9")
    assert seed_of("ns/p0/0-9") != seed_of("ns/p0/0-10")
    assert seed_of("a") == 0x_CA978112CA1BBDCA  # sha256("a") first 8 bytes: stable across processes


@given(n=st.integers(0, 400), p=st.integers(1, 4), seed=st.integers(0, 2**32))
def test_augmented_shuffle_duplicates_each_item_p_times(n, p, seed):
    items = augmented_shuffle(n, p, random.Random(seed))
    assert Counter(items) == Counter({i: p for i in range(n)}) if n else items == []


@given(n=st.integers(1, 10_000), p=st.integers(1, 3), max_items=st.integers(4, 48))
@settings(max_examples=300)
def test_group_count_respects_the_group_bound(n, p, max_items):
    k = group_count(n, p, max_items)
    assert 1 <= k <= p * n
    assert math.ceil(p * n / k) <= max_items
    assert k >= min(math.isqrt(n), p * n)


@given(n=st.integers(1, 3_000), p=st.integers(1, 3), seed=st.integers(0, 2**32))
@settings(max_examples=150, deadline=None)
def test_plan_groups_sizes_duplication_and_determinism(n, p, seed):
    plan = plan_groups(n, p, random.Random(seed))
    sizes = [len(g) for g in plan.augmented]
    assert max(sizes) - min(sizes) <= 1
    assert max(sizes) <= 24
    assert Counter(i for g in plan.augmented for i in g) == Counter({i: p for i in range(n)})
    # collapsed groups list each reflection at most once, and lose none
    for raw, collapsed in zip(plan.augmented, plan.groups, strict=True):
        assert len(set(collapsed)) == len(collapsed)
        assert set(collapsed) == set(raw)
    assert plan == plan_groups(n, p, random.Random(seed))


def test_plans_differ_by_seed():
    a = plan_reduce(100, 2, "ns/p0/0-99")
    b = plan_reduce(100, 2, "ns/p0/100-199")
    assert a.groups.k == b.groups.k == 10
    assert a.groups.augmented != b.groups.augmented
    assert a == plan_reduce(100, 2, "ns/p0/0-99")


@pytest.mark.parametrize("n", range(4, 145))
def test_paper_two_levels_for_n_up_to_144_with_p2(n):
    plan = plan_reduce(n, 2, f"w{n}")
    assert plan.tree.depth == 2  # the groups, then one merge over every partial
    assert plan.tree.merge_calls == 1
    assert plan.tree.levels[0][0].children == tuple(range(plan.groups.k))
    # k is the paper's floor(sqrt(n)), or one more where a group of 2n/k would exceed 24 items
    assert plan.groups.k in (math.isqrt(n), math.isqrt(n) + 1)
    if math.ceil(2 * n / math.isqrt(n)) <= 24:
        assert plan.groups.k == math.isqrt(n)


@given(n=st.integers(1, 10_000), fan_in=st.integers(2, 24))
@settings(max_examples=300, deadline=None)
def test_tree_fan_in_bounded_at_every_level(n, fan_in):
    k = group_count(n, 2)
    tree = plan_tree(k, fan_in)
    count = k
    for level in tree.levels:
        children = [c for node in level for c in node.children]
        assert sorted(children) == list(range(count))  # every node of the level below feeds exactly one merge
        assert all(1 <= len(node.children) <= fan_in for node in level)
        sizes = [len(node.children) for node in level]
        assert max(sizes) - min(sizes) <= 1
        count = len(level)
    assert count == 1


def test_tree_for_large_windows():
    plan = plan_reduce(2_000, 2, "big")
    assert plan.groups.k == math.ceil(4_000 / 24)  # 167 groups of <= 24 items
    assert max(len(g) for g in plan.groups.augmented) <= 24
    assert plan.tree.depth == 4  # 167 -> 14 -> 2 -> 1
    assert [len(level) for level in plan.tree.levels] == [14, 2, 1]
    assert plan.tree.merge_calls == 17


def test_single_group_needs_no_merge():
    plan = plan_reduce(1, 2, "one")
    assert plan.groups.k == 1 and plan.groups.groups == ((0,),)
    assert plan.tree.levels == () and plan.tree.root == (1, 0)


def test_group_factor_changes_k():
    assert group_count(100, 2, group_factor=0.5) == 9  # 5 groups of 40 would exceed 24 items: ceil(200/24)
    assert group_count(100, 1, group_factor=0.5) == 5
    assert group_count(100, 2, group_factor=2.0) == 20


def test_a_keyed_plan_reduces_each_key_apart_and_is_seeded_per_key() -> None:
    from combee.plan import plan_keyed

    keys = ["b", "a", "b", "c", "a", "b", "", "b"]
    plan = plan_keyed(keys, 2, "ns/file:e0/0-7", max_group_items=2, max_fan_in=2)
    assert plan.keys == ("", "a", "b", "c")
    assert plan.members == ((6,), (1, 4), (0, 2, 5, 7), (3,))
    assert sorted(i for m in plan.members for i in m) == list(range(len(keys)))
    for members, sub in zip(plan.members, plan.plans, strict=True):
        assert sub.groups.n == len(members) and all(len(g) <= 2 for g in sub.groups.augmented)
    assert plan == plan_keyed(keys, 2, "ns/file:e0/0-7", max_group_items=2, max_fan_in=2)
    united = plan_keyed(keys, 2, "ns/file:e0/0-7", max_group_items=2, merge_within_key=False)
    assert united.merge_calls == 0 and united.depth == 1 and united.curator_calls == plan.curator_calls
    assert plan.merge_calls > 0 and plan.depth >= 2


def _node_classes(forest, membership):
    """The key class of every node of a forest (level 1 from its reflections, merges from their children)."""
    of = {(1, g): {membership[i] for i in group} for g, group in enumerate(forest.groups)}
    for level in forest.levels:
        for node in level:
            of[(node.level, node.index)] = set().union(*(of[(node.level - 1, c)] for c in node.children))
    return of


@given(
    keys=st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=0, max_size=120),
    fan_in=st.integers(2, 5),
    items=st.integers(2, 8),
    within=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_a_keyed_plan_flattens_to_a_forest_of_one_tree_per_key(keys, fan_in, items, within) -> None:
    from combee.plan import flatten_keyed, plan_keyed

    keyed = plan_keyed(keys, 2, "w", max_group_items=items, max_fan_in=fan_in, merge_within_key=within)
    forest = flatten_keyed(keyed)
    # the same groups, class after class, each over its own key's reflections
    expected = [
        tuple(m[i] for i in g) for m, sub in zip(keyed.members, keyed.plans, strict=True) for g in sub.groups.groups
    ]
    assert list(forest.groups) == expected
    assert forest.merge_calls == keyed.merge_calls and forest.unite
    membership = dict(enumerate(keys))
    classes = _node_classes(forest, membership)
    assert all(len(c) == 1 for c in classes.values())  # no call ever sees two keys
    children = {(n.level - 1, c) for level in forest.levels for n in level for c in n.children}
    parentless = [node for node in classes if node not in children]
    assert sorted(forest.roots) == sorted(parentless)  # every node feeds exactly one root
    root_keys = [next(iter(classes[r])) for r in forest.roots]
    assert root_keys == sorted(root_keys) and set(root_keys) == set(keys)  # united in key order
    if within:
        assert len(forest.roots) == len(keyed.keys)  # one tree per key
    if not within:
        assert forest.levels == () and len(forest.roots) == len(forest.groups)
    for i, level in enumerate(forest.levels):  # numbered 0.. at every level, children of the level below
        assert [n.index for n in level] == list(range(len(level))) and all(n.level == i + 2 for n in level)


def test_the_papers_plan_is_a_forest_of_one_tree_taken_as_it_is() -> None:
    from combee.plan import Forest, flatten_reduce

    plan = plan_reduce(300, 2, "w", max_group_items=24, max_fan_in=4)
    forest = flatten_reduce(plan)
    assert forest.groups == plan.groups.groups and forest.levels == plan.tree.levels
    assert forest.roots == (plan.tree.root,) and not forest.unite
    assert flatten_reduce(plan_reduce(0, 2, "w")) == Forest()
