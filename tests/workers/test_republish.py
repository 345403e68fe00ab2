"""Redis restarted without its data: the owner of a namespace publishes its newest version again by itself.

Found by the fault suite (a Redis restart that loses its data): the publisher remembers what it published and
refuses older-or-equal offers, so a namespace that learned nothing new after the restart stayed without a
prompt in Redis. The learner's status loop now notices and re-offers (compare-and-set keeps it harmless).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from combee.store import PublishedPrompt
from streams.redis_publisher import LatestVersionPublisher
from tests.fakes import ScriptedLLM, echo_script
from tests.workers.test_stages import MemoryKafka, Stream, feed_traces, learner, run_until_quiet
from workers.status import republish_if_lost


@dataclass
class DictStore:
    versions: dict[str, tuple[int, str]] = field(default_factory=dict)

    async def publish(self, namespace: str, version: int, prompt: str, playbook_json: str, **kw: Any) -> bool:
        if version <= self.versions.get(namespace, (0, ""))[0]:
            return False
        self.versions[namespace] = (version, prompt)
        return True

    async def current(self, namespace: str) -> PublishedPrompt | None:
        if namespace not in self.versions:
            return None
        version, prompt = self.versions[namespace]
        return PublishedPrompt(namespace=namespace, version=version, prompt=prompt, playbook_json="{}")


async def test_a_version_redis_lost_is_published_again_and_a_present_one_is_left_alone() -> None:
    kafka, stream, seen = MemoryKafka(), Stream(), set()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    store = DictStore()
    ctx.store, ctx.publisher = store, LatestVersionPublisher(store)
    await feed_traces(ctx, kafka, stream, "alpha", 6)
    await run_until_quiet(ctx, kafka, stream, seen)
    await ctx.publisher.run(until_idle=True)
    version = ctx.snapshots.get("alpha").playbook.version  # type: ignore[union-attr]
    assert store.versions["alpha"][0] == version >= 1
    rt = ctx.runtime("alpha")
    assert not await republish_if_lost(ctx, rt)  # Redis has it: nothing to do
    store.versions.clear()  # Redis restarts empty
    assert await republish_if_lost(ctx, rt)
    await ctx.publisher.run(until_idle=True)
    assert store.versions["alpha"][0] == version


async def test_the_status_loop_never_republishes_a_version_without_its_provenance() -> None:
    """Found by the UI's browser test: a version reached Redis with no window and no provenance. Between caching
    a new snapshot and offering its version, the combiner awaited the checkpoint write; the status loop ran
    then, saw a snapshot newer than Redis and nothing pending, and offered it with empty meta, and the real
    offer of the same version was refused as not newer."""
    kafka, stream, seen = MemoryKafka(), Stream(), set()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    published: dict[int, dict[str, Any]] = {}

    class RecordingStore(DictStore):
        async def publish(self, namespace: str, version: int, prompt: str, playbook_json: str, **kw: Any) -> bool:
            published[version] = kw
            return await super().publish(namespace, version, prompt, playbook_json, **kw)

    store = RecordingStore()
    ctx.store, ctx.publisher = store, LatestVersionPublisher(store)
    raced: list[bool] = []
    put_raw = ctx.snapshots.put_raw

    async def put_raw_with_status_loop(*args: Any, **kwargs: Any) -> Any:
        raced.append(await republish_if_lost(ctx, ctx.runtime("alpha")))  # the status loop gets the turn here
        return await put_raw(*args, **kwargs)

    ctx.snapshots.put_raw = put_raw_with_status_loop  # type: ignore[method-assign]
    await feed_traces(ctx, kafka, stream, "alpha", 6)
    await run_until_quiet(ctx, kafka, stream, seen)
    await ctx.publisher.run(until_idle=True)
    assert raced and not any(raced)  # every time it looked, the new version was already offered
    assert published and all(kw.get("window_id") and kw.get("meta") for kw in published.values())
