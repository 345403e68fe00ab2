"""The corroboration and caps policy (issue 25 item 2): pure, on hand-made windows."""

import pytest

from combee.corroborate import Corroboration, corroborate, corroborate_tags, established
from combee.models import AddOp, Bullet, Playbook, Provenance, RemoveOp, UpdateOp

MADE = Provenance(window_id="w0", version=1)
LESSON = "Report the percentage change between two reported periods, not the absolute difference."


def _playbook(helpful: int = 0, pinned: bool = False) -> Playbook:
    b = Bullet(id="b00001", section="formulas", content="Use gross margin.", helpful=helpful, pinned=pinned,
               created=MADE, updated=MADE)  # fmt: skip
    return Playbook(namespace="ns", version=1, bullets=(b,), next_id=2)


def _add(*sources: str, content: str = LESSON) -> AddOp:
    return AddOp(section="formulas", content=content, sources=sources)


def test_the_defaults_change_nothing():
    ops = (_add("t1"), UpdateOp(bullet_id="b00001", content="x y z", sources=("t1",)), RemoveOp(bullet_id="b00001"))
    out = corroborate(ops, (), _playbook(helpful=5), Corroboration(), window_id="w1", at=1.0)
    assert out.ops == ops and out.pending == () and not out.held


def test_one_trace_stays_pending_and_k_distinct_traces_make_it_live():
    policy = Corroboration(min_traces=3)
    pb = _playbook()
    first = corroborate((_add("t1"),), (), pb, policy, window_id="w1", at=1.0)
    assert first.ops == () and first.held == {"pending": 1}
    (entry,) = first.pending
    assert entry.traces == ("t1",) and entry.op == "ADD" and first.changed == (entry.id,)
    second = corroborate((_add("t1"),), first.pending, pb, policy, window_id="w2", at=2.0)  # the same trace again
    assert second.ops == () and len(second.pending[0].teachers) == 1 and second.pending[0].windows == 2
    third = corroborate((_add("t2", "t3"),), second.pending, pb, policy, window_id="w3", at=3.0)
    (op,) = third.ops
    assert isinstance(op, AddOp) and set(op.sources) == {"t1", "t2", "t3"}
    assert third.pending == () and third.resolved == (entry.id,)


def test_a_window_whose_lesson_k_traces_taught_goes_live_at_once():
    out = corroborate((_add("t1", "t2"),), (), _playbook(), Corroboration(min_traces=2), window_id="w", at=0.0)
    assert len(out.ops) == 1 and out.pending == ()


def test_traces_of_one_producer_are_one_teacher():
    producers = {"t1": "bot", "t2": "bot", "t3": "bot", "t4": "alice"}
    policy = Corroboration(min_traces=2)
    out = corroborate((_add("t1", "t2", "t3"),), (), _playbook(), policy, window_id="w", at=0.0, producers=producers)
    assert out.ops == () and out.pending[0].producers == ("bot",)
    later = corroborate((_add("t4"),), out.pending, _playbook(), policy, window_id="w2", at=1.0, producers=producers)
    assert len(later.ops) == 1


def test_a_different_lesson_does_not_corroborate():
    policy = Corroboration(min_traces=2)
    first = corroborate((_add("t1"),), (), _playbook(), policy, window_id="w1", at=1.0)
    other = _add("t2", content="Scale every reported figure to thousands before comparing periods.")
    second = corroborate((other,), first.pending, _playbook(), policy, window_id="w2", at=2.0)
    assert second.ops == () and len(second.pending) == 2


def test_caps_per_trace_and_per_producer_count_their_refusals():
    ops = tuple(_add("t1", content=f"Lesson number {i} about a distinct formula family {i}.") for i in range(4))
    out = corroborate(ops, (), _playbook(), Corroboration(trace_cap=2), window_id="w", at=0.0)
    assert len(out.ops) == 2 and out.held == {"trace_cap": 2}
    producers = {f"t{i}": "bot" for i in range(4)}
    ops = tuple(_add(f"t{i}", content=f"Lesson number {i} about a distinct formula family {i}.") for i in range(4))
    out = corroborate(ops, (), _playbook(), Corroboration(producer_cap=1), window_id="w", at=0.0, producers=producers)
    assert len(out.ops) == 1 and out.held == {"producer_cap": 3}


