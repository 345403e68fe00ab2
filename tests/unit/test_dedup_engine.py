"""Semantic de-duplication in the reduce and at apply, the same for all three methods (scripted LLM, fake vectors)."""

from __future__ import annotations

import pytest

from combee.embeddings import NearDuplicates
from combee.engine import Method, MethodConfig, Window, run_window
from combee.learner import LearnConfig, learn
from combee.llm import Role
from combee.models import AddOp, Bullet, Playbook, Provenance, Trace
from combee.settings import Settings
from combee.wiring import build_near_duplicates
from tests.fakes import GroupEmbedder, ScriptedLLM, block_lines, echo_script

# Six lessons, three of them rewordings of one tip and two of another: three distinct insights.
TASKS = [
    "verify the units of every figure",
    "read the footnote on leases",
    "confirm the units of every figure",
    "check which period the question asks about",
    "double-check the units of every figure",
    "make sure which period the question refers to",
]
GROUPS = [["units of every figure"], ["period the question"]]


def traces(tasks: list[str] = TASKS) -> tuple[Trace, ...]:
    return tuple(Trace(trace_id=f"t{i}", namespace="ns", task=t) for i, t in enumerate(tasks))


def window(tasks: list[str] = TASKS) -> Window:
    ts = traces(tasks)
    return Window("ns", "p0", 0, len(ts) - 1, ts)


def dedup(**kw: object) -> NearDuplicates:
    return NearDuplicates(GroupEmbedder(GROUPS, **kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("method", [Method.COMBEE, Method.NAIVE])
async def test_rewordings_in_one_window_end_as_one_bullet(method: Method) -> None:
    cfg = MethodConfig(method=method)
    plain = await run_window(window(), Playbook(namespace="ns"), ScriptedLLM(echo_script), cfg)
    assert len(plain.playbook.bullets) == 6
    result = await run_window(window(), Playbook(namespace="ns"), ScriptedLLM(echo_script), cfg, dedup=dedup())
    assert len(result.playbook.bullets) == 3
    assert result.meter.folded_ops + result.meter.folded_proposals >= 3  # combee: p = 2 copies fold too
    assert result.meter.dedup_s > 0


async def test_sequential_folds_an_add_into_the_existing_bullet() -> None:
    result = await learn(traces(), ScriptedLLM(echo_script), LearnConfig(method=MethodConfig(Method.SEQUENTIAL)),
                         dedup=dedup())  # fmt: skip
    assert len(result.playbook.bullets) == 3
    assert result.meter.folded_ops == 3


async def test_near_duplicate_proposals_collapse_before_the_merge_call() -> None:
    tasks = TASKS * 4  # 24 reflections: several groups, so merge calls see repeats from different groups
    cfg = MethodConfig(max_group_items=8, shuffle_key="none")  # the paper's reduce: merge calls

    async def merged_proposals(d: NearDuplicates | None) -> int:
        llm = ScriptedLLM(echo_script)
        await run_window(window(tasks), Playbook(namespace="ns"), llm, cfg, dedup=d)
        return sum(len(block_lines(r, "proposals")) for r in llm.calls(Role.MERGER))

    assert await merged_proposals(dedup()) < await merged_proposals(None)


async def test_an_embeddings_outage_falls_back_to_exact_match() -> None:
    d = dedup(fail=True)
    result = await run_window(window(), Playbook(namespace="ns"), ScriptedLLM(echo_script), MethodConfig(), dedup=d)
    assert len(result.playbook.bullets) == 6
    assert d.failures >= 1


async def test_vectors_are_cached_by_normalised_text() -> None:
    d = dedup()
    prov = Provenance(window_id="w", version=1)
    bullets = [Bullet(id="b00001", section="s", content="Verify the units of every figure.", created=prov,
                      updated=prov)]  # fmt: skip
    ops = [AddOp(section="s", content="Confirm the units of every figure!")]
    await d.fold(ops, bullets)
    await d.fold(ops, bullets)
    embedder = d.embedder
    assert isinstance(embedder, GroupEmbedder) and embedder.texts == 2


def test_settings_choose_the_embedder_and_say_so() -> None:
    said: list[str] = []
    assert build_near_duplicates(Settings(embeddings="off"), log=said.append) is None
    assert "exact match only" in said[-1]
    missing = Settings(embeddings="local", embeddings_tokenizer="/nonexistent/tokenizer.json")
    assert build_near_duplicates(missing, log=said.append) is None
    assert "exact match only" in said[-1] and "/nonexistent/tokenizer.json" in said[-1]
    endpoint = build_near_duplicates(
        Settings(embeddings_url="http://127.0.0.1:9/v1", embeddings_threshold=0.9), log=said.append
    )
    assert endpoint is not None and endpoint.threshold == 0.9 and "127.0.0.1:9" in said[-1]
