"""The live-namespace cap and idle eviction (combee/namespaces.py): pure decisions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from combee.namespaces import NamespaceUse, admits, idle_out, limit_reason


def test_a_live_namespace_is_always_admitted_and_a_new_one_only_below_the_cap() -> None:
    live = {"a", "b"}
    assert admits("a", live, cap=2)
    assert not admits("c", live, cap=2)
    assert admits("c", live, cap=3)
    assert admits("c", set(), cap=1)


def test_the_reason_names_the_namespace_and_the_cap() -> None:
    reason = limit_reason("tenant-9", 5)
    assert "'tenant-9'" in reason and "5" in reason and reason.startswith("namespace limit")


def test_only_idle_namespaces_that_hold_nothing_are_evicted_longest_idle_first() -> None:
    uses = [
        NamespaceUse("fresh", busy=False, last_active=95.0),
        NamespaceUse("old", busy=False, last_active=10.0),
        NamespaceUse("older", busy=False, last_active=5.0),
        NamespaceUse("buffering", busy=True, last_active=0.0),
    ]
    assert idle_out(uses, now=100.0, idle_s=30.0) == ["older", "old"]
    assert idle_out(uses, now=100.0, idle_s=1000.0) == []


def test_a_namespace_is_evicted_exactly_at_its_idle_time() -> None:
    use = NamespaceUse("a", busy=False, last_active=40.0)
    assert idle_out([use], now=69.0, idle_s=30.0) == []
    assert idle_out([use], now=70.0, idle_s=30.0) == ["a"]


NAMES = ("a", "b", "c", "d", "e", "f", "g", "h")
# one use per namespace, as a worker has one runtime per namespace
uses_st = st.dictionaries(
    st.sampled_from(NAMES), st.tuples(st.booleans(), st.floats(0, 1000)), max_size=len(NAMES)
).map(lambda d: [NamespaceUse(ns, busy, at) for ns, (busy, at) in d.items()])


@settings(deadline=None)  # a pure function: how long a loaded machine takes is no property of it
@given(uses_st, st.floats(0, 2000), st.floats(0, 500))
def test_eviction_names_exactly_the_quiet_namespaces_whatever_their_order(
    uses: list[NamespaceUse], now: float, idle_s: float
) -> None:
    out = idle_out(uses, now, idle_s)
    assert set(out) == {u.namespace for u in uses if not u.busy and now - u.last_active >= idle_s}
    assert len(out) == len(set(out))
    assert out == idle_out(list(reversed(uses)), now, idle_s)


@settings(deadline=None)
@given(st.sets(st.text("xyz", min_size=1, max_size=2), max_size=6), st.integers(1, 8), st.text("xyz", min_size=1))
def test_admission_keeps_the_live_set_within_the_cap(live: set[str], cap: int, ns: str) -> None:
    if admits(ns, live, cap):
        assert len(live | {ns}) <= max(cap, len(live))
    else:
        assert ns not in live and len(live) >= cap
