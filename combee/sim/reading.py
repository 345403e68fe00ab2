"""How the simulated model reads a learner prompt: its tagged blocks (``<playbook>``, ``<trace>``, ...), the JSON
lines inside them, the sections it offers, and a bullet's text as the prompt shows it. Pure. The world that
answers (:mod:`combee.sim.world`) decides what to say; this module only reads what it was asked."""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = [
    "BLOCK_RES",
    "BULLET_RE",
    "as_offered",
    "json_lines",
    "lesson_text",
    "offered_sections",
    "tagged_block",
]

BLOCK_RES = {
    name: re.compile(rf"<{name}>\n(.*?)\n</{name}>", re.DOTALL)
    for name in ("playbook", "trace", "reflections", "proposals", "task")
}
BULLET_RE = re.compile(r"^- \[(b\d{5,9})\] (.*)$", re.MULTILINE)


OFFERED_RE = re.compile(r"^Sections offered[^:]*: (.*?) \(or ", re.MULTILINE)


def offered_sections(text: str) -> tuple[str, ...] | None:
    """The sections a prompt offers (None when it offers no list: any label goes)."""
    m = OFFERED_RE.search(text)
    return tuple(s.strip() for s in m.group(1).split(",")) if m else None


def as_offered(label: str, offered: tuple[str, ...] | None) -> str:
    """``label`` as the prompt asks for it: an offered section as is, any other as ``new: <label>``."""
    slug = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")
    if offered is None or slug in offered:
        return slug if offered is not None else label
    return "new: " + label.replace("_", " ")


def tagged_block(text: str, name: str) -> str | None:
    m = BLOCK_RES[name].search(text)
    return m.group(1) if m else None


def json_lines(block: str) -> list[dict[str, Any]]:
    out = []
    for line in block.splitlines():
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def lesson_text(shown: str) -> str:
    """A bullet's text as a learner prompt shows it (a JSON string), decoded; any other form as it is."""
    if shown.startswith('"'):
        try:
            value = json.loads(shown)
        except json.JSONDecodeError:
            return shown
        return value if isinstance(value, str) else shown
    return shown
