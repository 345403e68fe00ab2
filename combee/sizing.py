"""Request sizing against a model's context window: pure arithmetic, no tokenizer, no I/O.

A server refuses (or silently truncates) a request whose prompt plus ``max_tokens`` exceeds the context of the
slot that serves it. Without the model's tokenizer the prompt is estimated *conservatively*: one token per
:data:`CHARS_PER_TOKEN` characters (3.2, below the ~4 of English prose, so code, numbers and JSON are not
under-counted), plus a few tokens of chat-template framing per message, plus a safety margin. The contracts:

* :func:`completion_budget` — the ``max_tokens`` to ask for: what is wanted, cut to what fits; raises
  :class:`~combee.errors.ContextTooSmall` (with the numbers) when not even the minimum fits.
* :func:`select_bullets` — the playbook bullets to show when the whole playbook does not fit: highest
  helpful − harmful first (ties: older bullets first), their estimated cost within the room, returned in id
  order so the rendering stays deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from combee.errors import ContextTooSmall
from combee.models import Bullet

__all__ = [
    "CHARS_PER_TOKEN",
    "MARGIN_TOKENS",
    "MESSAGE_OVERHEAD_TOKENS",
    "completion_budget",
    "line_tokens",
    "prompt_tokens",
    "select_bullets",
]

CHARS_PER_TOKEN = 3.2
"""Characters per token assumed when estimating a prompt: deliberately low, so estimates err high."""

MESSAGE_OVERHEAD_TOKENS = 8
"""Chat-template framing per message (role markers, separators), plus the same once for the reply's start."""

MARGIN_TOKENS = 64
"""Kept free beyond every estimate."""


def line_tokens(text: str) -> int:
    """Conservative token estimate of ``text`` plus its line break (0 only for nothing at all)."""
    return math.ceil((len(text) + 1) / CHARS_PER_TOKEN)


def prompt_tokens(contents: Iterable[str]) -> int:
    """Conservative token estimate of a chat prompt made of messages with these contents."""
    total = MESSAGE_OVERHEAD_TOKENS
    for content in contents:
        total += MESSAGE_OVERHEAD_TOKENS + math.ceil(len(content) / CHARS_PER_TOKEN)
    return total


def completion_budget(
    context_tokens: int | None,
    prompt: int,
    wanted: int,
    *,
    minimum: int,
    margin: int = MARGIN_TOKENS,
) -> int:
    """``max_tokens`` for a request whose prompt is estimated at ``prompt`` tokens.

    ``wanted`` when the context is unknown (None) or has room for it; else what fits, if that is at least
    ``minimum``. Raises :class:`ContextTooSmall` otherwise.
    """
    if context_tokens is None:
        return wanted
    room = context_tokens - prompt - margin
    if room < min(minimum, wanted):
        raise ContextTooSmall(
            f"the request does not fit the model's context: about {prompt} prompt tokens + at least "
            f"{min(minimum, wanted)} completion tokens + a {margin}-token margin > {context_tokens} tokens of "
            "context (raise the server's per-slot context, e.g. fewer slots, or COMBEE_LLM_CONTEXT_TOKENS if "
            "the server under-reports it)",
            context_tokens=context_tokens,
            prompt_tokens=prompt,
            completion_tokens=min(minimum, wanted),
        )
    return min(wanted, room)


def select_bullets(
    bullets: Sequence[Bullet],
    room_tokens: int,
    *,
    bullet_line: Iterable[str] | None = None,
) -> tuple[Bullet, ...]:
    """The bullets to show within ``room_tokens``: best helpful − harmful first, returned in their given order.

    A bullet costs :func:`line_tokens` of its rendered line (``bullet_line`` gives the lines, one per bullet,
    default ``- [id] content``) plus a section heading and blank line for the first bullet of its section. Selection
    is greedy in priority order and skips a bullet that does not fit while smaller ones still may.
    """
    lines = list(bullet_line) if bullet_line is not None else [f"- [{b.id}] {b.content}" for b in bullets]
    if len(lines) != len(bullets):
        raise ValueError("bullet_line must give one line per bullet")
    order = sorted(range(len(bullets)), key=lambda i: (-bullets[i].score, bullets[i].id))
    chosen: set[int] = set()
    sections: set[str] = set()
    used = 0
    for i in order:
        b = bullets[i]
        cost = line_tokens(lines[i]) + (0 if b.section in sections else line_tokens(f"## {b.section}") + 1)
        if used + cost > room_tokens:
            continue
        used += cost
        chosen.add(i)
        sections.add(b.section)
    return tuple(b for i, b in enumerate(bullets) if i in chosen)
