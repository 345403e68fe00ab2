"""The pure part of spreading reflections over the pool (combee/fanout.py): task slices and the gather's laws."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from combee.fanout import ReflectionGather, task_slices
from combee.models import Reflection
from streams.topics import task_partition


def answers_for(slices: tuple[range, ...], version: int = 3) -> list[tuple[int, tuple[Reflection | None, ...]]]:
    return [
        (i, tuple(None if t % 5 == 4 else Reflection(trace_id=f"t{t}", base_version=version) for t in span))
        for i, span in enumerate(slices)
    ]


@settings(deadline=None)  # a shared, busy machine: no per-example deadline
@given(n=st.integers(0, 600), size=st.integers(1, 40))
def test_slices_cover_every_trace_once_in_order_and_none_is_too_big(n: int, size: int) -> None:
    slices = task_slices(n, size)
    assert [t for s in slices for t in s] == list(range(n))
    assert all(1 <= len(s) <= size for s in slices)


def test_a_task_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="task_size"):
        task_slices(10, 0)


@settings(deadline=None)  # a shared, busy machine: no per-example deadline
@given(n=st.integers(1, 120), size=st.integers(1, 16), data=st.data())
def test_any_arrival_order_with_duplicates_gives_the_trace_order(n: int, size: int, data: st.DataObject) -> None:
    slices = task_slices(n, size)
    answers = answers_for(slices)
    arrivals = data.draw(st.lists(st.sampled_from(answers), min_size=0, max_size=3 * len(answers)))
    arrivals += data.draw(st.permutations(answers))  # everything arrives at least once, in any order
    gather = ReflectionGather(slices, base_version=3)
    for index, reflections in arrivals:
        gather.add(index, 3, reflections)
    assert gather.complete and gather.missing() == []
    got = gather.reflections()
    assert [r.trace_id if r else None for r in got] == [None if t % 5 == 4 else f"t{t}" for t in range(n)]


def test_the_first_answer_of_a_task_is_kept_and_wrong_ones_are_ignored() -> None:
    slices = task_slices(5, 3)
    gather = ReflectionGather(slices, base_version=2)
    first = (Reflection(trace_id="a", base_version=2),) * 3
    assert gather.add(0, 2, first)
    assert not gather.add(0, 2, (None, None, None))  # a redelivered task's second answer
    assert not gather.add(1, 1, (None, None))  # computed against another playbook version
    assert not gather.add(1, 2, (None,))  # the wrong length
    assert not gather.add(7, 2, (None,))  # no such task
    assert gather.missing() == [1]
    with pytest.raises(ValueError, match="have not answered"):
        gather.reflections()
    assert gather.add(1, 2, (None, None), service_s=1.5)
    assert gather.reflections()[:3] == list(first) and gather.service_s == 1.5


@settings(deadline=None)  # a shared, busy machine: no per-example deadline
@given(window=st.text(min_size=1, max_size=30), partitions=st.integers(1, 64), tasks=st.integers(1, 300))
def test_a_windows_tasks_go_round_the_partitions_evenly(window: str, partitions: int, tasks: int) -> None:
    counts = [0] * partitions
    for index in range(tasks):
        counts[task_partition(window, index, partitions)] += 1
    assert max(counts) - min(counts) <= 1
