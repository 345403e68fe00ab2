"""SIMULATED embeddings: a documented vector model for the simulator's ``/v1/embeddings`` (and in-process).

Not a language model. A text's vector is the normalised sum of seeded random unit vectors ("facets") of what
the text is about, plus a noise facet of the exact text whose weight varies from text to text:

* a **world insight** (the text names a rule key such as ``FX-0042``): facets of its key (weight 0.3), its
  action (1.0), its metric (0.25), its document kind (0.2) and the domain (0.6) — all known to the world model
  from the key. Rewordings of one insight share every facet; two insights that share the action (and, rarely,
  the metric and document) are the simulator's hard negatives;
* a **generic tip** (one of the world's generic tails, any head): its tail (1.1), "generic advice" (0.45),
  its head (0.3), the domain (0.3);
* **anything else**: the normalised text itself (1.0) and the domain (0.3).

Noise weight: ``0.55 · (0.6 + 0.8·u)``, ``u`` uniform from the text's hash. In 384 dimensions this gives
(``python -m combee.sim.embeddings`` prints the figures over the formula world, seed 0): rewordings of one
insight 0.831 on average, 0.69 at least (MiniLM on real paraphrases: 0.83 on average); insights sharing an
action 0.74 on average, up to 0.852 (MiniLM's hard negatives: up to 0.86); other insights 0.20 on average,
0.40 at most. Keys are numbers, so the de-duplication guard never
merges two different rules however close their vectors are — as it would not for a real model.

Deterministic: the same text and seed always give the same vector, in any process.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import statistics
import struct
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from combee.dedup import Vector, cosine
from combee.playbook import normalise_text
from combee.sim.world import (
    ACTIONS,
    DOCS,
    GENERIC_HEADS,
    GENERIC_TAILS,
    METRICS,
    insight_content,
    insight_keys_in,
    seeded_pick,
)
from combee.tokens import estimate_tokens

__all__ = ["DIM", "MODEL", "SimEmbedder", "embeddings_answer", "sim_vector"]

DIM = 384
MODEL = "combee-sim-embed"
NOISE = 0.55


@lru_cache(maxsize=4096)
def _facet(seed: int, *parts: str) -> Vector:
    digest = hashlib.sha256("\x1f".join((str(seed), *parts)).encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    v = [rng.gauss(0.0, 1.0) for _ in range(DIM)]
    norm = math.sqrt(sum(x * x for x in v))
    return tuple(x / norm for x in v)


def _u(text: str) -> float:
    return int.from_bytes(hashlib.sha256(("noise-weight\x1f" + text).encode()).digest()[:8], "big") / 2**64


def _facets(text: str) -> list[tuple[float, tuple[str, ...]]]:
    keys = insight_keys_in(text)
    if keys:
        key = keys[0]
        return [
            (0.3, ("key", key)),
            (1.0, ("action", seeded_pick(ACTIONS, "act", key))),
            (0.25, ("metric", seeded_pick(METRICS, "metric", key))),
            (0.2, ("doc", seeded_pick(DOCS, "doc", key))),
            (0.6, ("domain",)),
        ]
    low = text.casefold()
    tail = next((t for t in GENERIC_TAILS if t in low), None)
    if tail is not None:
        head = next((h for h in GENERIC_HEADS if low.startswith(h.casefold())), "")
        return [(1.1, ("tip", tail)), (0.45, ("generic",)), (0.3, ("head", head)), (0.3, ("domain",))]
    return [(1.0, ("text", normalise_text(text))), (0.3, ("domain",))]


@lru_cache(maxsize=65_536)
def sim_vector(text: str, seed: int = 0) -> Vector:
    """The simulated embedding of ``text`` (unit length, :data:`DIM` dimensions)."""
    key = normalise_text(text)
    total = [0.0] * DIM
    parts = [*_facets(text), (NOISE * (0.6 + 0.8 * _u(key)), ("noise", key))]
    for weight, facet in parts:
        for i, x in enumerate(_facet(seed, *facet)):
            total[i] += weight * x
    norm = math.sqrt(sum(x * x for x in total))
    return tuple(x / norm for x in total)


class SimEmbedder:
    """The :class:`combee.embeddings.Embedder` port over :func:`sim_vector`, in process (SIMULATED)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    @property
    def name(self) -> str:
        return f"{MODEL} (SIMULATED, in process)"

    async def embed(self, texts: Sequence[str]) -> list[Vector]:
        return [sim_vector(t, self.seed) for t in texts]


def embeddings_answer(body: object, seed: int) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of ``POST /v1/embeddings`` for a request ``body`` (OpenAI wire format;
    ``encoding_format`` float or base64). The HTTP route lives in :mod:`combee.sim.server`."""

    def error(message: str) -> tuple[int, dict[str, Any]]:
        return 400, {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}

    texts = body.get("input") if isinstance(body, dict) else None
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        return error("'input' must be a string or a non-empty list of strings (token arrays are not supported)")
    assert isinstance(body, dict)
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        return error("'encoding_format' must be 'float' or 'base64'")
    data = []
    for i, text in enumerate(texts):
        v = sim_vector(text, seed)
        emb: Any = base64.b64encode(struct.pack(f"<{DIM}f", *v)).decode() if encoding == "base64" else list(v)
        data.append({"object": "embedding", "index": i, "embedding": emb})
    tokens = sum(estimate_tokens(t) for t in texts)
    return 200, {
        "object": "list",
        "data": data,
        "model": body.get("model") or MODEL,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _figures(seed: int = 0) -> dict[str, float]:
    """Mean/max cosines of the model's classes of pairs over the formula world (what the docstring states)."""
    from combee.sim.world import PHRASINGS, WORLDS

    world = WORLDS["formula"]
    keys = [world.key(i) for i in range(world.universe)]
    vec = {(k, p): sim_vector(insight_content(k, p), seed) for k in keys for p in range(PHRASINGS)}
    para = [cosine(vec[(k, a)], vec[(k, b)]) for k in keys for a in range(PHRASINGS) for b in range(a + 1, PHRASINGS)]
    same_action: list[float] = []
    other: list[float] = []
    for i, k in enumerate(keys):
        for j in keys[i + 1 :]:
            c = cosine(vec[(k, 0)], vec[(j, 0)])
            (same_action if seeded_pick(ACTIONS, "act", k) == seeded_pick(ACTIONS, "act", j) else other).append(c)
    return {
        "paraphrase_mean": statistics.mean(para),
        "paraphrase_min": min(para),
        "same_action_mean": statistics.mean(same_action),
        "same_action_max": max(same_action),
        "unrelated_mean": statistics.mean(other),
        "unrelated_max": max(other),
    }


if __name__ == "__main__":
    for name, value in _figures().items():
        print(f"{name:18} {value:.3f}")
