"""Laws of the playbook algebra (STYLE.md principle 2), checked with hypothesis."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from combee.models import AddOp, BulletTag, Delta, Playbook, Reflection, RemoveOp, Tag, UpdateOp
from combee.playbook import (
    ApplyPolicy,
    PlaybookState,
    TokenJaccard,
    apply_delta,
    apply_window,
    count_tags,
    harmful_taggers,
    normalise_text,
    playbook_tokens,
    render_prompt,
    settling_mark,
)

bullet_ids = st.integers(1, 30).map(lambda n: f"b{n:05d}")
texts = st.text(alphabet="abcdef XYZ.,!", min_size=1, max_size=40).filter(lambda s: s.strip())
sections = st.sampled_from(["formulas", "pitfalls", "general", "Units & Scaling"])
add_ops = st.builds(AddOp, section=sections, content=texts)
update_ops = st.builds(UpdateOp, bullet_id=bullet_ids, content=texts)
remove_ops = st.builds(RemoveOp, bullet_id=bullet_ids)
ops = st.lists(st.one_of(add_ops, add_ops, update_ops, remove_ops), max_size=25)
tags = st.lists(st.builds(BulletTag, bullet_id=bullet_ids, tag=st.sampled_from(list(Tag))), max_size=6)
reflections = st.lists(
    st.builds(Reflection, trace_id=st.just("t"), base_version=st.just(0), tags=tags.map(tuple)), max_size=12
)

# Every property here is a law of the algebra, not of time: no deadline, so a loaded machine cannot fail one.
LAW = settings(deadline=None)


def delta(ops_, window="w1", tag_counts=None, version=0):
    return Delta(namespace="ns", window_id=window, base_version=version, ops=tuple(ops_), tag_counts=tag_counts or {})


def grown(seed_ops):
    pb, _ = apply_delta(Playbook(namespace="ns"), delta(seed_ops, "w0"))
    return pb


@LAW
@given(reflections, st.randoms())
def test_tag_counting_is_order_independent(refs, rnd):
    shuffled = list(refs)
    rnd.shuffle(shuffled)
    assert count_tags(refs) == count_tags(shuffled)


@LAW
@given(reflections)
def test_tag_counts_are_bounded_by_reflections(refs):
    for helpful, harmful in count_tags(refs).values():
        assert 0 <= helpful + harmful <= len(refs)


@LAW
@given(reflections)
def test_harmful_taggers_are_the_traces_behind_the_harmful_counts(refs):
    # one trace per reflection: each bullet's taggers are as many as its harmful tags, whatever the order
    distinct = [r.model_copy(update={"trace_id": f"t{i}"}) for i, r in enumerate(refs)]
    taggers = harmful_taggers(distinct)
    assert {b: len(ts) for b, ts in taggers.items()} == {b: h for b, (_, h) in count_tags(distinct).items() if h}
    assert harmful_taggers(list(reversed(distinct))) == taggers


@LAW
@given(st.lists(add_ops, max_size=20))
def test_empty_delta_only_bumps_version(seed_ops):
    pb = grown(seed_ops)
    after, stats = apply_delta(pb, delta([], "w1", version=pb.version))
    assert after.version == pb.version + 1
    assert after.bullets == pb.bullets and after.next_id == pb.next_id
    assert stats.added == stats.updated == stats.removed == 0


@LAW
@given(st.lists(add_ops, max_size=20), ops)
def test_apply_is_deterministic(seed_ops, ops_):
    pb = grown(seed_ops)
    assert apply_delta(pb, delta(ops_)) == apply_delta(pb, delta(ops_))


@LAW
@given(st.lists(add_ops, max_size=20), ops)
def test_same_window_twice_equals_once(seed_ops, ops_):
    state = PlaybookState(playbook=grown(seed_ops))
    once = apply_window(state, delta(ops_, "w-same"))
    twice = apply_window(once, delta(ops_, "w-same"))
    assert twice == once
    assert once.playbook.version == state.playbook.version + 1


def test_watermark_catches_reformed_duplicates():
    state = PlaybookState(playbook=Playbook(namespace="ns"))
    s1 = apply_window(state, delta([AddOp(section="a", content="x")], "ns/p0/0-9"), source="p0", last_offset=9)
    s2 = apply_window(s1, delta([AddOp(section="a", content="y")], "ns/p0/5-9"), source="p0", last_offset=9)
    assert s2 == s1


@given(st.lists(add_ops, max_size=20), ops)
@settings(max_examples=200, deadline=None)
def test_invariants_after_apply(seed_ops, ops_):
    pb = grown(seed_ops)
    after, stats = apply_delta(pb, delta(ops_))
    keys = [normalise_text(b.content) for b in after.bullets]
    assert len(keys) == len(set(keys))  # no duplicates survive
    ids = [int(b.id[1:]) for b in after.bullets]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert after.next_id >= pb.next_id
    assert all(int(b.id[1:]) < after.next_id for b in after.bullets)  # ids come from the counter
    missing = sum(1 for op in ops_ if isinstance(op, UpdateOp | RemoveOp))
    assert stats.missing_update + stats.missing_remove <= missing


def test_update_and_remove_of_missing_bullets_are_counted_noops():
    pb = grown([AddOp(section="s", content="one")])
    after, stats = apply_delta(pb, delta([UpdateOp(bullet_id="b00099", content="x"), RemoveOp(bullet_id="b00077")]))
    assert [b.content for b in after.bullets] == ["one"]
    assert stats.missing_update == 1 and stats.missing_remove == 1


def test_fresh_ids_are_never_reused():
    pb = grown([AddOp(section="s", content="one"), AddOp(section="s", content="two")])
    pb2, _ = apply_delta(pb, delta([RemoveOp(bullet_id="b00002")], "w1"))
    pb3, _ = apply_delta(pb2, delta([AddOp(section="s", content="three")], "w2"))
    assert [b.id for b in pb3.bullets] == ["b00001", "b00003"]


def test_counters_and_provenance():
    pb = grown([AddOp(section="s", content="one")])
    pb2, stats = apply_delta(
        pb, delta([UpdateOp(bullet_id="b00001", content="one, sharper")], "w7", {"b00001": (3, 1)})
    )
    b = pb2.bullets[0]
    assert (b.helpful, b.harmful) == (3, 1) and stats.tags_applied == 1
    assert b.created.window_id == "w0" and b.updated.window_id == "w7" and b.updated.version == 2


def test_duplicates_merge_counters_into_the_oldest():
    pb = grown([AddOp(section="s", content="Check the Units!")])
    pb2, _ = apply_delta(pb, delta([], "w1", {"b00001": (2, 0)}))
    pb3, stats = apply_delta(pb2, delta([AddOp(section="other", content="check the units")], "w2"))
    assert [b.id for b in pb3.bullets] == ["b00001"] and stats.deduplicated == 1
    assert pb3.bullets[0].helpful == 2


def test_pluggable_similarity():
    policy = ApplyPolicy(dedup=TokenJaccard(0.6))
    pb, _ = apply_delta(Playbook(namespace="ns"), delta([AddOp(section="s", content="use the diluted share count")]))
    pb2, stats = apply_delta(pb, delta([AddOp(section="s", content="always use the diluted share count")]), policy)
    assert len(pb2.bullets) == 1 and stats.deduplicated == 1


def test_budget_evicts_worst_first():
    rnd = random.Random(3)
    ops_ = [AddOp(section="s", content=f"lesson {i} " + "x" * rnd.randint(20, 80)) for i in range(60)]
    pb = grown(ops_)
    scores = {b.id: (i % 5, i % 3) for i, b in enumerate(pb.bullets)}
    pb, _ = apply_delta(pb, delta([], "w1", scores))
    budget = playbook_tokens(pb) // 2
    after, stats = apply_delta(pb, delta([], "w2"), ApplyPolicy(token_budget=budget))
    assert playbook_tokens(after) <= budget and stats.evicted > 0
    kept = {b.id for b in after.bullets}
    evicted = [b for b in pb.bullets if b.id not in kept]
    assert max(b.score for b in evicted) <= min(b.score for b in after.bullets)


def test_render_is_deterministic_and_grouped():
    pb = grown([AddOp(section="b_sec", content="two"), AddOp(section="a_sec", content="one")])
    text = render_prompt(pb)
    assert text == render_prompt(pb)
    assert text.index("## b sec") < text.index("## a sec")  # first-appearance order
    assert "- [b00001] two" in text and "version 1" in text


def _without_footer(text: str) -> str:
    body, footer = text.rstrip("\n").rsplit("\n\n", 1)
    assert footer.startswith("(Playbook version ")
    return body


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(add_ops, min_size=1, max_size=3), min_size=1, max_size=40))
def test_adding_bullets_appends_to_the_rendering_until_the_mark_moves(steps):
    # Prefix caching: between two settling marks, version t's text (without its version footer) is a prefix
    # of version t+1's when t+1 only adds bullets.
    pb = Playbook(namespace="ns")
    for i, step in enumerate(steps):
        after, stats = apply_delta(pb, delta(step, f"w{i}", version=pb.version))
        if stats.deduplicated == 0 and settling_mark(after.next_id) == settling_mark(pb.next_id):
            assert _without_footer(render_prompt(after)).startswith(_without_footer(render_prompt(pb)))
        pb = after


def test_nothing_before_the_bullets_changes_with_the_version():
    a = grown([AddOp(section="s", content="one")])
    b, _ = apply_delta(a, delta([], "w1", version=a.version))
    text_a, text_b = render_prompt(a), render_prompt(b)
    assert text_a != text_b and _without_footer(text_a) == _without_footer(text_b)
    assert text_b.endswith("\n\n(Playbook version 2.)\n") and text_b.count("version") == 1


def test_settling_mark_is_a_monotone_ladder_leaving_a_fifth_at_most_unsettled():
    marks = [settling_mark(n) for n in range(1, 5000)]
    assert marks == sorted(marks) and settling_mark(15) == 15 and settling_mark(16) == 16 == settling_mark(19)
    assert len(set(marks[15:])) <= 30  # re-groupings over 5,000 ids
    assert all(n - m <= n // 5 + 1 for n, m in zip(range(16, 5000), marks[15:], strict=True))


def test_newer_bullets_follow_the_settled_ones_under_their_section():
    ops_ = [AddOp(section=["a_sec", "b_sec"][i % 2], content=f"lesson {i}") for i in range(18)]
    pb = grown(ops_)  # next_id 19: ids 1..15 settled, 16..18 newer
    text = render_prompt(pb)
    settled, newer = text.split("Newer lessons, in the order they were learned (a section may appear again):")
    assert settled.index("## a sec") < settled.index("## b sec") and "[b00016]" not in settled
    assert (
        newer.index("## b sec\n- [b00016]") < newer.index("## a sec\n- [b00017]") < newer.index("## b sec\n- [b00018]")
    )
    grouped = render_prompt(pb, grouped=True)
    assert "Newer lessons" not in grouped and grouped.count("## a sec") == 1


@settings(max_examples=30, deadline=None)
@given(st.lists(add_ops, min_size=20, max_size=60), st.integers(64, 400))
def test_the_rendering_with_newer_bullets_fits_the_budget(seed_ops, budget):
    pb = grown(seed_ops[:16])
    pb, _ = apply_delta(pb, delta(seed_ops[16:], "w1", version=pb.version), ApplyPolicy(token_budget=budget))
    assert playbook_tokens(pb) <= budget


def test_section_cap_folds_into_general():
    pb = grown([AddOp(section=f"s{i}", content=f"c{i}") for i in range(30)])
    assert len(pb.sections) == 25 and "general" in pb.sections