def test_a_capped_source_comes_off_an_add_that_others_taught():
    ops = (_add("t1", content="First distinct lesson on margins."), _add("t1", "t2"))
    out = corroborate(ops, (), _playbook(), Corroboration(trace_cap=1), window_id="w", at=0.0)
    assert [op.sources for op in out.ops] == [("t1",), ("t2",)]  # type: ignore[union-attr]


def test_update_and_remove_of_an_established_bullet_are_held_like_an_add():
    policy = Corroboration(min_traces=2)
    fresh, settled = _playbook(helpful=0), _playbook(helpful=3)
    ops = (UpdateOp(bullet_id="b00001", content="Use gross margin, not net.", sources=("t1",)),)
    assert corroborate(ops, (), fresh, policy, window_id="w", at=0.0).ops == ops  # not established: as before
    held = corroborate(ops, (), settled, policy, window_id="w", at=0.0)
    assert held.ops == () and held.pending[0].op == "UPDATE" and held.pending[0].bullet_id == "b00001"
    again = (UpdateOp(bullet_id="b00001", content="Use gross margin, not net.", sources=("t2",)),)
    assert len(corroborate(again, held.pending, settled, policy, window_id="w2", at=1.0).ops) == 1
    removes = corroborate((RemoveOp(bullet_id="b00001"),), (), settled, policy, window_id="w", at=0.0)
    assert removes.ops == () and removes.pending[0].op == "REMOVE"
    pinned = _playbook(pinned=True)
    assert established(pinned, "b00001", policy) and not established(fresh, "b00001", policy)


def test_a_pending_change_of_a_bullet_that_is_gone_is_dropped():
    policy = Corroboration(min_traces=2)
    held = corroborate((RemoveOp(bullet_id="b00001"),), (), _playbook(helpful=3), policy, window_id="w", at=0.0)
    empty = Playbook(namespace="ns", version=2, next_id=2)
    out = corroborate((), held.pending, empty, policy, window_id="w2", at=1.0)
    assert out.pending == () and out.resolved == (held.pending[0].id,)


def test_the_pool_is_bounded_least_recently_supported_first():
    policy = Corroboration(min_traces=5, max_pending=2)
    pool: tuple = ()
    for i in range(3):
        pool = corroborate((_add(f"t{i}", content=f"Distinct lesson {i} on ratios."),), pool, _playbook(), policy,
                           window_id=f"w{i}", at=float(i)).pending  # fmt: skip
    assert [e.traces for e in pool] == [("t1",), ("t2",)]
    out = corroborate((_add("t9", content="Distinct lesson 9 on ratios."),), pool, _playbook(), policy,
                      window_id="w9", at=9.0)  # fmt: skip
    assert out.held == {"pending": 1, "expired": 1}


def test_harmful_tags_on_an_established_bullet_need_k_reflections():
    policy = Corroboration(min_traces=3)
    tags = {"b00001": (1, 2)}
    assert corroborate_tags(tags, _playbook(helpful=4), policy) == ({"b00001": (1, 0)}, 2)
    assert corroborate_tags({"b00001": (0, 3)}, _playbook(helpful=4), policy) == ({"b00001": (0, 3)}, 0)
    assert corroborate_tags(tags, _playbook(helpful=0), policy) == (tags, 0)
    assert corroborate_tags(tags, _playbook(helpful=4), Corroboration()) == (tags, 0)


def test_by_default_one_failed_run_cannot_mark_an_established_bullet_harmful():
    default = Corroboration()
    one, two = {"b00001": (0, 1)}, {"b00001": (0, 2)}
    assert corroborate_tags(one, _playbook(helpful=4), default) == ({"b00001": (0, 0)}, 1)
    assert corroborate_tags(one, _playbook(pinned=True), default) == ({"b00001": (0, 0)}, 1)
    assert corroborate_tags(two, _playbook(helpful=4), default) == (two, 0)  # two reflections agree
    assert corroborate_tags(one, _playbook(helpful=0), default) == (one, 0)  # not established: counts at once
    assert corroborate_tags(one, _playbook(helpful=4), Corroboration(harmful_tags=1)) == (one, 0)  # off


