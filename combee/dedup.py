"""Semantic de-duplication: when two lessons say the same thing (pure; vectors are computed at the edge).

Two texts are *near duplicates* when

* their normalised texts are equal (the exact rule, which needs no vectors), or
* both have a vector, the cosine of their vectors is at least ``threshold``, and the **guard** finds no
  contradiction between them: no difference in negation, in the numbers they state, or on any contrast axis
  (include/exclude, add/subtract, opening/closing, thousands/millions, ...).

The guard exists because an embedding model cannot tell "exclude the one-off items" from "include the
one-off items": MiniLM scores such hard negatives up to ~0.86 while true paraphrases average ~0.83, so no
threshold separates them. The threshold is calibrated on the labelled pairs in
``tests/unit/fixtures/paraphrases.jsonl`` (``tests/unit/test_dedup_calibration.py``); every hard negative there
is refused by the guard alone, whatever its cosine.

Where it acts (:func:`fold_near_duplicates`): an ADD that is a near duplicate of an existing bullet becomes a
merge into it (dropped, or an UPDATE of that bullet when its own wording is the more specific one); near
duplicate ADDs within one delta collapse into one, keeping the more specific wording. The rewritten delta is
what gets applied and logged, so a replay of the log needs no vectors and gives the same playbook. The same
rule also implements the :class:`combee.playbook.Deduplicator` port (:class:`SemanticDeduplicator`), with
counters summed into the kept bullet.

Everything here is deterministic: inputs are visited in order, ties go to the earlier item, cosines are
rounded to 4 decimals before comparison so that the last bits of a float never decide.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from operator import mul

from combee.models import LIMITS, AddOp, Bullet, DeltaOp, RemoveOp, UpdateOp
from combee.playbook import normalise_text
from combee.wording import STOP_WORDS as _STOP_WORDS
from combee.wording import more_specific, numbers_in, words_of

__all__ = [
    "DEFAULT_THRESHOLD",
    "FoldStats",
    "SemanticDeduplicator",
    "Similarity",
    "Vector",
    "conflict",
    "cosine",
    "fold_copies",
    "fold_near_duplicates",
    "more_specific",
    "unit",
]

Vector = tuple[float, ...]

DEFAULT_THRESHOLD = 0.72
"""Calibrated on the committed labelled set with all-MiniLM-L6-v2 (see the module docstring)."""


def unit(values: Iterable[float]) -> Vector:
    """``values`` scaled to length 1 (a zero vector stays zero)."""
    v = tuple(float(x) for x in values)
    norm = math.sqrt(sum(x * x for x in v))
    return tuple(x / norm for x in v) if norm > 0 else v


def cosine(a: Vector, b: Vector) -> float:
    """Cosine of two unit vectors, rounded to 4 decimals (0.0 when the lengths differ)."""
    if len(a) != len(b) or not a:
        return 0.0
    return round(sum(map(mul, a, b)), 4)


# --- the guard ------------------------------------------------------------------------------------------

_NEGATIONS_WORDS = frozenset(
    {
        "not",
        "no",
        "never",
        "without",
        "cannot",
        "can't",
        "don't",
        "doesn't",
        "isn't",
        "aren't",
        "shouldn't",
        "mustn't",
        "won't",
        "neither",
        "nor",
        "none",
        "nothing",
        "dont",
        "doesnt",
        "isnt",
        "cant",
        "shouldnt",
    }
)


def _forms(*words: str) -> frozenset[str]:
    """Inflected forms of English words (regular inflections; enough for a guard)."""
    out: set[str] = set()
    for w in words:
        out.add(w)
        if w.endswith("e"):
            out.update({w + "s", w + "d", w[:-1] + "ing"})
        elif w.endswith("y") and len(w) > 3 and w[-2] not in "aeiou":
            out.update({w[:-1] + "ies", w[:-1] + "ied", w + "ing"})
        else:
            out.update({w + "s", w + "es", w + "ed", w + "ing"})
    return frozenset(out)


# Contrast axes: each is a tuple of classes of words that exclude one another. Two texts conflict on an axis
# when both use words of the axis and the classes they use differ.
_CONTRASTS: tuple[tuple[frozenset[str], ...], ...] = (
    (_forms("include", "inclusive", "keep", "retain"), _forms("exclude", "exclusive", "omit", "ignore",
                                                                        "drop", "skip", "disregard", "leave")),
    (_forms("add", "plus", "sum"), _forms("subtract", "minus", "deduct")),
    (_forms("multiply", "times"), _forms("divide", "split")),
    (_forms("increase", "raise", "rise", "higher", "grow", "up"), _forms("decrease", "reduce", "lower", "fall",
                                                                          "shrink", "down")),
    (_forms("before", "prior", "pre", "earlier", "preceding"), _forms("after", "post", "later", "following")),
    (_forms("opening", "beginning", "start", "starting"), _forms("closing", "ending", "end", "final")),
    (_forms("final", "last", "end"), _forms("every", "each", "all", "intermediate")),
    (_forms("row"), _forms("column")),
    (_forms("first", "earliest", "oldest"), _forms("last", "latest", "newest")),
    (_forms("gross"), _forms("net")),
    (_forms("positive"), _forms("negative")),
    (_forms("debit"), _forms("credit")),
    (_forms("income", "revenue", "profit", "gain"), _forms("expense", "cost", "loss")),
    (_forms("asset"), _forms("liability")),
    (_forms("maximum", "max", "highest", "largest", "most"), _forms("minimum", "min", "lowest", "smallest",
                                                                     "least")),
    (_forms("above", "over", "more", "greater", "larger", "exceed"), _forms("below", "under", "less", "fewer",
                                                                             "smaller")),
    (_forms("basic"), _forms("diluted")),
    (_forms("original", "reported"), _forms("restated", "revised", "adjusted")),
    (_forms("gaap"), _forms("nongaap", "non")),
    (_forms("nominal"), _forms("real")),
    (_forms("numerator"), _forms("denominator")),
    (_forms("fiscal"), _forms("calendar")),
    (_forms("current", "present"), _forms("previous", "past")),
    (_forms("always", "must"), _forms("optional", "sometimes", "may")),
    (_forms("buy", "purchase"), _forms("sell", "sale")),
    (_forms("annual", "annually", "yearly", "year"), _forms("quarter", "quarterly"), _forms("month", "monthly"),
     _forms("week", "weekly"), _forms("day", "daily")),
    (_forms("thousand"), _forms("million"), _forms("billion")),
    (_forms("percent", "percentage", "%"), _forms("decimal", "fraction", "ratio")),
    (_forms("stock"), _forms("flow")),
    (_forms("cash"), _forms("sheet"), _forms("footnote")),  # which statement: cash flow, balance sheet, notes
    (_forms("average", "mean"), _forms("median"), _forms("spot", "end", "closing")),
    (_forms("absolute"), _forms("relative")),
    (_forms("ascending"), _forms("descending")),
)  # fmt: skip

# Axes where a text naming both sides says which to prefer by the order it names them in ("use the restated
# figure when both original and restated appear"): a swap of that order is another lesson. Elsewhere, naming
# both sides in another order is just another sentence structure, not a contradiction.
_ORDERED = frozenset(
    axis
    for axis in _CONTRASTS
    if any(w in axis[0] for w in ("original", "basic", "gaap", "row", "opening", "first", "gross"))
)


_NEGATIONS = _NEGATIONS_WORDS | _forms("lack", "miss", "missing", "absent")
_NEGATIVE_PREFIXES = ("un", "non", "in", "im", "ir", "il", "dis")

# Words a rewording may swap one for another without changing the lesson (the substitution rule's allowlist).
_SYNONYMS: tuple[frozenset[str], ...] = (
    _forms("check", "verify", "confirm", "double", "re", "read", "reread", "recheck", "ensure", "make", "sure",
           "review", "validate", "inspect", "examine", "look", "see", "always", "again", "once", "more", "carefully"),
    frozenset({"each", "every", "all", "any"}),
    _forms("figure", "value", "number", "amount", "item", "entry"),
    _forms("use", "take", "apply", "pick", "choose", "prefer"),
    _forms("answer", "response", "reply", "result", "output"),
    _forms("question", "task", "prompt", "request"),
    _forms("compute", "calculate", "work", "derive", "determine"),
    _forms("always", "first"),
)  # fmt: skip

_EXCLUSIONS = _forms("exclude", "omit", "ignore", "drop", "skip", "disregard", "leave")

# Words that point at what a lesson contrasts with ("X, not Y", "X rather than Y", "X since Y omits it"):
# two texts using one of them must say the same thing after it — a swap of the two sides keeps every word.
_SCOPE_MARKERS = frozenset({"not", "than", "instead", "over", "unless", "except", "since", "because"})
_SCOPE_FILLERS = frozenset({"one", "ones", "alone", "them", "just", "simply"})
_CLAUSE_RE = re.compile(r"[,.;:()!?]+")


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def _scopes(text: str) -> dict[str, frozenset[str]]:
    """For each scope marker of ``text``: the first three content words after it, in its clause."""
    out: dict[str, frozenset[str]] = {}
    for clause in _CLAUSE_RE.split(text):
        words = words_of(clause)
        for i, w in enumerate(words):
            if w in _SCOPE_MARKERS and w not in out:
                after: list[str] = []
                for x in words[i + 1 :]:
                    if x in _SCOPE_MARKERS or len(after) == 3:
                        break
                    if x not in _STOP_WORDS and x not in _SCOPE_FILLERS:
                        after.append(_stem(x))
                out[w] = frozenset(after)
    return out


def _first_uses(words: Sequence[str], axis: tuple[frozenset[str], ...]) -> tuple[int, ...]:
    """The classes of ``axis`` in the order ``words`` first uses them (a swap of sides changes it)."""
    order: dict[int, None] = {}
    for w in words:
        for i, cls in enumerate(axis):
            if w in cls:
                order.setdefault(i, None)
    return tuple(order)


def _negated(words: Sequence[str], other: set[str]) -> bool:
    """A negation word, or a prefixed negative ("unaudited", "non-recurring") whose base the other text uses."""
    if any(w in _NEGATIONS for w in words):
        return True
    stems = {_stem_base(w) for w in other}
    for w in words:
        for prefix in _NEGATIVE_PREFIXES:
            base = w[len(prefix) :]
            if w.startswith(prefix) and len(base) >= 4 and w not in other and _stem_base(base) in stems:
                return True
    return False


def _stem_base(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _substitution(wa: Sequence[str], wb: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The differing middle spans of two word sequences that share everything else (None if they differ more).

    "count only completed transactions" / "count only pending transactions" → (("completed",), ("pending",)).
    """
    i = 0
    while i < min(len(wa), len(wb)) and wa[i] == wb[i]:
        i += 1
    j = 0
    while j < min(len(wa), len(wb)) - i and wa[len(wa) - 1 - j] == wb[len(wb) - 1 - j]:
        j += 1
    da, db = tuple(wa[i : len(wa) - j]), tuple(wb[i : len(wb) - j])
    if not da or not db or len(da) > 2 or len(db) > 2 or i + j < 2:
        return None
    return da, db


