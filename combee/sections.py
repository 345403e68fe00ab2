"""Sections: the labels a lesson is filed under, offered to the model as a closed list, and canonicalised.

A reflector or curator files each lesson under a section. Left free, a real model names them by topic and
varies the name ("Net Present Value (NPV)", "CAPM Formula", ``capm`` beside ``capm_formula``), which splits
the keyed shuffle into one routing class per string and the playbook into one heading per spelling. So:

* the model is offered the namespace's sections (:func:`section_choices`: a default set, then the playbook's
  own) as an ``enum``, plus one bounded way to open a new one: ``"new: <name>"`` (:data:`NEW_SECTION_PATTERN`);
* every label is canonicalised before routing and before it is applied (:func:`canonical_sections`): its
  slug, then the nearest offered section when one is similar enough (cosine of the labels' embeddings at or
  above a threshold), else a new section while the playbook has room for one (``LIMITS.sections``), else the
  nearest offered section whatever its similarity.

Everything here is pure: the similarity of two labels is a function handed in (the edge computes vectors).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from combee.models import LIMITS, normalise_section

__all__ = [
    "DEFAULT_SECTIONS",
    "NEW_SECTION_PATTERN",
    "NEW_SECTION_PREFIX",
    "SECTION_THRESHOLD",
    "canonical_sections",
    "label_of",
    "section_choices",
]


DEFAULT_SECTIONS: tuple[str, ...] = (
    "strategies",
    "domain_knowledge",
    "formulas_and_calculations",
    "common_mistakes",
    "answer_format",
    "verification",
)
"""The sections every namespace starts with. Generic on purpose: a namespace's own sections are added as
lessons are filed under new ones (``COMBEE_SECTIONS`` replaces this list)."""


NEW_SECTION_PREFIX = "new:"

NEW_SECTION_PATTERN = r"^new: [A-Za-z][A-Za-z0-9 &/_-]{0,39}$"
"""How a model opens a section that is not offered: ``new: <name>``, a short name of plain characters."""

_NEW_RE = re.compile(NEW_SECTION_PATTERN)


SECTION_THRESHOLD = 0.6
"""Cosine of two section labels' embeddings (all-MiniLM-L6-v2, the labels' words) at or above which they name
the same section. Measured on labels the local model wrote (tests/unit/test_sections.py): "capm" / "capm
formula" 0.66, "formula understanding" / "formulas and calculations" 0.73 and "domain knowledge" / "domain
facts" 0.76 are above it; "ratios" / "returns" 0.28, "cash flow calculation" / "formulas and calculations"
0.41 and "common mistakes" / "verification" 0.28 below. Some spellings of one topic fall below it too
("npv" / "net present value npv" 0.56): such a label opens its own section while there is room, the cheaper
error (one more heading) than filing lessons of different topics together."""


def section_choices(defaults: Sequence[str], existing: Iterable[str], limit: int = LIMITS.sections) -> tuple[str, ...]:
    """The sections offered to the model: ``defaults`` then the playbook's ``existing`` ones, slugged, without
    repeats, at most ``limit``."""
    out: dict[str, None] = {}
    for name in (*defaults, *existing):
        out.setdefault(normalise_section(name), None)
    return tuple(out)[:limit]


def label_of(raw: str, choices: Sequence[str]) -> str | None:
    """A model's section label as the schema admits it: one of ``choices`` (returned as is) or ``new: <name>``
    (returned as the name's slug); None for anything else."""
    if raw in choices:
        return raw
    if _NEW_RE.fullmatch(raw):
        return normalise_section(raw[len(NEW_SECTION_PREFIX) :])
    return None


def canonical_sections(
    labels: Iterable[str],
    known: Sequence[str],
    similarity: Callable[[str, str], float | None],
    *,
    threshold: float = SECTION_THRESHOLD,
    limit: int = LIMITS.sections,
) -> Mapping[str, str]:
    """Map every label (already a slug) to its canonical section. Deterministic: labels are decided in sorted
    order, so a new section opened by one label is offered to the next.

    A label in ``known`` stays. Otherwise the most similar known section at or above ``threshold`` (the first
    in ``known`` order on a tie), else the label opens a new section if fewer than ``limit`` exist, else the
    most similar known section whatever its score (the first known one when no score is available).
    ``similarity(a, b)`` returns a cosine, or None when it cannot tell.
    """
    sections = list(dict.fromkeys(known))
    out: dict[str, str] = {}
    for label in sorted(set(labels)):
        if label in sections:
            out[label] = label
            continue
        scored = [(s, score) for s in sections if (score := similarity(label, s)) is not None]
        best = max(scored, key=lambda item: item[1], default=None)
        if best is not None and best[1] >= threshold:
            out[label] = best[0]
        elif len(sections) < limit:
            sections.append(label)
            out[label] = label
        else:
            out[label] = best[0] if best is not None else sections[0]
    return out