def test_harmful_tags_are_counted_per_producer_when_the_taggers_are_known():
    default, pb = Corroboration(), _playbook(helpful=4)
    two = {"b00001": (0, 2)}
    # two traces of one producer are one teacher: held, as one failed run is
    one_producer = {"t1": "mallory", "t2": "mallory"}
    taggers = {"b00001": ("t1", "t2")}
    assert corroborate_tags(two, pb, default, taggers=taggers, producers=one_producer) == ({"b00001": (0, 0)}, 2)
    # two producers, or traces that name none, are two teachers: the tags count
    two_producers = {"t1": "mallory", "t2": "alice"}
    assert corroborate_tags(two, pb, default, taggers=taggers, producers=two_producers) == (two, 0)
    assert corroborate_tags(two, pb, default, taggers=taggers) == (two, 0)
    # a bullet the taggers do not list counts one teacher per tag (a plan written before they were carried)
    assert corroborate_tags(two, pb, default, taggers={}, producers=one_producer) == (two, 0)
    # a bullet not yet established takes the tags at once, one per teacher
    assert corroborate_tags(two, _playbook(), default, taggers=taggers, producers=one_producer) == (
        {"b00001": (0, 1)},
        1,
    )
    assert corroborate_tags(two, _playbook(), default, taggers=taggers, producers=two_producers) == (two, 0)


def test_harmful_tags_that_count_count_once_per_teacher():
    default, pb = Corroboration(), _playbook(helpful=4)
    # ten failed runs of one producer beside one run of another: two teachers, two tags (not eleven)
    taggers = {"b00001": tuple(f"t{i}" for i in range(11))}
    producers = {**{f"t{i}": "mallory" for i in range(10)}, "t10": "alice"}
    eleven = {"b00001": (1, 11)}
    assert corroborate_tags(eleven, pb, default, taggers=taggers, producers=producers) == ({"b00001": (1, 2)}, 9)
    # traces that name no producer are a teacher each: every tag counts, as before
    assert corroborate_tags(eleven, pb, default, taggers=taggers) == (eleven, 0)
    # a bullet not yet established takes the tags at once, once per teacher as well
    assert corroborate_tags(eleven, _playbook(), default, taggers=taggers, producers=producers) == (
        {"b00001": (1, 2)},
        9,
    )
    assert corroborate_tags(eleven, _playbook(), default, taggers=taggers) == (eleven, 0)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        Corroboration(min_traces=0)
    with pytest.raises(ValueError):
        Corroboration(trace_cap=0)
    with pytest.raises(ValueError):
        Corroboration(harmful_tags=0)


def test_finish_ops_holds_an_uncorroborated_lesson_and_releases_it_when_corroborated():
    import asyncio

    from combee.engine import MethodConfig, finish_ops
    from combee.meter import Meter

    config = MethodConfig(corroboration=Corroboration(min_traces=2))
    meter = Meter()
    pb = _playbook()
    first = asyncio.run(finish_ops((_add("t1"),), pb, config, None, meter, window_id="w1", at=1.0))
    assert first.ops == () and first.corroborated is not None and meter.held == {"pending": 1}
    pool = first.corroborated.pending
    second = asyncio.run(finish_ops((_add("t2"),), pb, config, None, meter, pending=pool, window_id="w2", at=2.0))
    assert [op.sources for op in second.ops] == [("t1", "t2")]  # type: ignore[union-attr]
    assert second.corroborated is not None and second.corroborated.pending == ()
    plain = asyncio.run(finish_ops((_add("t1"),), pb, MethodConfig(), None, Meter(), window_id="w", at=0.0))
    assert len(plain.ops) == 1 and plain.corroborated is None


def test_settings_set_the_rules_and_a_namespace_may_override_k():
    from combee.settings import Settings
    from combee.wiring import method_config

    settings = Settings(corroborate_min_traces=2, corroborate_namespaces={"finance": 4}, corroborate_trace_cap=3)
    config = method_config(settings, "combee")
    assert config.corroboration_for("other") == Corroboration(min_traces=2, trace_cap=3)
    assert config.corroboration_for("finance") == Corroboration(min_traces=4, trace_cap=3)
    assert not method_config(Settings(), "combee").corroboration_for("x").active
