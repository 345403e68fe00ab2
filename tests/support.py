"""Small helpers shared by the integration tests and the fault suite."""

from __future__ import annotations

import time
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from combee.tasks.data import Question

__all__ = ["FINANCE_DATA", "element_texts", "real_model_questions", "wait_until"]

# The few finance rows the tests read, carried with them (source and licence: tests/data/finance/README.md), so a
# clone runs its tests without the ACE data beside it.
FINANCE_DATA = Path(__file__).resolve().parent / "data" / "finance"
#: How many Formula questions the real-model smoke has the model answer. Two is the least that still asks every role
#: a learning window asks (reflector per trace, curator per group: the default reduce shape unites per-section
#: partials, it makes no merge call) with more than one trace in the window; four took one more agent round and one
#: more reflector round on the CI's two slots for the same roles (docs/infrastructure.md, CI time).
REAL_MODEL_TRACES = 2


def real_model_questions() -> list[Question]:
    """The Formula questions the real-model tests have the model answer, drawn from :data:`FINANCE_DATA`."""
    from combee.cli.demo import formula_questions

    return formula_questions(REAL_MODEL_TRACES, seed=7, data_dir=FINANCE_DATA)


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.5) -> None:
    """Poll ``cond`` until it is true; fail the test with ``what`` after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


class _ElementTexts(HTMLParser):
    def __init__(self, css: str) -> None:
        super().__init__(convert_charrefs=True)
        self.css = css
        self.depth = 0
        self.found: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self.scripts += 1
        if tag in ("br", "img", "input", "meta", "link", "hr"):  # void elements have no end tag
            return
        if self.depth:
            self.depth += 1
        elif self.css in (dict(attrs).get("class") or "").split():
            self.depth = 1
            self.found.append("")

    def handle_endtag(self, tag: str) -> None:
        if self.depth and tag not in ("br", "img", "input", "meta", "link", "hr"):
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.found[-1] += data


def element_texts(page: str, css: str) -> tuple[list[str], int]:
    """The text (entities decoded, as a reader sees it) of every element of class ``css`` in ``page``, in
    document order, and how many ``<script>`` elements the page has."""
    parser = _ElementTexts(css)
    parser.feed(page)
    parser.close()
    return parser.found, parser.scripts
