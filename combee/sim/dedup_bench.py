"""SIMULATED benchmark of semantic de-duplication: each method with and without it, in process.

``python -m combee.sim.dedup_bench [--traces 500] [--seeds 1] [--embedder sim|local|both]`` learns the same
synthetic traces (:func:`combee.sim.world.generate_traces`) with the in-process simulated model, once with the
exact rule only and once per embedder, and prints per method: playbook entries and tokens, insight retention
(share of the trace set's ground-truth insights whose key is in the prompt), the bullets that restate an insight
or a generic tip another bullet already states, the merges de-duplication made, and the wall time it added
per window (computing vectors + folding; the model's one-off load is reported apart). ``local`` is the real
all-MiniLM-L6-v2 on this CPU; ``sim`` is the
simulator's documented vector model (:mod:`combee.sim.embeddings`). Everything else is SIMULATED.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

from combee.embeddings import NearDuplicates
from combee.engine import Method, MethodConfig
from combee.learner import LearnConfig, learn
from combee.models import Playbook, Trace
from combee.playbook import playbook_tokens, render_prompt
from combee.sim.embeddings import SimEmbedder
from combee.sim.inproc import InProcessSim
from combee.sim.world import GENERIC_TAILS, WorldResponder, generate_traces, insight_keys_in, retention

__all__ = ["restatements", "run"]

METHODS: tuple[tuple[str, int], ...] = (("sequential", 1), ("naive", 100), ("combee", 100))


def restatements(playbook: Playbook) -> int:
    """Bullets that restate what another bullet says: same insight key, or same generic tip (any wording)."""
    seen: set[str] = set()
    extra = 0
    for b in playbook.bullets:
        keys = insight_keys_in(b.content)
        low = b.content.casefold()
        what = keys[0] if keys else next((f"tip:{t}" for t in GENERIC_TAILS if t in low), None)
        if what is None:
            continue
        extra += what in seen
        seen.add(what)
    return extra


def _embedder(kind: str) -> Any:
    if kind == "sim":
        return SimEmbedder()
    from combee.embed_local import MiniLMEmbedder

    return MiniLMEmbedder()


async def run(n: int, seed: int, method: str, batch: int, embedder: str | None) -> dict[str, Any]:
    raw, _, truth = generate_traces(n, seed, namespace="bench")
    traces = [Trace.model_validate(t) for t in raw]
    llm = InProcessSim(WorldResponder(), seed=0)
    # the paper's reduce, as measured in docs/dedup.md: the folding before merge calls needs merge calls
    config = LearnConfig(method=MethodConfig(method=Method(method), shuffle_key="none"), batch_size=batch)
    dedup = NearDuplicates(_embedder(embedder)) if embedder else None
    started = time.perf_counter()
    if dedup is not None:  # load the model outside the measured windows (once per process in a worker)
        await dedup.embedder.embed(["warm-up"])
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    result = await learn(traces, llm, config, dedup=dedup)
    wall = time.perf_counter() - started
    pb = result.playbook
    windows = len(result.iterations)
    merger = result.meter.roles.get("merger")
    return {
        "method": method,
        "batch": batch,
        "seed": seed,
        "dedup": embedder or "exact",
        "entries": len(pb.bullets),
        "tokens": playbook_tokens(pb),
        "retention": round(retention(render_prompt(pb), truth["insights"]), 4),
        "restatements": restatements(pb),
        "folded_ops": result.meter.folded_ops,
        "folded_proposals": result.meter.folded_proposals,
        "merge_prompt_tokens": merger.prompt_tokens if merger else 0,
        "windows": windows,
        "dedup_ms_per_window": round(1000 * result.meter.dedup_s / max(1, windows), 2),
        "embedded_texts": dedup.embedded_texts if dedup else 0,
        "model_load_s": round(load_s, 2),
        "wall_s": round(wall, 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m combee.sim.dedup_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=500)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--embedder", choices=["sim", "local", "both"], default="both")
    parser.add_argument("--methods", default="sequential,naive,combee", help="comma-separated (default: all three)")
    parser.add_argument("--json", action="store_true", help="one JSON object per run instead of a table")
    args = parser.parse_args(argv)
    kinds = ["sim", "local"] if args.embedder == "both" else [args.embedder]
    rows = []
    for seed in range(1, args.seeds + 1):
        for method, batch in [(m, b) for m, b in METHODS if m in args.methods.split(",")]:
            for kind in [None, *kinds]:
                rows.append(asyncio.run(run(args.traces, seed, method, batch, kind)))
                if args.json:
                    print(json.dumps(rows[-1]), flush=True)
    if not args.json:
        cols = ["method", "batch", "seed", "dedup", "entries", "tokens", "retention", "restatements",
                "folded_ops", "folded_proposals", "merge_prompt_tokens", "embedded_texts", "dedup_ms_per_window",
                "model_load_s"]  # fmt: skip
        print("SIMULATED — " + " | ".join(cols))
        for r in rows:
            print(" | ".join(str(r[c]) for c in cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
