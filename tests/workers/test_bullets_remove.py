"""An operator's ``remove`` naming several bullets (``Control.bullet_ids``; the closed loop's bad version) makes
exactly one next version without all of them; a record naming a bullet that is not there changes nothing."""

from __future__ import annotations

from combee.models import Bullet, Playbook, Provenance
from combee.store import PublishedPrompt
from streams.codec import encode
from streams.envelopes import Control
from tests.fakes import ScriptedLLM, echo_script
from tests.workers.test_stages import Event, MemoryKafka, Msg, Stream, deltas, learner
from workers.combine import handle_partial
from workers.context import StageContext

NS = "rm"


def _bullet(n: int, content: str) -> Bullet:
    prov = Provenance(window_id="w0", version=1)
    return Bullet(id=f"b{n:05d}", section="s", content=content, created=prov, updated=prov)


OLD = Playbook(namespace=NS, version=1, next_id=4, bullets=(
    _bullet(1, "Rule FX-0001 applies."), _bullet(2, "Check the units."), _bullet(3, "Rule FX-0002 applies."),
))  # fmt: skip


class Store:
    async def get_version(self, namespace: str, version: int) -> PublishedPrompt | None:
        return PublishedPrompt(namespace, version, "old prompt", OLD.model_dump_json()) if version == 1 else None


async def deliver(ctx: StageContext, kafka: MemoryKafka, stream: Stream, ctrl: Control) -> None:
    part, value = ctx.home_partition(NS), encode(ctrl)
    offset = await kafka.send(ctx.topics.partials, NS.encode(), value, part)
    await handle_partial(ctx, stream, Event(Msg(ctx.topics.partials, part, offset, NS.encode(), value)))


async def test_a_remove_of_several_bullets_is_one_version() -> None:
    kafka = MemoryKafka()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    ctx.store = Store()  # type: ignore[assignment]
    stream = Stream()
    await deliver(ctx, kafka, stream, Control(namespace=NS, kind="rollback", to_version=1, requested_at=1.0))
    unknown = Control(namespace=NS, kind="remove", bullet_ids=("b00001", "b00009"), requested_at=2.0)
    await deliver(ctx, kafka, stream, unknown)
    assert len(deltas(kafka, ctx.topics)) == 1  # b00009 is not there: nothing removed, no version
    several = Control(namespace=NS, kind="remove", bullet_ids=("b00001", "b00003"), actor="ana", requested_at=3.0)
    await deliver(ctx, kafka, stream, several)
    records = deltas(kafka, ctx.topics)
    assert len(records) == 2
    removed = records[-1]
    assert removed.window_id == f"{NS}/remove/b00001+1@v2" and removed.note == "remove b00001+1 by ana"
    assert removed.playbook is not None and [b.id for b in removed.playbook.bullets] == ["b00002"]
    assert len(stream.acked) == 3 and ctx.acks.pending() == 0
