"""The six-reflection check against a REAL model (issue 13's acceptance): a curator over six reflections, two
of which say the same thing, then semantic de-duplication with the local all-MiniLM-L6-v2.

Not collected by pytest (a handful of real requests). Run it while holding the shared lock, e.g.::

    flock /tmp/combee-heavy.lock python -m tests.integration.six_reflections \
        --base-url http://127.0.0.1:8090/v1 --model local

Prints the curator's operations, the cosines between its ADDs, and the playbook with and without
de-duplication. Exits 0 when the two reflections that say the same thing end as one bullet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from combee.dedup import DEFAULT_THRESHOLD, conflict
from combee.embed_local import MiniLMEmbedder
from combee.embeddings import NearDuplicates
from combee.meter import Meter
from combee.models import AddOp, Delta, Insight, Playbook, Reflection
from combee.playbook import apply_delta
from combee.roles import curate
from combee.settings import Settings
from combee.wiring import build_llm

SAME = (
    "Amounts shown in parentheses are negative: treat them as negative numbers in the calculation.",
    "A figure printed in parentheses means a negative value, so use it with a minus sign when computing.",
)
OTHERS = (
    ("formulas", "Compute the current ratio as current assets divided by current liabilities."),
    ("units_and_scaling", "Convert values reported in thousands to units before combining them with other values."),
    ("extraction", "Take the tax rate from the tax reconciliation table instead of recomputing it."),
    ("formulas", "Use the diluted share count of the same period when computing diluted EPS."),
)


def reflections() -> list[Reflection]:
    texts = [("pitfalls", SAME[0]), OTHERS[0], OTHERS[1], ("pitfalls", SAME[1]), OTHERS[2], OTHERS[3]]
    return [
        Reflection(trace_id=f"t{i}", base_version=0, diagnosis="The run went wrong for this reason.",
                   insights=(Insight(section=section, content=content),))
        for i, (section, content) in enumerate(texts)
    ]  # fmt: skip


async def main(base_url: str, model: str) -> int:
    settings = Settings(openai_base_url=base_url, model=model, llm_timeout_s=900, llm_max_concurrency=1)
    llm = build_llm(settings)
    empty = Playbook(namespace="finance-formula")
    meter = Meter()
    try:
        outcome = await curate(reflections(), empty, llm, meter=meter)
    finally:
        await llm.aclose()
    ops = outcome.value or ()
    print(f"curator: {len(ops)} operations in {outcome.attempts} attempt(s), {meter.calls} call(s)")
    for op in ops:
        print("  ", json.dumps(op.model_dump()))
    dedup = NearDuplicates(MiniLMEmbedder(), threshold=DEFAULT_THRESHOLD)
    adds = [op.content for op in ops if isinstance(op, AddOp)]
    sim = await dedup.similarity(adds)
    for i, a in enumerate(adds):
        for b in adds[i + 1 :]:
            s = sim.score(a, b) or 0.0
            if s >= 0.5:
                print(f"   cos {s:.3f} guard={conflict(a, b)}: {a!r} ~ {b!r}")
    folded, stats = await dedup.fold(ops, empty.bullets)
    before = apply_delta(empty, Delta(namespace=empty.namespace, window_id="w", base_version=0, ops=ops))[0]
    after = apply_delta(empty, Delta(namespace=empty.namespace, window_id="w", base_version=0, ops=folded))[0]
    print(f"without de-duplication: {len(before.bullets)} bullets; with: {len(after.bullets)} "
          f"({stats.merged} merged, {stats.reworded} kept the incoming wording)")  # fmt: skip
    for b in after.bullets:
        print(f"   [{b.id}] ({b.section}) {b.content}")
    parentheses = [b for b in after.bullets if "parenthes" in b.content.lower()]
    print(f"bullets about parentheses after de-duplication: {len(parentheses)}")
    return 0 if len(parentheses) == 1 else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8090/v1")
    parser.add_argument("--model", default="local")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.base_url, args.model)))
