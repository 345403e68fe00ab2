"""Semantic de-duplication (pure): the guard, the rule over vectors, folding deltas, the Deduplicator port."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from combee.dedup import (
    DEFAULT_THRESHOLD,
    SemanticDeduplicator,
    Similarity,
    conflict,
    cosine,
    fold_near_duplicates,
    unit,
)
from combee.models import AddOp, Bullet, Delta, Playbook, Provenance, RemoveOp, UpdateOp
from combee.playbook import ApplyPolicy, apply_delta, normalise_text
from combee.wording import more_specific

FIXTURES = Path(__file__).parent / "fixtures/dedup"
PAIRS = [json.loads(line) for name in ("pairs.jsonl", "heldout.jsonl") for line in (FIXTURES / name).open()]
PROV = Provenance(window_id="w0", version=1)


def bullet(n: int, content: str, helpful: int = 0, harmful: int = 0) -> Bullet:
    return Bullet(
        id=f"b{n:05d}", section="verification", content=content, helpful=helpful, harmful=harmful,
        created=PROV, updated=PROV,
    )  # fmt: skip


def similarity(groups: list[list[str]], threshold: float = DEFAULT_THRESHOLD) -> Similarity:
    """Vectors where the texts of one group are identical and groups are orthogonal."""
    dim = len(groups)
    vectors = {}
    for g, texts in enumerate(groups):
        for t in texts:
            vectors[normalise_text(t)] = unit(1.0 if i == g else 0.0 for i in range(dim))
    return Similarity(vectors, threshold)


def test_the_guard_refuses_every_hard_negative_of_the_labelled_set_whatever_the_cosine() -> None:
    hard = [p for p in PAIRS if p["kind"] == "hard_negative"]
    assert len(hard) >= 55
    missed = [(p["a"], p["b"]) for p in hard if conflict(p["a"], p["b"]) is None]
    assert missed == []
    # ... so even identical vectors cannot merge them
    for p in hard:
        assert not similarity([[p["a"], p["b"]]]).near(p["a"], p["b"])


def test_the_guard_lets_most_paraphrases_through() -> None:
    para = [p for p in PAIRS if p["kind"] == "paraphrase"]
    refused = [p for p in para if conflict(p["a"], p["b"]) is not None]
    assert len(refused) <= len(para) // 10


@given(st.sampled_from(PAIRS), st.booleans())
def test_the_guard_is_symmetric(pair: dict, swap: bool) -> None:
    a, b = (pair["b"], pair["a"]) if swap else (pair["a"], pair["b"])
    assert (conflict(a, b) is None) == (conflict(b, a) is None)


def test_guard_examples() -> None:
    assert conflict("Exclude the one-off items.", "Include the one-off items.")
    assert conflict("Round to 2 decimals.", "Round to 4 decimals.") == "numbers"
    assert conflict("Round to two decimals.", "Round to 2 decimals.") is None
    assert conflict("Use the filing date, not the fiscal-year end.", "Use the fiscal-year end, not the filing date.")
    assert conflict("Retry the call.", "Do not retry the call.") == "negation"
    assert conflict("Confirm the sign of each value.", "Re-read the sign of each value.") is None
    assert conflict("Prefer the audited table.", "Prefer the unaudited table.") == "negation"
    assert conflict("Count only completed orders.", "Count only pending orders.") == "substitution:completed/pending"
    assert conflict("Verify the units of every figure.", "Confirm the units of every figure.") is None
    assert conflict("Use operating income, not net income.", "Use net income, not operating income.") == "scope:not"
    # rule keys of the simulator are numbers: two different rules never merge
    assert conflict("Exclude one-off items (rule FX-0042).", "Exclude one-off items (rule FX-0017).") == "numbers"


def test_exact_match_needs_no_vectors_and_a_missing_vector_never_merges() -> None:
    sim = Similarity({})
    assert sim.near("Check the units.", "check the UNITS")
    assert not sim.near("Check the units.", "Verify the units.")
    assert sim.score("a b", "c d") is None


def test_cosine_and_threshold() -> None:
    a, b = unit((1.0, 0.0)), unit((0.8, 0.6))
    assert cosine(a, b) == 0.8
    assert Similarity({"x y": a, "x z": b}, threshold=0.8).near("x y", "x z")
    assert not Similarity({"x y": a, "x z": b}, threshold=0.81).near("x y", "x z")


def test_more_specific_keeps_numbers_then_content_and_breaks_ties_to_the_kept_one() -> None:
    assert more_specific("Round at the end.", "Round to 2 decimals at the end.") == "Round to 2 decimals at the end."
    assert more_specific("Check units.", "Check the units of every figure.") == "Check the units of every figure."
    assert more_specific("Check the units.", "Check all units.") == "Check the units."


def test_an_add_close_to_a_bullet_folds_into_it_keeping_the_more_specific_wording() -> None:
    old = bullet(1, "Confirm the sign.", helpful=3)
    new = "Confirm the sign of each value in the table."
    sim = similarity([[old.content, new, "Confirm sign."]])
    ops, stats = fold_near_duplicates([AddOp(section="verification", content=new)], [old], sim)
    assert ops == (UpdateOp(bullet_id=old.id, content=new),)
    assert (stats.into_bullets, stats.reworded) == (1, 1)
    # the less specific restatement is just dropped
    ops, stats = fold_near_duplicates([AddOp(section="verification", content="Confirm sign.")], [old], sim)
    assert ops == () and stats.into_bullets == 1


def test_near_duplicate_adds_collapse_into_the_first_and_others_pass_through() -> None:
    a, b, c = "Verify the units.", "Double-check the units of every figure.", "Check which period is asked."
    sim = similarity([[a, b], [c]])
    ops = [
        AddOp(section="s", content=a),
        RemoveOp(bullet_id="b00009"),
        AddOp(section="t", content=c),
        AddOp(section="u", content=b),
    ]
    folded, stats = fold_near_duplicates(ops, [], sim)
    assert folded == (AddOp(section="s", content=b), RemoveOp(bullet_id="b00009"), AddOp(section="t", content=c))
    assert stats.into_adds == 1


def test_folding_skips_bullets_the_delta_updates_or_removes_and_can_leave_bullets_alone() -> None:
    old = bullet(1, "Confirm the sign.")
    sim = similarity([[old.content, "Confirm signs."]])
    ops = [RemoveOp(bullet_id=old.id), AddOp(section="v", content="Confirm signs.")]
    assert fold_near_duplicates(ops, [old], sim)[0] == tuple(ops)
    add = [AddOp(section="v", content="Confirm signs.")]
    assert fold_near_duplicates(add, [old], sim, against_bullets=False)[0] == tuple(add)


@given(st.permutations(list(range(6))))
def test_folding_is_deterministic_and_never_grows_a_delta(order: list[int]) -> None:
    texts = [
        "Verify the units.",
        "Confirm the units.",
        "Check units twice.",
        "Check the period.",
        "Re-check period.",
        "X",
    ]
    sim = similarity([[texts[0], texts[1], texts[2]], [texts[3], texts[4]], [texts[5]]])
    ops = [AddOp(section="s", content=texts[i]) for i in order]
    once, _ = fold_near_duplicates(ops, [], sim)
    assert once == fold_near_duplicates(ops, [], sim)[0]
    assert len(once) == 3  # one per group
    assert fold_near_duplicates(once, [], sim)[0] == once  # idempotent


def test_the_deduplicator_port_sums_counters_and_keeps_the_more_specific_wording() -> None:
    old = bullet(1, "Confirm the sign.", helpful=4, harmful=1)
    pb = Playbook(namespace="ns", version=1, bullets=(old,), next_id=2)
    new = "Confirm the sign of each value."
    policy = ApplyPolicy(dedup=SemanticDeduplicator(similarity([[old.content, new]])))
    delta = Delta(namespace="ns", window_id="w1", base_version=1, ops=(AddOp(section="v", content=new),))
    after, stats = apply_delta(pb, delta, policy)
    assert stats.deduplicated == 1
    assert [(b.id, b.content, b.helpful, b.harmful) for b in after.bullets] == [("b00001", new, 4, 1)]
