"""The simulator's embeddings: the documented vector model, over HTTP and in process, and dedup through it."""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest

from combee.dedup import DEFAULT_THRESHOLD, cosine
from combee.embed_openai import OpenAIEmbedder
from combee.embeddings import NearDuplicates
from combee.models import AddOp
from combee.sim.config import SimConfig
from combee.sim.embeddings import DIM, SimEmbedder, _figures, sim_vector
from combee.sim.runner import SimThread
from combee.sim.world import generic_tip, insight_content


@pytest.fixture(scope="module")
def sim() -> Iterator[SimThread]:
    with SimThread(SimConfig(time_scale=0.001, seed=0)) as server:
        yield server


def test_the_model_matches_its_documented_figures() -> None:
    f = _figures()
    assert 0.80 <= f["paraphrase_mean"] <= 0.86  # MiniLM on real paraphrases: 0.83
    assert 0.82 <= f["same_action_max"] <= 0.88  # MiniLM's hard negatives: up to 0.86
    assert f["unrelated_mean"] < 0.3


def test_vectors_are_deterministic_unit_and_group_rewordings() -> None:
    a, b = sim_vector(insight_content("FX-0007", 0)), sim_vector(insight_content("FX-0007", 3))
    assert a == sim_vector(insight_content("FX-0007", 0)) and len(a) == DIM
    assert abs(sum(x * x for x in a) - 1.0) < 1e-9
    assert cosine(a, b) > cosine(a, sim_vector(insight_content("FX-0008", 0)))
    assert cosine(sim_vector(generic_tip(0)), sim_vector(generic_tip(1))) > 0.6  # same tail, another head


async def test_the_http_route_serves_the_same_vectors_to_the_openai_client(sim: SimThread) -> None:
    texts = [insight_content("FX-0001", 1), "anything at all"]
    embedder = OpenAIEmbedder(sim.base_url, "combee-sim-embed")  # the client asks for base64 by default
    try:
        got = await embedder.embed(texts)
    finally:
        await embedder.aclose()
    for g, t in zip(got, texts, strict=True):
        assert max(abs(x - y) for x, y in zip(g, sim_vector(t), strict=True)) < 1e-6  # float32 on the wire
    async with aiohttp.ClientSession() as session:
        async with session.post(sim.base_url + "/embeddings", json={"input": "x", "encoding_format": "float"}) as r:
            body = await r.json()
            assert r.headers["x-combee-simulated"] == "true" and len(body["data"][0]["embedding"]) == DIM
        async with session.post(sim.base_url + "/embeddings", json={"input": [1, 2]}) as r:
            assert r.status == 400


async def test_dedup_through_the_simulated_model_folds_rewordings_and_keeps_other_rules() -> None:
    d = NearDuplicates(SimEmbedder(), threshold=DEFAULT_THRESHOLD)
    ops = [AddOp(section="s", content=insight_content(k, v)) for k, v in
           [("FX-0003", 0), ("FX-0004", 0), ("FX-0003", 2), ("FX-0003", 4), ("FX-0004", 1)]]  # fmt: skip
    folded, stats = await d.fold(ops)
    keys = [op.content.split("FX-")[1][:4] for op in folded if isinstance(op, AddOp)]
    assert set(keys) == {"0003", "0004"}  # never two different rules merged
    assert len(keys) < len(ops) and stats.merged == len(ops) - len(keys)