def _interchangeable(da: Sequence[str], db: Sequence[str]) -> bool:
    """Both spans are words of one synonym class (check/verify/confirm, each/every, figure/value, ...)."""
    if numbers_in(da) and numbers_in(da) == numbers_in(db) and len(da) == len(db) == 1:
        return True  # "two" / "2"
    return any(
        all(w in cls or w in _STOP_WORDS for w in da) and all(w in cls or w in _STOP_WORDS for w in db)
        for cls in _SYNONYMS
    )


@lru_cache(maxsize=65_536)
def conflict(a: str, b: str) -> str | None:
    """Why ``a`` and ``b`` must not be merged however similar they look (None when nothing contradicts).

    Refuses a pair when exactly one of them is negated (a negation word, or a negative prefix on a word the
    other uses: "audited"/"unaudited"), or speaks of leaving something out; when both state numbers and the
    numbers differ; when the two are the same sentence with one or two words swapped for others that are not
    known synonyms ("only completed" / "only pending" — the shape of a one-fact change); when a contrast
    marker ("not", "rather than", "unless", "since", ...) is followed by different words in the two and those
    words changed sides; or when they take different sides of a contrast axis (include/exclude,
    opening/closing, final/every step, ...). Symmetric.
    """
    wa, wb = words_of(a), words_of(b)
    sa, sb = set(wa), set(wb)
    if _negated(wa, sb) != _negated(wb, sa):
        return "negation"
    na, nb = numbers_in(wa), numbers_in(wb)
    if na and nb and na != nb:
        return "numbers"
    if bool(sa & _EXCLUSIONS) != bool(sb & _EXCLUSIONS):
        return "exclusion"
    sub = _substitution(wa, wb)
    if sub is not None and not _interchangeable(*sub):
        return "substitution:" + " ".join(sub[0]) + "/" + " ".join(sub[1])
    scopes_b = _scopes(b)
    for marker, scope in _scopes(a).items():
        other = scopes_b.get(marker)
        if other is None or not scope or not other or scope == other:
            continue
        moved = (scope - other) & {_stem(w) for w in wb} or (other - scope) & {_stem(w) for w in wa}
        if moved or len(scope & other) < 0.5 * min(len(scope), len(other)):
            return f"scope:{marker}"
    for axis in _CONTRASTS:
        ca = frozenset(i for i, cls in enumerate(axis) if sa & cls)
        cb = frozenset(i for i, cls in enumerate(axis) if sb & cls)
        swapped = len(ca) > 1 and axis in _ORDERED and _first_uses(wa, axis) != _first_uses(wb, axis)
        if ca and cb and (ca != cb or swapped):
            return "contrast:" + "/".join(min(axis[i], key=lambda w: (len(w), w)) for i in sorted(ca | cb))
    return None


