"""Seeded prose: the plain-text answer of a request that asks for no JSON."""

from __future__ import annotations

import math
import random

__all__ = ["WORDS", "prose"]


_VOCABULARY = """
    the a an of to in for on with by from as at into over under after before between across within without
    result value table column row report ledger entry account balance total amount rate share price cost
    revenue margin ratio period quarter year month growth change increase decrease check verify compare
    compute derive apply update keep drop merge note rule step plan answer question context detail insight
    example case pattern error issue reason source field record list item group level order number figure
    first second next last each every other same different specific general exact careful simple clear
    data model agent prompt tool call output input format schema section summary evidence signal trace
    is are was were be has have had can should must may will does do not only also then when if because
    so but and or while where which that this these those it its their our we they one two three several
"""


WORDS: tuple[str, ...] = tuple(_VOCABULARY.split())


def prose(rng: random.Random, words: int | None = None) -> str:
    """Deterministic filler sentences (6–16 words each); ``words`` defaults to an rng-drawn length."""
    n = words if words is not None else max(8, min(400, int(rng.lognormvariate(math.log(60.0), 0.6))))
    sentences: list[str] = []
    remaining = n
    while remaining > 0:
        k = min(remaining, rng.randint(6, 16))
        chosen = rng.choices(WORDS, k=k)
        chosen[0] = chosen[0].capitalize()
        sentences.append(" ".join(chosen) + ".")
        remaining -= k
    return " ".join(sentences)
