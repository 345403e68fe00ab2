"""Size figures and retention at equal prompt size (combee.bench.size), on hand-made playbooks."""

from __future__ import annotations

from combee.bench.size import FIXED_BUDGET, retention_at, score, size_figures
from combee.models import Bullet, Playbook, Provenance
from combee.playbook import playbook_tokens
from combee.sim.world import generic_tip, insight_content

PROV = Provenance(window_id="w0", version=1)
KEYS = [f"FX-{i:04d}" for i in range(20)]


def playbook(contents: list[str], helpful: dict[int, int] | None = None) -> Playbook:
    helpful = helpful or {}
    bullets = tuple(
        Bullet(id=f"b{n:05d}", section="formulas", content=text, helpful=helpful.get(n, 0), created=PROV, updated=PROV)
        for n, text in enumerate(contents, start=1)
    )
    return Playbook(namespace="bench", version=1, bullets=bullets, next_id=len(bullets) + 1)


def deduplicated() -> Playbook:
    return playbook([insight_content(k, 0) for k in KEYS])


def with_restatements(copies: int = 3) -> Playbook:
    """Every lesson of :func:`deduplicated` followed by ``copies - 1`` restatements of it in other words."""
    return playbook([insight_content(k, v) for k in KEYS for v in range(copies)])


def test_restatements_crowd_lessons_out_under_a_budget_the_deduplicated_playbook_fits() -> None:
    dedup, dup = deduplicated(), with_restatements()
    budget = 2 * playbook_tokens(dedup)
    assert playbook_tokens(dup) > budget  # the budget binds for the redundant playbook only
    assert retention_at(dedup, KEYS, 10**6) == retention_at(dup, KEYS, 10**6) == 1.0
    assert retention_at(dedup, KEYS, budget) == 1.0
    assert retention_at(dup, KEYS, budget) < 0.8


def test_the_budget_keeps_what_the_apply_rule_keeps_best_scored_bullets() -> None:
    book = playbook([insight_content(k, 0) for k in KEYS], helpful={20: 3})  # the last bullet, KEYS[-1]
    assert 0.0 < retention_at(book, KEYS, 250) < 0.5
    assert retention_at(book, [KEYS[-1]], 250) == 1.0  # evicted last: the best helpful − harmful record
    assert retention_at(book, [KEYS[0]], 250) == 1.0  # among equals the newest bullets go first ...
    assert retention_at(book, [KEYS[-2]], 250) == 0.0  # ... so the one before the best-scored one is gone


def test_size_figures_count_bullets_lessons_and_prompt_tokens() -> None:
    dup = with_restatements(3)
    extra = playbook([*(b.content for b in dup.bullets), generic_tip(0), insight_content("FX-0999", 0)])
    figures = size_figures(extra, KEYS)
    assert figures.entries == 62
    assert figures.distinct_lessons == 20  # a generic tip and a key outside the ground truth teach no lesson
    assert figures.bullets_per_lesson == 62 / 20
    assert figures.prompt_tokens == playbook_tokens(extra)


def test_score_reports_plain_and_equal_size_retention_with_the_size() -> None:
    dup = with_restatements()
    seq_tokens = playbook_tokens(deduplicated())
    doc = score(dup, KEYS, seq_tokens)
    assert doc["insight_retention"] == 1.0
    assert doc["retention_at_seq_size"] == retention_at(dup, KEYS, seq_tokens) < 1.0
    assert doc["retention_at_2000"] == retention_at(dup, KEYS, FIXED_BUDGET)
    assert doc["seq_size_budget"] == seq_tokens
    assert (doc["playbook_entries"], doc["distinct_lessons"], doc["bullets_per_lesson"]) == (60, 20, 3.0)
    assert doc["playbook_tokens"] == playbook_tokens(dup)
    assert score(dup, KEYS, None)["retention_at_seq_size"] is None
