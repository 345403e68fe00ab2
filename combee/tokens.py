"""Token estimates without a tokenizer download.

No tokenizer files can be fetched on every machine Combee runs on, so budgets and the simulator's accounting
use one cheap, deterministic estimate: about four characters per token for English-like text, never less than
one token for non-empty text. Real endpoints report their own usage, which the LLM layer prefers.
"""

from __future__ import annotations

__all__ = ["estimate_tokens"]

_CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """Estimated token count of ``text`` (0 for the empty string)."""
    if not text:
        return 0
    return max(1, (len(text) + _CHARS_PER_TOKEN - 1) // _CHARS_PER_TOKEN)
