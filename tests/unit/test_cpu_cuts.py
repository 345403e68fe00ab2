"""Issue 16's CPU cuts keep their functions' meaning: each faster version agrees with the plain definition."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from combee.llm import context_tokens_of
from combee.models import _no_control_chars
from combee.tracefile import _depth_ok


def reference_clean(text: str) -> str:
    """The per-character definition the regular expression replaced (C1 and carriage return added by issue 26)."""
    return "".join(c for c in text if not (ord(c) < 32 or 0x7F <= ord(c) <= 0x9F) or c in "\n\t")


def reference_depth(raw: str, limit: int = 32) -> bool:
    depth, in_str, escape = 0, False, False
    for c in raw:
        if in_str:
            escape, in_str = (False, True) if escape else (c == "\\", c != '"')
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
            if depth > limit:
                return False
        elif c in "]}":
            depth -= 1
    return True


@settings(deadline=None)  # a shared, busy machine: no per-example deadline
@given(st.text(alphabet=st.characters(max_codepoint=0x200)))
def test_control_characters_are_dropped_exactly_as_before(text: str) -> None:
    assert _no_control_chars(text) == reference_clean(text)


@settings(deadline=None)  # a shared, busy machine: no per-example deadline
@given(st.integers(0, 40), st.integers(0, 40), st.text(alphabet='[]{}"\\ab', max_size=80))
def test_the_depth_check_agrees_with_the_full_scan(lists: int, objects: int, noise: str) -> None:
    raw = "[" * lists + json.dumps(noise) + "]" * lists
    raw = '{"a":' * objects + raw + "}" * objects
    assert _depth_ok(raw) == reference_depth(raw)
    assert _depth_ok(noise) == reference_depth(noise)


async def test_context_tokens_is_asked_of_llms_that_know_it_and_of_no_other() -> None:
    class Knows:
        async def context_tokens(self, role: object) -> int:
            return 4096

    class Plain:
        context_tokens = 12  # not a method: not the optional protocol

    assert await context_tokens_of(Knows(), "reflector") == 4096  # type: ignore[arg-type]
    assert await context_tokens_of(Plain(), "reflector") is None  # type: ignore[arg-type]
    assert await context_tokens_of(object(), "reflector") is None  # type: ignore[arg-type]
