"""Rendering: data into named blocks, the playbook view, and a request fitted to the model's context.

Untrusted text (trace contents, and anything derived from it) only ever reaches a model as JSON inside a
named block (``<trace>``, ``<reflections>``, ``<proposals>``, ``<task>``), with ``<``, ``>`` and ``&`` escaped
as JSON unicode escapes so the data cannot close its block or open another. Learned bullets are such text too:
in the reflector's, curator's and merger's ``<playbook>`` block each bullet's text is a JSON string written the
same way (:func:`lesson_data`), so it cannot close the block, start a heading or a bullet of its own, or show a
bullet id (``[b00001]``) that the playbook did not give it. (The agent's own system prompt shows the bullets as
plain text: :func:`combee.playbook.render_prompt`.) Templates are checked once, at
start-up (:func:`validate_templates`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from combee.guard import one_line_lesson
from combee.llm import ChatMessage
from combee.models import (
    Bullet,
    Playbook,
    Trace,
)
from combee.playbook import bullet_line, render_prompt
from combee.prompts.templates import DEFAULT_PROMPTS, PromptSet
from combee.sizing import MARGIN_TOKENS, completion_budget, prompt_tokens, select_bullets

__all__ = [
    "PlaybookView",
    "chat_messages",
    "data_json",
    "escape_markup",
    "fit_payload",
    "fit_to_context",
    "lesson_data",
    "message_contents",
    "outcome_text",
    "playbook_view",
    "trace_payload",
]


_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def data_json(value: Any) -> str:
    """Compact JSON with ``<``, ``>`` and ``&`` escaped, so data cannot forge or close a prompt block."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=False).translate(_ESCAPES)


# "[b00001]" inside a lesson: its bracket written as a JSON escape, so the text shows no id of the playbook's form
_FORGED_ID_RE = re.compile(r"\[(?=b\d)", re.IGNORECASE)


def lesson_data(text: str) -> str:
    """A bullet's text as data for a learner prompt: a :func:`data_json` string of its one-line form, with the
    bracket of anything shaped like a bullet id escaped too (``\\u005b``). Decoding the JSON gives the one-line
    text back."""
    return _FORGED_ID_RE.sub(r"\\u005b", data_json(one_line_lesson(text)))


@dataclass(frozen=True)
class PlaybookView:
    """The part of a playbook one request shows: all of it, or the best-scoring bullets that fit."""

    playbook: Playbook
    shown: tuple[Bullet, ...]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(b.id for b in self.shown)

    @property
    def partial(self) -> bool:
        return len(self.shown) < len(self.playbook.bullets)

    def text(self, prompts: PromptSet = DEFAULT_PROMPTS, *, data: bool = False) -> str:
        """The rendered playbook (:func:`render_prompt`'s layout), with a note after the bullets when it is a
        subset or empty. A subset is chosen by score, so it is grouped by section throughout: its text has no
        stable prefix to keep anyway. ``data``: each bullet's text as :func:`lesson_data` (the learner's
        prompts, where bullets are untrusted data); otherwise as the agent reads it."""
        lesson = lesson_data if data else one_line_lesson
        if self.partial:
            shown = self.playbook.model_copy(update={"bullets": self.shown})
            subset = prompts.subset_note.format(shown=len(self.shown), total=len(self.playbook.bullets))
            return render_prompt(shown, note=subset, grouped=True, lesson=lesson).rstrip("\n")
        empty = None if self.playbook.bullets else prompts.empty_note
        return render_prompt(self.playbook, note=empty, lesson=lesson).rstrip("\n")


def playbook_view(playbook: Playbook, shown: Sequence[Bullet] | None = None) -> PlaybookView:
    """A view of ``playbook`` showing ``shown`` (default: every bullet)."""
    return PlaybookView(playbook, tuple(playbook.bullets if shown is None else shown))


def escape_markup(text: str) -> str:
    # The rendered playbook is itself derived from model output, so its text is kept from forming tags.
    return text.replace("<", "‹").replace(">", "›")


def trace_payload(trace: Trace) -> dict[str, Any]:
    fb = trace.feedback
    payload: dict[str, Any] = {"task": trace.task}
    if trace.steps:
        payload["steps"] = [{"kind": s.kind, "content": s.content} for s in trace.steps]
    if trace.output:
        payload["output"] = trace.output
    feedback = {k: v for k, v in fb.model_dump().items() if v is not None}
    if feedback:
        payload["feedback"] = feedback
    if trace.bullet_ids:
        payload["bullets_used"] = list(trace.bullet_ids)
    return payload


_CLIPPED = "[… {} characters omitted to fit the model's context …]"


_MIN_KEPT_CHARS = 160


