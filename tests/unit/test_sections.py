"""Sections offered to the model and canonicalised (combee/sections.py), on labels a real model wrote."""

from __future__ import annotations

import asyncio

import pytest

from combee.models import LIMITS
from combee.sections import (
    DEFAULT_SECTIONS,
    SECTION_THRESHOLD,
    canonical_sections,
    label_of,
    section_choices,
)

# Section labels the local model (Qwen2.5-Coder-1.5B-Instruct) wrote for Formula lessons before the labels
# were a closed list (tests/unit/fixtures/real_model/ and the run of docs/benchmarks.md), slugged.
RECORDED = ["net_present_value_npv", "capm_formula", "capm", "formula_understanding", "cash_flow_calculation",
            "discount_rate_application", "returns", "ratios"]  # fmt: skip


def test_the_choices_are_the_defaults_then_the_playbooks_own_slugged_without_repeats_and_bounded() -> None:
    assert section_choices(["B", "a"], ["a", "C d", "b"]) == ("b", "a", "c_d")
    many = [f"s{i}" for i in range(40)]
    assert len(section_choices(DEFAULT_SECTIONS, many)) == LIMITS.sections


def test_a_label_is_an_offered_section_or_new_colon_name() -> None:
    offered = ("answer_format", "domain_knowledge")
    assert label_of("answer_format", offered) == "answer_format"
    assert label_of("new: XBRL Tag Choice", offered) == "xbrl_tag_choice"
    for bad in ("Answer Format", "new:", "new: ", "tag choice", "new: " + "x" * 60, "new: 9lives"):
        assert label_of(bad, offered) is None, bad


def _table(scores: dict[frozenset[str], float]):  # type: ignore[no-untyped-def]
    return lambda a, b: scores.get(frozenset((a, b)))


def test_a_known_label_stays_a_similar_one_maps_a_different_one_opens_a_section() -> None:
    known = ["formulas_and_calculations", "common_mistakes"]
    sim = _table({frozenset(("formula_understanding", "formulas_and_calculations")): 0.73,
                  frozenset(("ratios", "formulas_and_calculations")): 0.2})  # fmt: skip
    out = canonical_sections(["common_mistakes", "formula_understanding", "ratios"], known, sim, threshold=0.6)
    assert out == {
        "common_mistakes": "common_mistakes",
        "formula_understanding": "formulas_and_calculations",
        "ratios": "ratios",
    }


def test_a_section_opened_by_one_label_is_offered_to_the_next_in_sorted_order() -> None:
    sim = _table({frozenset(("capm", "capm_formula")): 0.66})
    assert canonical_sections(["capm_formula", "capm"], [], sim, threshold=0.6) == {
        "capm": "capm",
        "capm_formula": "capm",
    }


def test_past_the_section_limit_a_label_joins_the_nearest_section_whatever_its_score() -> None:
    known = ["a", "b"]
    sim = _table({frozenset(("c", "a")): 0.1, frozenset(("c", "b")): 0.3})
    assert canonical_sections(["c"], known, sim, threshold=0.6, limit=2) == {"c": "b"}
    assert canonical_sections(["c"], known, lambda a, b: None, threshold=0.6, limit=2) == {"c": "a"}


def test_the_mapping_does_not_depend_on_the_order_labels_arrive_in() -> None:
    sim = _table({frozenset(("capm", "capm_formula")): 0.66, frozenset(("npv", "capm")): 0.1})
    first = canonical_sections(["npv", "capm_formula", "capm"], ["x"], sim, threshold=0.6)
    assert first == canonical_sections(["capm", "npv", "capm_formula"], ["x"], sim, threshold=0.6)


def test_with_the_real_embedder_spellings_of_one_topic_merge_and_topics_stay_apart() -> None:
    from combee.embed_local import MiniLMEmbedder, local_embedder_missing
    from combee.embeddings import NearDuplicates

    missing = local_embedder_missing()
    if missing:
        pytest.skip(f"the local embedder is not installed ({missing})")
    dedup = NearDuplicates(MiniLMEmbedder())
    words = [x.replace("_", " ") for x in (*RECORDED, *DEFAULT_SECTIONS)]
    sim = asyncio.run(dedup.similarity(words))

    def score(a: str, b: str) -> float | None:
        return sim.score(a.replace("_", " "), b.replace("_", " "))

    for a, b in [("capm", "capm_formula"), ("formula_understanding", "formulas_and_calculations")]:
        assert (score(a, b) or 0.0) >= SECTION_THRESHOLD, (a, b, score(a, b))
    apart = [
        ("ratios", "returns"),
        ("cash_flow_calculation", "formulas_and_calculations"),
        ("common_mistakes", "verification"),
        ("discount_rate_application", "formulas_and_calculations"),
    ]
    for a, b in apart:
        assert (score(a, b) or 1.0) < SECTION_THRESHOLD, (a, b, score(a, b))
    mapping = canonical_sections(RECORDED, DEFAULT_SECTIONS, score)
    assert mapping["capm_formula"] == "capm"
    assert mapping["formula_understanding"] == "formulas_and_calculations"
    assert mapping["ratios"] == "ratios" and mapping["returns"] == "returns"
