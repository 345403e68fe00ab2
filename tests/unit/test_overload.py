"""The overload experiment's plan of variants (combee.tasks.overload): which reduces run, and leaving some out."""

from __future__ import annotations

import pytest

from combee.engine import Method, MethodConfig
from combee.tasks.overload import default_variants, without


def test_the_default_variants_are_the_issue_set_over_n_reflections() -> None:
    variants = default_variants(MethodConfig(p=2), 64)
    assert [v.name for v in variants] == [
        "naive-b8", "naive-b16", "naive-b32", "naive-b64",
        "combee-none-b64", "combee-section-b64", "combee-section-union-b64", "combee-section-union-p1-b64",
        "sequential",
    ]  # fmt: skip
    by_name = {v.name: v for v in variants}
    assert by_name["naive-b16"].config.method is Method.NAIVE and by_name["naive-b16"].batch == 16
    assert by_name["combee-section-b64"].config.shuffle_key == "section"
    assert by_name["combee-section-union-p1-b64"].config.p == 1
    assert by_name["sequential"].config.method is Method.SEQUENTIAL and by_name["sequential"].batch == 1


def test_naive_batches_above_n_are_dropped_and_n_is_added() -> None:
    names = [v.name for v in default_variants(MethodConfig(p=1), 20, (8, 16, 32))]
    assert names[:3] == ["naive-b8", "naive-b16", "naive-b20"]


def test_the_shapes_run_at_the_papers_p_unless_a_larger_one_is_set_and_section_union_at_p_1_too() -> None:
    # the default settings resolve p = 1 for section-union (combee.plan.DEFAULT_P): the shapes still run at 2
    for base, p in ((MethodConfig(p=1), 2), (MethodConfig(p=2), 2), (MethodConfig(p=3), 3)):
        by_name = {v.name: v.config.p for v in default_variants(base, 64)}
        assert by_name["combee-none-b64"] == by_name["combee-section-union-b64"] == p
        assert by_name["combee-section-union-p1-b64"] == 1


def test_without_leaves_out_the_named_variants_and_keeps_the_order() -> None:
    variants = default_variants(MethodConfig(p=2), 64)
    kept = without(variants, ("sequential", "naive-b32"))
    assert [v.name for v in kept] == [v.name for v in variants if v.name not in ("sequential", "naive-b32")]
    assert without(variants, ()) == variants


def test_without_names_an_unknown_variant_and_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"no overload variant named sequentail; the variants are naive-b8, "):
        without(default_variants(MethodConfig(), 64), ("sequentail",))


def _doc(skip: tuple[str, ...]) -> dict[str, object]:
    variant = {
        "variant": "naive-b8", "batch": 8, "windows": 8, "entries": 12, "distinct_lessons": 9,
        "bullets_per_lesson": 12 / 9, "playbook_tokens": 700, "calls": 8, "tokens": 40_000, "wall_s": 755.3,
        "critical_path_s": 750.0, "copies_folded": 0, "refused_ops": {"records_the_run": 1},
        "routing_classes": [], "phase": {"loadavg_at_end": [24.71, 24.26, 22.56]},
    }  # fmt: skip
    reflections = {"wall_s": 10.0, "parsed": 8, "unparsed": 0, "with_insights": 7, "insights": 9,
                   "refused_insights": {}, "trimmed_sentences": {}, "labels_as_written": {"formulas": 9}}  # fmt: skip
    return {"task": "formula", "simulated": False, "model": "local", "endpoint": "http://x/v1", "n_train": 8,
            "reflections": reflections, "variants": [variant], "options": {"skip": list(skip)}}  # fmt: skip


def test_the_table_says_each_variants_load_and_which_variants_were_left_out() -> None:
    from combee.tasks.overload_report import markdown

    text = markdown(_doc(("sequential",)))
    row = next(line for line in text.splitlines() if line.startswith("| naive-b8 "))
    assert "| 755.3 | 750.0 | 24.7 | 0 | 1 | 0 | – |" in row  # ... copies folded, ops refused, held, classes
    assert "Variants left out of this run (`--skip`): sequential." in text
    assert "left out" not in markdown(_doc(()))


def test_a_critical_path_nobody_measured_is_shown_as_unknown_not_zero() -> None:
    from combee.tasks.overload_report import markdown

    doc = _doc(())
    doc["variants"][0]["critical_path_s"] = None  # type: ignore[index]
    row = next(line for line in markdown(doc).splitlines() if line.startswith("| naive-b8 "))
    assert "| 755.3 | – | 24.7 |" in row


def test_with_corroboration_on_the_report_says_k_and_counts_what_was_held() -> None:
    from combee.tasks.overload_report import markdown

    doc = _doc(())
    assert "Corroboration on" not in markdown(doc)
    doc["method_config"] = {"corroboration": {"min_traces": 2}}
    doc["variants"][0]["held"] = {"pending": 5}  # type: ignore[index]
    text = markdown(doc)
    assert "a lesson goes live only when 2 distinct traces taught it" in text
    row = next(line for line in text.splitlines() if line.startswith("| naive-b8 "))
    assert row.endswith("| 0 | 1 | 5 | – |")
