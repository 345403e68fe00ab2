import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from combee.models import AddOp, Trace
from combee.plan import plan_tree
from combee.scan import ReduceTracker, tree_shape
from combee.windowing import MapState, WindowPolicy, accept_window, close_size


def tr(i):
    return Trace(trace_id=f"t{i}", namespace="ns", task=f"task {i}")


P = WindowPolicy(max_inflight=1, max_wait_s=10, bs_min=2, bs_max=100)


def test_close_waits_for_target_or_max_wait():
    assert close_size(P, buffered=5, oldest_age_s=1, in_flight=0, target=10) is None
    assert close_size(P, buffered=10, oldest_age_s=1, in_flight=0, target=10) == (10, "size")
    assert close_size(P, buffered=5, oldest_age_s=10, in_flight=0, target=10) == (5, "max_wait")
    assert close_size(P, buffered=0, oldest_age_s=99, in_flight=0, target=10) is None


def test_close_respects_inflight_bound():
    assert close_size(P, buffered=50, oldest_age_s=99, in_flight=1, target=10) is None
    two = WindowPolicy(max_inflight=2, max_wait_s=10, bs_max=100)
    assert close_size(two, buffered=10, oldest_age_s=0, in_flight=1, target=10) == (10, "size")


def test_backlog_takes_everything_up_to_bs_max():
    assert close_size(P, buffered=37, oldest_age_s=0, in_flight=0, target=10) == (37, "backlog")
    assert close_size(P, buffered=500, oldest_age_s=0, in_flight=0, target=10) == (100, "backlog")


def test_target_is_clamped():
    assert close_size(P, buffered=2, oldest_age_s=0, in_flight=0, target=1) == (2, "size")


def test_accept_assigns_increasing_seqs():
    s0 = MapState()
    a = accept_window(s0, "ns", "p0", [0, 1, 2], [tr(0), tr(1), tr(2)])
    b = accept_window(a.state, "ns", "p0", [5, 9], [tr(5), tr(9)])
    assert (a.seq, b.seq) == (0, 1) and a.window_id == "ns/p0/0-2" and b.window_id == "ns/p0/5-9"
    assert b.state.mark("p0") == 9 and b.state.next_seq == 2


def test_redelivered_window_keeps_its_seq_and_cut():
    a = accept_window(MapState(), "ns", "p0", [0, 1, 2], [tr(0), tr(1), tr(2)])
    b = accept_window(a.state, "ns", "p0", [3, 4], [tr(3), tr(4)])
    again = accept_window(b.state, "ns", "p0", [0, 1, 2], [tr(0), tr(1), tr(2)])
    assert again.seq == 0 and again.replayed and again.state == b.state and again.window_id == "ns/p0/0-2"


def test_reformed_overlapping_window_is_stripped():
    a = accept_window(MapState(), "ns", "p0", [0, 1, 2], [tr(0), tr(1), tr(2)])
    b = accept_window(a.state, "ns", "p0", [1, 2, 3, 4], [tr(1), tr(2), tr(3), tr(4)])
    assert b.window_id == "ns/p0/3-4" and b.stripped == 2 and b.seq == 1
    assert [t.trace_id for t in b.traces] == ["t3", "t4"]
    # and its own redelivery is cut the same way
    again = accept_window(b.state, "ns", "p0", [1, 2, 3, 4], [tr(1), tr(2), tr(3), tr(4)])
    assert again.window_id == "ns/p0/3-4" and again.seq == 1


def test_fully_covered_window_is_a_duplicate():
    a = accept_window(MapState(), "ns", "p0", [0, 1, 2], [tr(0), tr(1), tr(2)])
    d = accept_window(a.state, "ns", "p0", [1, 2], [tr(1), tr(2)])
    assert d.duplicate and d.state == a.state


@given(st.lists(st.integers(0, 60), min_size=1, max_size=12), st.integers(0, 5))
def test_every_offset_is_accepted_once(cuts, redeliveries):
    """However windows are cut and redelivered, each offset lands in exactly one accepted window."""
    offsets = list(range(60))
    state, covered = MapState(), []
    bounds = sorted(set(cuts))
    pieces = [offsets[i:j] for i, j in zip([0, *bounds], [*bounds, 60], strict=True) if offsets[i:j]]
    for k, piece in enumerate(pieces):
        for _ in range(1 + (k % (redeliveries + 1) == 0)):
            acc = accept_window(state, "ns", "p0", piece, [tr(o) for o in piece])
            state = acc.state
            if not acc.duplicate and not acc.replayed:
                covered.extend(acc.offsets)
        # a re-formed window overlapping the previous one
        if k and redeliveries:
            prev = pieces[k - 1][-1:] + piece
            acc = accept_window(state, "ns", "p0", prev, [tr(o) for o in prev])
            state = acc.state
            if not acc.duplicate and not acc.replayed:
                covered.extend(acc.offsets)
    assert sorted(covered) == offsets


