"""Control records are authenticated (issue 26 item 1): a combiner holding COMBEE_CONTROL_KEY applies a rollback
only when it is signed with that key; anything else is dead-lettered, counted and acked, and changes nothing."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import pytest

from combee.metrics import NoMetrics
from combee.models import Playbook
from combee.store import PublishedPrompt
from streams.codec import decode, encode
from streams.control_auth import BAD_SIGNATURE, UNSIGNED, canonical, refusal, sign
from streams.envelopes import Control, DeadLetter
from tests.fakes import ScriptedLLM, echo_script
from tests.workers.test_stages import Event, MemoryKafka, Msg, Stream, deltas, learner
from workers.combine import handle_partial
from workers.context import StageContext

NS = "ctl"
KEY = b"the operators' control key"
OLD = Playbook(namespace=NS, version=1, next_id=7)


class Store:
    async def get_version(self, namespace: str, version: int) -> PublishedPrompt | None:
        return PublishedPrompt(namespace, version, "old prompt", OLD.model_dump_json()) if version == 1 else None


class Counted(NoMetrics):
    def __init__(self) -> None:
        self.refused: list[str] = []

    def control_refused(self, reason: str) -> None:
        self.refused.append(reason)


def rollback(to_version: int = 1) -> Control:
    return Control(namespace=NS, kind="rollback", to_version=to_version, requested_at=1_800_000_000.0)


def worker(key: bytes | None) -> tuple[StageContext, MemoryKafka, Counted]:
    kafka, metrics = MemoryKafka(), Counted()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    ctx.config = dataclasses.replace(ctx.config, control_key=key)
    ctx.store, ctx.metrics = Store(), metrics  # type: ignore[assignment]
    return ctx, kafka, metrics


async def deliver(ctx: StageContext, kafka: MemoryKafka, stream: Stream, value: bytes) -> None:
    part = ctx.home_partition(NS)
    offset = await kafka.send(ctx.topics.partials, NS.encode(), value, part)
    await handle_partial(ctx, stream, Event(Msg(ctx.topics.partials, part, offset, NS.encode(), value)))


def test_a_signature_covers_every_field_and_only_the_key_makes_it() -> None:
    signed = sign(rollback(), KEY)
    assert signed.signature is not None and refusal(signed, KEY) is None
    assert b'"signature"' not in canonical(signed) and canonical(signed) == canonical(rollback())
    assert refusal(rollback(), KEY)[0] == UNSIGNED  # type: ignore[index]
    assert refusal(sign(rollback(), b"another key"), KEY)[0] == BAD_SIGNATURE  # type: ignore[index]
    moved = signed.model_copy(update={"to_version": 2})  # a valid record, re-pointed by whoever can write
    assert refusal(moved, KEY)[0] == BAD_SIGNATURE  # type: ignore[index]
    assert refusal(rollback(), None) is None  # no key: nothing to check (docs/security.md)


async def test_a_combiner_with_the_key_refuses_unsigned_and_forged_rollbacks() -> None:
    ctx, kafka, metrics = worker(KEY)
    stream = Stream()
    forged = sign(rollback(), b"a guessed key")
    moved = sign(rollback(), KEY).model_copy(update={"requested_at": time.time()})
    for ctrl in (rollback(), forged, moved):
        await deliver(ctx, kafka, stream, encode(ctrl))
    assert deltas(kafka, ctx.topics) == []  # no rollback was applied
    letters = [decode(m.value or b"") for m in kafka.records(ctx.topics.deadletter)]
    assert all(isinstance(x, DeadLetter) and x.stage == "combine" for x in letters)
    assert ["not signed" in x.reason for x in letters] == [True, False, False]  # type: ignore[union-attr]
    assert metrics.refused == [UNSIGNED, BAD_SIGNATURE, BAD_SIGNATURE]
    assert len(stream.acked) == 3 and ctx.acks.pending() == 0

    await deliver(ctx, kafka, stream, encode(sign(rollback(), KEY)))
    applied = deltas(kafka, ctx.topics)
    assert [(r.rollback_to, r.version) for r in applied] == [(1, 1)]
    assert applied[0].playbook is not None and applied[0].playbook.next_id == OLD.next_id


async def test_a_combiner_without_a_key_applies_an_unsigned_rollback() -> None:
    ctx, kafka, metrics = worker(None)
    await deliver(ctx, kafka, Stream(), encode(rollback()))
    assert [r.rollback_to for r in deltas(kafka, ctx.topics)] == [1] and metrics.refused == []


@pytest.mark.parametrize("key", [KEY, None])
def test_combee_prompt_rollback_signs_with_the_configured_key(
    monkeypatch: pytest.MonkeyPatch, key: bytes | None
) -> None:
    import argparse

    import kafka

    import streams.kafka_config
    from combee.cli import prompt
    from combee.settings import Settings

    sent: list[bytes] = []

    class Producer:
        def __init__(self, **_: object) -> None: ...

        def send(self, topic: str, key: bytes, value: bytes) -> Producer:
            sent.append(value)
            return self

        def get(self, timeout: float) -> None: ...

        def close(self) -> None: ...

    class Client:
        versions = iter([2, 3])

        def get(self) -> PublishedPrompt:
            return PublishedPrompt(NS, next(self.versions), "p", "{}")

        def watch(self, timeout: float, after: int) -> Iterator[PublishedPrompt]:
            yield self.get()

    monkeypatch.setattr(kafka, "KafkaProducer", Producer)
    monkeypatch.setattr(streams.kafka_config, "require_kafka", lambda settings: None)
    settings = Settings(control_key=key.decode() if key else None)  # type: ignore[arg-type]
    args = argparse.Namespace(namespace=NS, to=1, timeout=5.0)
    assert prompt._rollback(settings, Client(), args) == 0  # type: ignore[arg-type]
    ctrl = decode(sent[0])
    assert isinstance(ctrl, Control) and ctrl.to_version == 1
    assert refusal(ctrl, KEY) is None if key else ctrl.signature is None
