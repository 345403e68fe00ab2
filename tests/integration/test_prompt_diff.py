"""``combee prompt diff`` and ``combee prompt show`` against the real Redis (issue 15, item 3): two versions
published through the workers' publisher, with the provenance the combiner stores, then compared."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from combee.models import Bullet, Playbook, Provenance
from combee.playbook import render_prompt
from combee.promptdiff import PROVENANCE_KEY, provenance_entry
from streams.keys import RedisKeys
from streams.redis_connection import build_redis
from streams.redis_publisher import LatestVersionPublisher
from streams.redis_store import RedisPromptStore
from tests.integration.streams_support import redis_url_or_skip, unique

pytestmark = [pytest.mark.integration]

NS = "ns-diff"


def _bullet(bid: str, content: str, created: tuple[str, int], updated: tuple[str, int] | None = None) -> Bullet:
    c = Provenance(window_id=created[0], version=created[1])
    u = Provenance(window_id=updated[0], version=updated[1]) if updated else c
    return Bullet(id=bid, section="formulas", content=content, created=c, updated=u)


W1, W2 = f"{NS}/p1/0-2", f"{NS}/p1/3-5"
V1 = Playbook(
    namespace=NS,
    version=1,
    bullets=(_bullet("b00001", "check the units", (W1, 1)), _bullet("b00002", "round at the end", (W1, 1))),
    next_id=3,
)
V2 = Playbook(
    namespace=NS,
    version=2,
    bullets=(
        _bullet("b00002", "round only at the very end", (W1, 1), (W2, 2)),
        _bullet("b00003", "state the period of a rate", (W2, 2)),
    ),
    next_id=4,
)


async def _publish(url: str, prefix: str) -> None:
    redis = build_redis(url)
    try:
        publisher = LatestVersionPublisher(RedisPromptStore(redis, RedisKeys(prefix)))
        for playbook, window, traces in ((V1, W1, ["t0", "t1", "t2"]), (V2, W2, ["t3", "t4", "t5"])):
            meta = {
                "bullets": len(playbook.bullets),
                "traces": len(traces),
                PROVENANCE_KEY: [provenance_entry(playbook.version, window, traces)],
            }  # as workers/combiner/commit.py offers it
            publisher.offer(NS, playbook.version, render_prompt(playbook), playbook.model_dump_json(), window_id=window,
                            meta=meta)  # fmt: skip
            await publisher.run(until_idle=True)
        assert publisher.published == 2
    finally:
        await redis.aclose()


async def _cleanup(url: str, prefix: str) -> None:
    redis = build_redis(url)
    try:
        async for key in redis.scan_iter(match=f"{prefix}:*", count=500):
            await redis.delete(key)
    finally:
        await redis.aclose()


@pytest.fixture
def prefix() -> Iterator[str]:
    url = redis_url_or_skip()
    prefix = unique("test-diff")
    asyncio.run(_publish(url, prefix))
    yield prefix
    asyncio.run(_cleanup(url, prefix))


def combee(prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COMBEE_REDIS_URL": redis_url_or_skip()}
    return subprocess.run(
        [sys.executable, "-m", "combee.cli", "prompt", *args, "--prefix", prefix],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_diff_of_two_published_versions_names_the_window_and_traces_of_each_change(prefix: str) -> None:
    out = combee(prefix, "diff", NS)  # defaults: the previous version -> the current one
    assert out.returncode == 0, out.stderr
    # published without evidence and with no traces on the bullets: the window, its traces counted
    assert out.stdout == (
        f"{NS}: v1 -> v2: 1 added, 1 changed, 1 removed\n"
        "~ [b00002] (formulas) round at the end  →  round only at the very end\n"
        f"    taught by window {W2} (v2); traces 3 in the window\n"
        "+ [b00003] (formulas) state the period of a rate\n"
        f"    taught by window {W2} (v2); traces 3 in the window\n"
        "- [b00001] (formulas) check the units\n"
        f"    removed by window {W2} (v2); traces 3 in the window\n"
    )
    assert "    traces of the window: t3, t4, t5\n" in combee(prefix, "diff", NS, "--full").stdout
    same = combee(prefix, "diff", NS, "--from", "1", "--to", "2", "--json")
    diff = json.loads(same.stdout)
    assert [c["kind"] for c in diff["changes"]] == ["changed", "added", "removed"]
    assert diff["changes"][1]["taught_by"] == {"version": 2, "window_id": W2, "trace_ids": ["t3", "t4", "t5"]}

    first = combee(prefix, "diff", NS, "--to", "1")  # the first version: against the empty playbook
    assert first.stdout.splitlines()[0] == f"{NS}: v0 -> v1: 2 added, 0 changed, 0 removed"
    assert f"taught by window {W1} (v1); traces 3 in the window" in first.stdout

    reversed_ = combee(prefix, "diff", NS, "--from", "2", "--to", "1")
    assert reversed_.returncode == 2 and reversed_.stderr == "combee: error: --from 2 is newer than --to 1\n"

    unknown = combee(prefix, "diff", NS, "--to", "9")
    assert unknown.returncode == 2
    assert unknown.stderr == (
        f"combee: error: {NS}: version 9 is not published or no longer retained (there are versions 1..2)\n"
    )


def test_show_prints_that_versions_prompt(prefix: str) -> None:
    shown = combee(prefix, "show", NS, "--version", "1")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == render_prompt(V1)
    assert f"version 1 · window {W1}" in shown.stderr
    missing = combee(prefix, "show", NS, "--version", "5")
    assert missing.returncode == 2
    assert missing.stderr == (
        f"combee: error: {NS}: version 5 is not published or no longer retained (there are versions 1..2)\n"
    )
