"""Words, numbers and specificity of a lesson's text (pure): shared by de-duplication and the playbook algebra."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

__all__ = ["STOP_WORDS", "content_words", "more_specific", "numbers_in", "words_of"]

_WORD_RE = re.compile(r"[a-z]+(?:'[a-z]+)?|\d+(?:[.,]\d+)*%?|%")

_NUMBER_WORDS = {
    # "one" is left out on purpose: "one-off", "one-time", "one of" carry no number.
    "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7", "eight": "8", "nine": "9",
    "ten": "10", "eleven": "11", "twelve": "12", "fifteen": "15", "twenty": "20", "thirty": "30", "fifty": "50",
    "hundred": "100", "half": "0.5", "twice": "x2", "double": "x2", "triple": "x3", "quarter": "0.25",
}  # fmt: skip

STOP_WORDS = frozenset(
    {
        "the",
        "a",
        "an",
        "of",
        "to",
        "in",
        "on",
        "for",
        "and",
        "or",
        "is",
        "are",
        "be",
        "by",
        "with",
        "as",
        "at",
        "from",
        "that",
        "this",
        "it",
        "its",
        "each",
        "every",
        "any",
        "all",
        "when",
    }
)


def words_of(text: str) -> list[str]:
    """Lower-case words and numbers of ``text``, accents folded (``non-GAAP`` stays one word)."""
    folded = unicodedata.normalize("NFKD", text)
    folded = "".join(c for c in folded if not unicodedata.combining(c)).casefold().replace("\u2019", "'")
    folded = folded.replace("non-gaap", "nongaap")
    return _WORD_RE.findall(folded)


def numbers_in(words: Sequence[str]) -> frozenset[str]:
    """The numbers stated by ``words`` (digits with separators dropped; number words as digits)."""
    out = set()
    for w in words:
        if w[0].isdigit():
            out.add(w.rstrip("%").replace(",", ""))
        elif w in _NUMBER_WORDS:
            out.add(_NUMBER_WORDS[w])
    return frozenset(out)


def content_words(text: str) -> frozenset[str]:
    """The words of ``text`` that carry content: no stop words, none of two letters or fewer (numbers kept, number
    words as digits), a plural's trailing ``s`` dropped (``years`` and ``year`` are one word)."""
    words = words_of(text)
    kept = {w for w in words if w[0].isdigit() or (w not in STOP_WORDS and len(w) > 2)}
    stems = {w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in kept}
    return frozenset(stems | numbers_in(words))


def _specificity(text: str) -> tuple[int, int, int]:
    words = words_of(text)
    content = {w for w in words if w not in STOP_WORDS and len(w) > 2}
    return (len(numbers_in(words)), len(content), len(text))


def more_specific(kept: str, other: str) -> str:
    """The more specific of two wordings of one lesson: more numbers, then more content words, then longer.

    A tie keeps ``kept`` (the older or earlier wording), so the choice is deterministic.
    """
    return other if _specificity(other) > _specificity(kept) else kept
