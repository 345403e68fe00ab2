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
    assert "combee-section-union-p1-b20" not in names  # p is already 1


def test_without_leaves_out_the_named_variants_and_keeps_the_order() -> None:
    variants = default_variants(MethodConfig(p=2), 64)
    kept = without(variants, ("sequential", "naive-b32"))
    assert [v.name for v in kept] == [v.name for v in variants if v.name not in ("sequential", "naive-b32")]
    assert without(variants, ()) == variants


def test_without_names_an_unknown_variant_and_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"no overload variant named sequentail; the variants are naive-b8, "):
        without(default_variants(MethodConfig(), 64), ("sequentail",))