def test_rejects_bad_offsets():
    with pytest.raises(ValueError):
        accept_window(MapState(), "ns", "p0", [2, 1], [tr(2), tr(1)])


def ops(*names):
    return tuple(AddOp(section="s", content=n) for n in names)


def test_tracker_runs_merges_as_children_arrive():
    tree = plan_tree(5, max_fan_in=2)  # 5 -> 3 -> 2 -> 1
    t = ReduceTracker(5, tree_shape(tree))
    assert t.ready() == []
    t.add(1, 0, ops("a"))
    t.add(1, 1, ops("b"))
    ready = t.ready()
    assert [(n.level, n.index) for n in ready] == [(2, 0)]
    assert ready[0].inputs == (ops("a"), ops("b"))
    assert t.ready() == []  # started once
    assert t.add(1, 0, ops("x")) is False  # idempotent per node
    for g in (2, 3, 4):
        t.add(1, g, ops(str(g)))
    assert [(n.level, n.index) for n in t.ready()] == [(2, 1), (2, 2)]
    t.add(2, 0, ops("ab"))
    t.add(2, 1, ops("23"))
    t.add(2, 2, ops("4"))
    assert [(n.level, n.index) for n in t.ready()] == [(3, 0), (3, 1)]
    t.add(3, 0, ops("ab23"))
    t.add(3, 1, ops("4"))
    (root,) = t.ready()
    assert (root.level, root.index) == (4, 0)
    assert t.result() is None
    t.add(4, 0, ops("all"))
    assert t.result() == ops("all")


def test_tracker_single_group_and_empty():
    t = ReduceTracker(1, ())
    assert t.result() is None and t.ready() == []
    t.add(1, 0, ops("a"))
    assert t.result() == ops("a")
    assert ReduceTracker(0, ()).result() == ()
    assert t.add(1, 5, ops("z")) is False and t.add(2, 0, ops("z")) is False


def test_tracker_unites_the_roots_of_a_forest_in_order():
    # two classes: groups 0-2 merged by (2, 0); group 3 alone is its class's root
    t = ReduceTracker(4, (((0, 1, 2),),), roots=((2, 0), (1, 3)), unite=True)
    t.add(1, 3, ops("d", "a"))
    for g in (0, 1, 2):
        t.add(1, g, ops(str(g)))
    (node,) = t.ready()
    assert (node.level, node.index) == (2, 0)
    assert t.result() is None  # a root is missing
    t.add(2, 0, ops("a", "b", "A."))
    assert t.result() == ops("a", "b", "d")  # roots in order, exact duplicates (after normalising) dropped


def test_tracker_without_merges_unites_its_groups():
    t = ReduceTracker(3, (), roots=((1, 0), (1, 1), (1, 2)), unite=True)
    t.add(1, 2, ops("c"))
    t.add(1, 0, ops("a", "c"))
    assert t.ready() == [] and t.result() is None
    t.add(1, 1, ops("b"))
    assert t.result() == ops("a", "c", "b")


def test_tracker_refuses_roots_the_plan_does_not_have():
    with pytest.raises(ValueError):
        ReduceTracker(2, (), roots=((1, 2),), unite=True)
    with pytest.raises(ValueError):
        ReduceTracker(2, (), roots=((1, 0), (1, 1)), unite=False)


def test_a_window_plan_names_its_reduce_and_an_older_plan_still_decodes():
    from streams.codec import CodecError, decode, encode
    from streams.envelopes import WindowPlan

    base = {
        **dict(window_id="ns/p0/0-9", namespace="ns", seq=0, source="p0", first_offset=0, last_offset=9),
        **dict(trace_count=10, reflections=10, base_version=0, tag_counts={}, closed_at=1.0, mapped_at=2.0),
    }
    united = WindowPlan(**base, groups=3, tree=(), shape="section-union", roots=((1, 0), (1, 1), (1, 2)), unite=True)
    assert decode(encode(united)) == united
    # written before reduce shapes existed: the paper's one tree, its root taken as it is
    old = json.loads(encode(WindowPlan(**base, groups=4, tree=(((0, 1, 2, 3),),))))
    for field in ("shape", "roots", "unite", "run_facts"):
        old.pop(field)
    plan = decode(json.dumps(old).encode())
    assert isinstance(plan, WindowPlan) and plan.shape == "none"
    assert ReduceTracker(plan.groups, plan.tree, plan.roots, plan.unite).roots == ((2, 0),)
    # roots that are not nodes of the plan: refused at decoding (dead-lettered), never waited for
    bad = json.loads(encode(united))
    bad["roots"] = [[2, 0]]
    with pytest.raises(CodecError):
        decode(json.dumps(bad).encode())
