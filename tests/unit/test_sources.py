"""Which traces taught a bullet: sources through curate, merge, union, de-duplication and apply; and the folding
of the augmented shuffle's copies (combee/playbook.py, combee/dedup.py, combee/prompts/parse.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from combee.dedup import fold_copies
from combee.models import LIMITS, AddOp, Delta, Playbook, UpdateOp
from combee.playbook import apply_delta, unite_ops
from combee.prompts.parse import MergeAnswer, Proposal, read_operations, resolve_merge
from combee.quality import bloat, clusters, within_budget


def _apply(playbook: Playbook, *ops: AddOp | UpdateOp, window: str = "w") -> Playbook:
    return apply_delta(playbook, Delta(namespace="ns", window_id=window, base_version=playbook.version, ops=ops))[0]


def test_a_curator_answer_cites_its_reflections_and_they_become_the_ops_trace_ids() -> None:
    text = (
        '{"operations": [{"op": "ADD", "section": "new: Tags", "content": "Use X for Y.", "from": ["r2", "r1", "r2"]}]}'
    )
    ops = read_operations(text, bullet_ids=(), sections=("answer_format",), refs={"r1": "t-a", "r2": "t-b"}).value
    assert ops == (AddOp(section="tags", content="Use X for Y.", sources=("t-b", "t-a")),)


def test_an_operation_citing_no_or_unknown_reflections_is_kept_with_what_it_cites_of_the_shown() -> None:
    # beyond the schema (a model without a grammar): the lesson stays, its provenance is what can be read
    text = ('{"operations": [{"op": "ADD", "section": "a", "content": "One."},'
            ' {"op": "ADD", "section": "Some Label", "content": "Two.", "from": ["r9", "r1"]}]}')  # fmt: skip
    parsed = read_operations(text, bullet_ids=(), sections=("a",), refs={"r1": "t1"})
    assert [(op.section, op.sources) for op in parsed.value] == [("a", ()), ("some_label", ("t1",))]
    assert parsed.invalid == ()


def test_a_combined_merge_operation_cites_the_traces_of_every_proposal_it_combines() -> None:
    proposals = [Proposal("p1", AddOp(section="s", content="A.", sources=("t1",))),
                 Proposal("p2", AddOp(section="s", content="A too.", sources=("t2", "t1"))),
                 Proposal("p3", AddOp(section="s", content="B.", sources=("t3",)))]  # fmt: skip
    answer = MergeAnswer(keep=("p3",), combine=((("p1", "p2"), AddOp(section="s", content="A, combined.")),))
    ops, unknown, _ = resolve_merge(proposals, answer)
    assert unknown == 0
    assert [(op.content, op.sources) for op in ops] == [("A, combined.", ("t1", "t2")), ("B.", ("t3",))]


def test_uniting_drops_exact_duplicates_but_keeps_their_traces() -> None:
    a = AddOp(section="s", content="Use X.", sources=("t1",))
    b = AddOp(section="s", content="use x", sources=("t2",))
    assert unite_ops([[a], [b]]) == (a.model_copy(update={"sources": ("t1", "t2")}),)


def test_apply_records_the_traces_on_the_bullet_and_a_same_wording_update_only_cites() -> None:
    pb = _apply(Playbook(namespace="ns"), AddOp(section="s", content="Use X.", sources=("t1", "t2")))
    b = pb.bullets[0]
    assert (b.sources, b.support, b.updated.version) == (("t1", "t2"), 2, 1)
    pb = _apply(pb, UpdateOp(bullet_id=b.id, content="Use X.", sources=("t2", "t3")), window="w2")
    b = pb.bullets[0]
    assert (b.sources, b.support, b.updated.version, b.content) == (("t1", "t2", "t3"), 3, 1, "Use X.")


def test_a_bullet_keeps_its_most_recent_sources_and_counts_them_all() -> None:
    n = LIMITS.sources_per_bullet + 5
    cited = tuple(f"t{i}" for i in range(n))
    pb = _apply(Playbook(namespace="ns"), AddOp(section="s", content="Use X.", sources=cited))
    b = pb.bullets[0]
    assert b.support == n and b.sources == tuple(f"t{i}" for i in range(5, n))


def test_duplicates_merged_at_apply_pool_their_traces() -> None:
    pb = _apply(Playbook(namespace="ns"), AddOp(section="s", content="Use X.", sources=("t1",)))
    pb = _apply(pb, AddOp(section="s", content="use x.", sources=("t2", "t1")), window="w2")
    assert len(pb.bullets) == 1 and pb.bullets[0].sources == ("t1", "t2") and pb.bullets[0].support == 2


def test_copies_of_one_lesson_from_two_groups_fold_into_the_first_with_both_groups_traces() -> None:
    ops = (AddOp(section="s", content="Tag a revolving credit draw as LineOfCredit.", sources=("t1", "t2")),
           AddOp(section="s", content="Use ConcentrationRiskPercentage1 for revenue shares.", sources=("t3",)),
           AddOp(section="s", content="Tag revolving credit draws as LineOfCredit.", sources=("t1",)))  # fmt: skip
    folded, n = fold_copies(ops)
    assert n == 1 and len(folded) == 2
    assert folded[0].sources == ("t1", "t2") and folded[1] == ops[1]


def test_alike_lessons_from_unrelated_traces_or_unlike_lessons_from_one_trace_are_not_copies() -> None:
    other = (AddOp(section="s", content="Tag a revolving credit draw as LineOfCredit.", sources=("t1",)),
             AddOp(section="s", content="Tag revolving credit draws as LineOfCredit.", sources=("t9",)))  # fmt: skip
    assert fold_copies(other) == (other, 0)
    unlike = (
        AddOp(section="s", content="Tag a revolving credit draw as LineOfCredit.", sources=("t1",)),
        AddOp(section="s", content="Percentages of revenue are ConcentrationRiskPercentage1.", sources=("t1",)),
    )
    assert fold_copies(unlike) == (unlike, 0)


@given(st.lists(st.sampled_from(["t1", "t2", "t3"]), min_size=1, max_size=3))
def test_folding_copies_never_loses_a_cited_trace(sources: list[str]) -> None:
    ops = (AddOp(section="s", content="Use the quick ratio.", sources=tuple(sources)),
           AddOp(section="s", content="Use the quick ratio here.", sources=(sources[0],)))  # fmt: skip
    folded, _ = fold_copies(ops)
    assert {s for op in folded for s in op.sources} == set(sources)


def test_distinct_lessons_are_single_link_clusters_and_bloat_counts_them() -> None:
    def same(a: str, b: str) -> bool:
        return a.split()[0] == b.split()[0]

    assert clusters(["x 1", "y 1", "x 2", "z", "y 2"], same) == [[0, 2], [1, 4], [3]]
    pb = _apply(Playbook(namespace="ns"), *(AddOp(section="s", content=t) for t in ["x one", "x two", "y three"]))
    size = bloat(pb, same)
    assert (size.entries, size.distinct_lessons, size.bullets_per_lesson) == (3, 2, 1.5)


def test_within_budget_keeps_the_best_scored_bullets_that_fit() -> None:
    ops = (AddOp(section="s", content=f"Lesson {i} " + "word " * 40) for i in range(20))
    pb = _apply(Playbook(namespace="ns"), *ops)
    fitted = within_budget(pb, 400)
    assert 0 < len(fitted.bullets) < len(pb.bullets) and fitted.version == pb.version
    assert within_budget(pb, 100_000) == pb
