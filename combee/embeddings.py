"""The embeddings port and the edge helper that turns texts into a :class:`combee.dedup.Similarity`.

The core decides with vectors it is given (:mod:`combee.dedup`); computing them is I/O — an ONNX run
(:mod:`combee.embed_local`) or an HTTP call (:mod:`combee.embed_openai`, or the simulator's
``/v1/embeddings``). Everything that computes vectors satisfies :class:`Embedder`. :class:`NearDuplicates`
wraps one with a cache (keyed by normalised text, so a playbook's bullets are embedded once, not once per
window) and the calibrated threshold; an embedder that fails leaves the texts it could not embed without a
vector, which makes the rule fall back to the exact match for them (logged), never stops learning.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from combee.dedup import DEFAULT_THRESHOLD, FoldStats, Similarity, Vector, fold_near_duplicates, texts_of, unit
from combee.models import Bullet, DeltaOp
from combee.playbook import normalise_text

__all__ = ["Embedder", "NearDuplicates"]

log = logging.getLogger("combee.embeddings")


@runtime_checkable
class Embedder(Protocol):
    """Vectors for texts, one per text, in order. May raise; :class:`NearDuplicates` catches it."""

    @property
    def name(self) -> str:
        """What computes the vectors (model and where), for logs and reports."""
        ...

    async def embed(self, texts: Sequence[str]) -> list[Vector]: ...


@dataclass
class NearDuplicates:
    """An embedder, a bounded cache of its vectors, and the threshold: what a learner folds deltas with.

    ``embedded_s`` accumulates the time spent computing vectors (cache misses), ``folded`` the merges made.
    """

    embedder: Embedder
    threshold: float = DEFAULT_THRESHOLD
    cache_size: int = 50_000
    batch: int = 64
    embedded_s: float = 0.0
    embedded_texts: int = 0
    failures: int = 0
    _cache: OrderedDict[str, Vector] = field(default_factory=OrderedDict, repr=False)

    async def similarity(self, texts: Sequence[str]) -> Similarity:
        """The rule over vectors of ``texts`` (computed for the ones not cached yet)."""
        originals: dict[str, str] = {}  # normalised key -> the first text seen with it (what gets embedded)
        for t in texts:
            if t:
                originals.setdefault(normalise_text(t), t)
        keys = list(originals)
        missing = [k for k in keys if k not in self._cache]
        for i in range(0, len(missing), self.batch):
            chunk = missing[i : i + self.batch]
            started = time.perf_counter()
            try:
                vectors = await self.embedder.embed([originals[k] for k in chunk])
                if len(vectors) != len(chunk):
                    raise ValueError(f"{len(vectors)} vectors for {len(chunk)} texts")
            except Exception as exc:  # an outage degrades to the exact rule for these texts, never stops learning
                self.failures += 1
                log.warning(
                    "embeddings from %s failed (%s): %d texts compared by exact match only",
                    self.embedder.name,
                    exc,
                    len(chunk),
                )
                continue
            finally:
                self.embedded_s += time.perf_counter() - started
            self.embedded_texts += len(chunk)
            for k, v in zip(chunk, vectors, strict=True):
                self._cache[k] = unit(v)
        vectors_of: dict[str, Vector] = {}
        for k in keys:
            cached = self._cache.get(k)
            if cached is not None:
                self._cache.move_to_end(k)
                vectors_of[k] = cached
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return Similarity(vectors_of, self.threshold)

    async def fold(
        self, ops: Sequence[DeltaOp], bullets: Sequence[Bullet] = (), *, against_bullets: bool = True
    ) -> tuple[tuple[DeltaOp, ...], FoldStats]:
        """:func:`combee.dedup.fold_near_duplicates` with vectors for every text involved."""
        if not ops:
            return tuple(ops), FoldStats()
        sim = await self.similarity(texts_of(ops, bullets if against_bullets else ()))
        return fold_near_duplicates(ops, bullets, sim, against_bullets=against_bullets)