# --- the rule over vectors ------------------------------------------------------------------------------

_key = lru_cache(maxsize=65_536)(normalise_text)


@dataclass(frozen=True)
class Similarity:
    """The near-duplicate rule over a table of vectors (normalised text → unit vector). Pure.

    A text with no vector (none was computed, or the embedder was unavailable) is compared by the exact rule
    only, so a missing vector can make the result less thorough, never wrong.
    """

    vectors: Mapping[str, Vector] = field(default_factory=dict)
    threshold: float = DEFAULT_THRESHOLD

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError("threshold must be in (0, 1]")

    def score(self, a: str, b: str) -> float | None:
        """Cosine of two texts' vectors (1.0 for equal normalised texts; None when a vector is missing)."""
        ka, kb = _key(a), _key(b)
        if ka == kb:
            return 1.0
        va, vb = self.vectors.get(ka), self.vectors.get(kb)
        if va is None or vb is None:
            return None
        return cosine(va, vb)

    def near(self, a: str, b: str) -> bool:
        """True when ``a`` and ``b`` say the same thing (symmetric)."""
        if _key(a) == _key(b):
            return True
        s = self.score(a, b)
        return s is not None and s >= self.threshold and conflict(a, b) is None

    def best_match(self, text: str, candidates: Sequence[tuple[str, str]]) -> str | None:
        """The key of the candidate ``(key, text)`` nearest to ``text`` among its near duplicates, if any.

        Highest cosine wins (an exact match counts as 1.0); ties go to the earlier candidate. Same decisions
        as :meth:`near`, with the guard consulted only above the threshold.
        """
        ka = _key(text)
        va = self.vectors.get(ka)
        best = -1.0
        found: str | None = None
        for key, other in candidates:
            kb = _key(other)
            if ka == kb:
                s = 1.0
            else:
                vb = self.vectors.get(kb)
                if va is None or vb is None:
                    continue
                s = cosine(va, vb)
                if s < self.threshold or s <= best or conflict(text, other) is not None:
                    continue
            if s > best:
                best, found = s, key
        return found


