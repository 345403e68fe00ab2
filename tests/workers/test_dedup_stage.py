"""Semantic de-duplication in the workers: the combiner folds a window's near duplicates before it logs the
delta, so a restarted combiner replays the log to the same playbook without computing a single vector."""

from __future__ import annotations

import json

from combee.embeddings import NearDuplicates
from tests.fakes import GroupEmbedder, ScriptedLLM, echo_script
from tests.workers.test_stages import (
    Event,
    MemoryKafka,
    Msg,
    Stream,
    deltas,
    learner,
    run_until_quiet,
)
from workers.combine import ensure_ready
from workers.window import handle_trace

TASKS = ["verify the units of every figure", "read the footnote on leases", "confirm the units of every figure",
         "check which period the question asks about", "double-check the units of every figure",
         "make sure which period the question refers to", "use the diluted share count"]  # fmt: skip
GROUPS = [["units of every figure"], ["period the question"]]


async def test_the_combiner_folds_near_duplicates_and_a_replay_needs_no_vectors() -> None:
    kafka, stream = MemoryKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    embedder = GroupEmbedder(GROUPS)
    ctx.dedup = NearDuplicates(embedder)  # type: ignore[arg-type]
    part = ctx.home_partition("alpha")
    for i, task in enumerate(TASKS * 2):  # two rounds: the second restates what the playbook already holds
        value = json.dumps({"namespace": "alpha", "trace_id": f"a-{i}", "task": task}).encode()
        offset = await kafka.send(ctx.topics.traces, b"alpha", value, part)
        await handle_trace(ctx, stream, Event(Msg(ctx.topics.traces, part, offset, b"alpha", value)))
    await run_until_quiet(ctx, kafka, stream, set())

    final = ctx.snapshots.get("alpha")
    assert final is not None
    assert len(final.playbook.bullets) == 4  # units, footnote, period, diluted: one bullet each
    assert embedder.calls > 0
    logged = [op for r in deltas(kafka, ctx.topics) for op in r.delta.ops]
    assert sum(1 for op in logged if op.op == "ADD") == 4  # the log holds the folded operations

    # crash before the last snapshot; the restarted combiner has no embedder at all
    del kafka.logs[(ctx.topics.playbooks, part)][-2:]
    restarted = learner(kafka, ScriptedLLM(echo_script))
    await ensure_ready(restarted, part)
    recovered = restarted.snapshots.get("alpha")
    assert recovered is not None and recovered.playbook == final.playbook
