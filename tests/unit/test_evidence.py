"""combee.evidence: per applied operation, the traces that taught it, their lessons and what came of it."""

from __future__ import annotations

from combee.evidence import (
    CARRIED_WINDOWS,
    EVIDENCE_KEY,
    LESSON_CHARS,
    LESSONS_PER_OP,
    Explanation,
    carry_evidence,
    evidence_entry,
    explain_delta,
    parse_explanations,
    window_lessons,
)
from combee.models import AddOp, Bullet, Delta, DeltaOp, Insight, Playbook, Provenance, Reflection, RemoveOp, UpdateOp
from combee.playbook import ApplyPolicy, apply_delta

P0 = Provenance(window_id="ns/p0/0-9", version=1)
BEFORE = Playbook(
    namespace="ns",
    version=1,
    next_id=4,
    bullets=(
        Bullet(id="b00001", section="units", content="check the units of every figure", created=P0, updated=P0),
        Bullet(id="b00002", section="rounding", content="round at the end", created=P0, updated=P0),
        Bullet(id="b00003", section="sources", content="quote the source", created=P0, updated=P0),
    ),
)


def reflection(trace_id: str, *lessons: str) -> Reflection:
    return Reflection(
        trace_id=trace_id, base_version=1, insights=tuple(Insight(section="general", content=t) for t in lessons)
    )


LESSONS = window_lessons(
    [
        reflection("t1", "state the period of every rate", "unrelated: read the whole table first"),
        reflection("t2", "rates need their period stated"),
        reflection("t3", "round only at the very end of the computation"),
        reflection("t4", "citing the source is noise here"),
        reflection("t5", "units matter: check them"),
        reflection("t9"),  # taught nothing
    ]
)


def explain(proposed: list[DeltaOp], final: list[DeltaOp]) -> Explanation:
    after, _ = apply_delta(BEFORE, Delta(namespace="ns", window_id="ns/p0/10-19", base_version=1, ops=tuple(final)))
    return explain_delta(BEFORE, proposed, final, after, LESSONS)


def test_window_lessons_keeps_each_traces_insights_and_leaves_out_the_ones_that_taught_nothing() -> None:
    assert LESSONS["t1"] == ("state the period of every rate", "unrelated: read the whole table first")
    assert "t9" not in LESSONS
    long = window_lessons([reflection("t1", "x" * 500)])["t1"][0]
    assert len(long) == LESSON_CHARS and long.endswith("…")


def test_each_operation_names_its_own_traces_the_closest_lesson_and_what_it_did() -> None:
    add = AddOp(section="rates", content="state the period of a rate", sources=("t1", "t2"))
    change = UpdateOp(bullet_id="b00002", content="round only at the very end", sources=("t3",))
    remove = RemoveOp(bullet_id="b00003", sources=("t4",))
    confirm = UpdateOp(bullet_id="b00001", content="check the units of every figure", sources=("t5",))
    ops: list[DeltaOp] = [add, change, remove, confirm]
    got = explain(ops, ops)
    assert [(e.op, e.outcome, e.bullet_id, e.sources) for e in got.ops] == [
        ("ADD", "added", "b00004", ("t1", "t2")),
        ("UPDATE", "changed", "b00002", ("t3",)),
        ("REMOVE", "removed", "b00003", ("t4",)),
        ("UPDATE", "confirmed", "b00001", ("t5",)),
    ]
    # t1 stated two lessons: the one about rates is quoted, not the unrelated one
    assert [(x.trace_id, x.text) for x in got.ops[0].lessons] == [
        ("t1", "state the period of every rate"),
        ("t2", "rates need their period stated"),
    ]
    assert got.ops[2].lessons[0].text == "citing the source is noise here"
    assert got.for_bullet("b00002") == (got.ops[1],)


def test_an_add_folded_into_a_bullet_before_applying_is_merged_not_a_curators_update() -> None:
    proposed: list[DeltaOp] = [AddOp(section="units", content="check units", sources=("t5",))]
    folded: list[DeltaOp] = [UpdateOp(bullet_id="b00001", content="check the units of every figure", sources=("t5",))]
    (e,) = explain(proposed, folded).ops
    assert (e.op, e.outcome, e.bullet_id) == ("UPDATE", "merged", "b00001")


def test_an_add_the_apply_deduplicated_is_merged_into_the_older_bullet() -> None:
    dup = AddOp(section="rounding", content="Round at the end.", sources=("t3",))
    (e,) = explain([dup], [dup]).ops
    assert (e.op, e.outcome, e.bullet_id) == ("ADD", "merged", "b00002")


def test_an_add_the_budget_evicted_and_ops_on_missing_bullets_say_so() -> None:
    add = AddOp(section="rates", content="state the period of a rate", sources=("t1",))
    gone: list[DeltaOp] = [UpdateOp(bullet_id="b00099", content="x", sources=()), RemoveOp(bullet_id="b00098")]
    ops: list[DeltaOp] = [add, *gone]
    proven = BEFORE.model_copy(update={"bullets": tuple(b.model_copy(update={"helpful": 3}) for b in BEFORE.bullets)})
    policy = ApplyPolicy(max_bullets=3)  # full: the new bullet, helpful to no one yet, goes first
    after, _ = apply_delta(proven, Delta(namespace="ns", window_id="w", base_version=1, ops=tuple(ops)), policy)
    got = explain_delta(proven, ops, ops, after, LESSONS)
    assert [e.outcome for e in got.ops] == ["evicted", "missing", "missing"]


def test_lessons_per_operation_are_bounded_and_distinct_but_every_trace_id_is_kept() -> None:
    sources = tuple(f"t{i}" for i in range(20))
    many = {t: (f"lesson number {i}",) for i, t in enumerate(sources)} | {"t0": ("same",), "t1": ("same",)}
    add = AddOp(section="rates", content="lesson", sources=sources)
    after, _ = apply_delta(BEFORE, Delta(namespace="ns", window_id="w", base_version=1, ops=(add,)))
    (e,) = explain_delta(BEFORE, [add], [add], after, many).ops
    assert e.sources == sources
    assert len(e.lessons) == LESSONS_PER_OP
    assert [x.trace_id for x in e.lessons] == ["t0", "t2", "t3"]  # t1 said what t0 said


def test_evidence_round_trips_through_meta_and_malformed_entries_are_skipped() -> None:
    ops: list[DeltaOp] = [AddOp(section="rates", content="state the period", sources=("t1",))]
    got = explain(ops, ops)
    assert got.version == 2
    assert parse_explanations({EVIDENCE_KEY: evidence_entry(got)}) == (got,)
    assert parse_explanations({EVIDENCE_KEY: [{"version": 3, "ops": [{"op": "PATCH"}]}, *evidence_entry(got)]}) == (
        got,
    )
    assert parse_explanations({}) == () and parse_explanations(None) == ()
    assert parse_explanations({EVIDENCE_KEY: {"not": "a list"}}) == ()


def test_a_superseded_versions_evidence_is_carried_into_the_published_one_and_bounded() -> None:
    def meta(v: int) -> dict[str, object]:
        return {EVIDENCE_KEY: evidence_entry(Explanation(version=v))}

    carried = meta(1)
    for v in range(2, CARRIED_WINDOWS + 5):
        carried = carry_evidence(carried, meta(v))
    kept = [e.version for e in parse_explanations(carried)]
    assert kept == list(range(5, CARRIED_WINDOWS + 5))  # the newest windows, oldest first
    assert carry_evidence(None, meta(2)) == meta(2)
    assert carry_evidence(meta(1), {"bullets": 3}) == {"bullets": 3}