@dataclass(frozen=True)
class SemanticDeduplicator:
    """The :class:`combee.playbook.Deduplicator` port over a :class:`Similarity` (pure).

    A fresh bullet that is a near duplicate of an older kept one is mapped to it (the most similar one);
    :func:`combee.playbook.apply_delta` then sums the counters and keeps the more specific wording.
    """

    similarity: Similarity

    def duplicates(self, bullets: Sequence[Bullet], fresh: set[str]) -> dict[str, str]:
        dropped: dict[str, str] = {}
        kept: list[Bullet] = []
        for b in bullets:
            pool = kept if b.id in fresh else [k for k in kept if k.id in fresh]
            match = self.similarity.best_match(b.content, [(k.id, k.content) for k in pool])
            if match is None:
                kept.append(b)
            else:
                dropped[b.id] = match
        return dropped


@dataclass
class FoldStats:
    """What :func:`fold_near_duplicates` did: ADDs merged into existing bullets / into earlier ADDs."""

    into_bullets: int = 0
    into_adds: int = 0
    reworded: int = 0  # merges that kept the incoming (more specific) wording
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (merged text, kept text) for logs and reports

    @property
    def merged(self) -> int:
        return self.into_bullets + self.into_adds


def fold_near_duplicates(
    ops: Sequence[DeltaOp],
    bullets: Sequence[Bullet],
    similarity: Similarity,
    *,
    against_bullets: bool = True,
) -> tuple[tuple[DeltaOp, ...], FoldStats]:
    """Rewrite ``ops`` so that no ADD restates an existing bullet or an earlier ADD (pure, deterministic).

    * An ADD near a bullet of ``bullets`` (one not removed or updated by ``ops``) is merged into it: dropped
      when the bullet's wording is at least as specific, else turned into an UPDATE of that bullet with the
      ADD's wording. With ``against_bullets=False`` (inside the reduce, where the merge prompt already shows
      the playbook) only ADDs among themselves are folded.
    * An ADD near an earlier ADD of ``ops`` is folded into it; the earlier one takes the more specific wording
      and keeps its position and section.

    UPDATE and REMOVE operations pass through unchanged and in order.
    """
    stats = FoldStats()
    touched = {op.bullet_id for op in ops if isinstance(op, UpdateOp | RemoveOp)}
    targets = [(b.id, b.content) for b in bullets if b.id not in touched] if against_bullets else []
    out: list[DeltaOp | None] = []
    adds: list[tuple[int, AddOp]] = []  # (position in out, current op)
    updates: dict[str, int] = {}  # bullet id -> position in out of the UPDATE a fold created
    contents = dict(targets)
    for op in ops:
        if not isinstance(op, AddOp):
            out.append(op)
            continue
        into_bullet = similarity.best_match(op.content, targets) if targets else None
        if into_bullet is not None:
            current = contents[into_bullet]
            chosen = more_specific(current, op.content)
            stats.into_bullets += 1
            stats.pairs.append((op.content, current))
            if chosen != current:
                stats.reworded += 1
                contents[into_bullet] = chosen
            if chosen == current and not op.sources and into_bullet not in updates:
                continue  # the same lesson, said less specifically, and no trace to credit: dropped
            # An UPDATE with the bullet's own wording only cites: the ADD's traces taught the bullet again.
            earlier_update = out[updates[into_bullet]] if into_bullet in updates else None
            cited = (*(earlier_update.sources if earlier_update is not None else ()), *op.sources)
            new = UpdateOp(bullet_id=into_bullet, content=chosen, sources=tuple(dict.fromkeys(cited)))
            if into_bullet in updates:
                out[updates[into_bullet]] = new
            else:
                updates[into_bullet] = len(out)
                out.append(new)
            continue
        earlier = similarity.best_match(op.content, [(str(i), a.content) for i, (_, a) in enumerate(adds)])
        if earlier is not None:
            pos, first = adds[int(earlier)]
            chosen = more_specific(first.content, op.content)
            stats.into_adds += 1
            stats.pairs.append((op.content, first.content))
            if chosen != first.content:
                stats.reworded += 1
            cited = tuple(dict.fromkeys((*first.sources, *op.sources)))[: LIMITS.sources_per_op]
            folded = AddOp(section=first.section, content=chosen, sources=cited)
            adds[int(earlier)] = (pos, folded)
            out[pos] = folded
            continue
        adds.append((len(out), op))
        out.append(op)
    return tuple(op for op in out if op is not None), stats


