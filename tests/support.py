"""Small helpers shared by the integration tests and the fault suite."""

from __future__ import annotations

import time
from collections.abc import Callable
from html.parser import HTMLParser

__all__ = ["element_texts", "wait_until"]


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