def _clip_middle(text: str, keep: int) -> str:
    marker = _CLIPPED.format(len(text) - keep)
    head = keep // 2
    return text[:head] + marker + text[len(text) - (keep - head) :]


def _string_leaves(node: Any, out: list[tuple[int, Any, Any]]) -> None:
    """Append (length, container, key) of every string inside ``node``."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        if isinstance(child, str):
            out.append((len(child), node, key))
        else:
            _string_leaves(child, out)


def fit_payload(payload: dict[str, Any], max_chars: int) -> tuple[dict[str, Any], bool]:
    """``payload`` shrunk until its :func:`data_json` form has at most ``max_chars`` characters: the longest
    strings lose their middle (a marker says how much), then the middle steps go (a marker step says how many).
    Returns the payload and whether anything was cut; a payload that cannot shrink further is returned as is
    (the request's sizing then reports that it does not fit). Pure.
    """
    value = json.loads(json.dumps(payload))
    cut = False
    for _ in range(10_000):
        excess = len(data_json(value)) - max_chars
        if excess <= 0:
            return value, cut
        leaves: list[tuple[int, Any, Any]] = []
        _string_leaves(value, leaves)
        # every string over an equal share of the room loses its middle (a clipped string is the share plus
        # its marker, so only one longer than that can shrink)
        share = max(_MIN_KEPT_CHARS, max_chars // max(1, len(leaves)))
        long = [(n, node, key) for n, node, key in leaves if n > share + len(_CLIPPED) + 16]
        if long:
            for _, node, key in long:
                node[key] = _clip_middle(node[key], share)
            cut = True
            continue
        steps = value.get("steps")
        if isinstance(steps, list) and len(steps) > 3:
            drop = max(1, len(steps) // 2)
            head = (len(steps) - drop) // 2
            omitted = {"kind": "note", "content": f"[{drop} steps omitted to fit the model's context]"}
            value["steps"] = [*steps[:head], omitted, *steps[head + drop :]]
            cut = True
            continue
        return value, cut
    return value, cut


def outcome_text(trace: Trace, prompts: PromptSet) -> str:
    # Only the success flag (a bool) is read outside the trace block: no trace text leaves it. A small model
    # reading the record alone often calls a wrong answer right; the verdict stated plainly prevents that.
    success = trace.feedback.success
    if success is None:
        return ""
    return prompts.outcome_succeeded if success else prompts.outcome_failed


def chat_messages(system: str, user: str) -> tuple[ChatMessage, ...]:
    return (ChatMessage(role="system", content=system), ChatMessage(role="user", content=user))


def message_contents(messages: Sequence[ChatMessage]) -> list[str]:
    return [m.content for m in messages]


def fit_to_context(
    playbook: Playbook,
    build: Callable[[PlaybookView], tuple[ChatMessage, ...]],
    context_tokens: int | None,
    *,
    wanted: int,
    minimum: int,
    reserve: int = 0,
    data: bool = False,
) -> tuple[PlaybookView, tuple[ChatMessage, ...], int]:
    """The view, messages and ``max_tokens`` of a request sized to ``context_tokens`` (None: unsized).

    The whole playbook is shown when it fits with at least ``minimum`` completion tokens; otherwise the
    best-scoring bullets that do. ``reserve`` tokens are counted on top of the prompt (a stand-in for a
    variable part, so the view stays the same for every short enough variable part). ``data``: ``build`` writes
    the bullets as :func:`lesson_data` (as :meth:`PlaybookView.text` with ``data=True``), so a bullet is costed
    at that longer line.
    """
    full = playbook_view(playbook)
    messages = build(full)
    if context_tokens is None:
        return full, messages, wanted
    floor = min(minimum, wanted)
    estimate = prompt_tokens(message_contents(messages)) + reserve
    if estimate + floor + MARGIN_TOKENS > context_tokens and playbook.bullets:
        fixed = prompt_tokens(message_contents(build(playbook_view(playbook, ())))) + reserve
        room = context_tokens - fixed - floor - MARGIN_TOKENS
        lesson = lesson_data if data else one_line_lesson
        lines = [bullet_line(b, lesson) for b in playbook.bullets]
        while True:  # the subset note's numbers can cost a token more than the empty view's: shrink until it fits
            shown = select_bullets(playbook.bullets, max(room, 0), bullet_line=lines)
            full = playbook_view(playbook, shown)
            messages = build(full)
            estimate = prompt_tokens(message_contents(messages)) + reserve
            over = estimate + floor + MARGIN_TOKENS - context_tokens
            if over <= 0 or not shown:
                break
            room -= over
    return full, messages, completion_budget(context_tokens, estimate, wanted, minimum=minimum)