COPY_COSINE = 0.5
"""Cosine at or above which two ADDs citing nested sets of traces are taken for copies of one lesson."""

COPY_JACCARD = 0.3
"""The same for word sets, where a vector is missing."""


def _copy_score(similarity: Similarity | None, a: str, b: str) -> tuple[float, float]:
    """(score, its threshold) for :func:`fold_copies`: cosine where both vectors exist, else word Jaccard."""
    score = similarity.score(a, b) if similarity is not None else None
    if score is not None:
        return score, COPY_COSINE
    wa, wb = set(words_of(a)), set(words_of(b))
    union = wa | wb
    return (len(wa & wb) / len(union) if union else 1.0), COPY_JACCARD


def fold_copies(ops: Sequence[DeltaOp], similarity: Similarity | None = None) -> tuple[tuple[DeltaOp, ...], int]:
    """Fold the copies that the augmented shuffle makes of one lesson when partials are united without a
    merge call (pure, deterministic).

    A reflection duplicated p times reaches p curator groups, and each may write the same lesson in its own
    words. An ADD is taken for a copy of an earlier ADD when the traces one cites are a subset of the other's
    (both come from the same reflections) and their wordings are alike (:data:`COPY_COSINE`, or
    :data:`COPY_JACCARD` without vectors: far below the near-duplicate threshold, because sharing the source
    is already most of the evidence). The earlier ADD keeps its place and section, takes the more specific
    wording and cites both sets of traces. Returns the operations and how many were folded.
    """
    out: list[DeltaOp] = []
    adds: list[int] = []  # positions in out of the ADDs kept
    folded = 0
    for op in ops:
        if not isinstance(op, AddOp) or not op.sources:
            out.append(op)
            continue
        mine = set(op.sources)
        best: tuple[float, int] | None = None
        for pos in adds:
            kept = out[pos]
            assert isinstance(kept, AddOp)
            theirs = set(kept.sources)
            if not (mine <= theirs or theirs <= mine):
                continue
            score, threshold = _copy_score(similarity, op.content, kept.content)
            if score >= threshold and (best is None or score > best[0]):
                best = (score, pos)
        if best is None:
            adds.append(len(out))
            out.append(op)
            continue
        kept = out[best[1]]
        assert isinstance(kept, AddOp)
        cited = tuple(dict.fromkeys((*kept.sources, *op.sources)))[: LIMITS.sources_per_op]
        out[best[1]] = AddOp(section=kept.section, content=more_specific(kept.content, op.content), sources=cited)
        folded += 1
    return tuple(out), folded


def texts_of(ops: Iterable[DeltaOp], bullets: Iterable[Bullet] = ()) -> list[str]:
    """Every lesson text a fold over ``ops`` and ``bullets`` compares (for the edge to embed), in order."""
    seen: dict[str, None] = {}
    for b in bullets:
        seen.setdefault(b.content, None)
    for op in ops:
        if isinstance(op, AddOp | UpdateOp):
            seen.setdefault(op.content, None)
    return list(seen)
