"""Verified producers in a bullet's provenance: apply records them, duplicates merge them, ``prompt diff`` shows
them, and records written before they existed still load (empty)."""

from __future__ import annotations

import json

from combee.corroborate import Corroboration, PendingLesson, corroborate
from combee.models import AddOp, Bullet, Delta, Playbook, Provenance, UpdateOp
from combee.playbook import apply_delta
from combee.promptdiff import VersionRecord, diff_versions, render_diff
from streams.codec import decode
from streams.envelopes import DeltaRecord, WindowEnvelope, WindowPlan

NS = "support"


def delta(ops: tuple, verified: dict[str, str], base: int = 0) -> Delta:
    return Delta(namespace=NS, window_id=f"w{base}", base_version=base, ops=ops, verified_producers=verified)


def test_apply_records_the_verified_producers_of_the_traces_an_operation_cites() -> None:
    ops = (
        AddOp(section="refunds", content="check the order total first", sources=("t1", "t2")),
        AddOp(section="refunds", content="quote the refund policy", sources=("t3",)),
    )
    v1, _ = apply_delta(Playbook(namespace=NS), delta(ops, {"t1": "agent-1", "t2": "agent-2"}))
    assert [b.verified_producers for b in v1.bullets] == [("agent-1", "agent-2"), ()]
    again = (UpdateOp(bullet_id="b00002", content="quote the refund policy", sources=("t9",)),)  # a confirmation
    v2, _ = apply_delta(v1, delta(again, {"t9": "agent-3"}, base=1))
    assert v2.bullets[1].verified_producers == ("agent-3",)
    assert v2.bullets[0].verified_producers == ("agent-1", "agent-2")  # untouched


def test_a_duplicate_folded_into_a_kept_bullet_gives_it_its_producers() -> None:
    ops = (AddOp(section="refunds", content="check the order total first", sources=("t1",)),)
    v1, _ = apply_delta(Playbook(namespace=NS), delta(ops, {"t1": "agent-1"}))
    dup = (AddOp(section="refunds", content="Check the order total first!", sources=("t2",)),)
    v2, stats = apply_delta(v1, delta(dup, {"t2": "agent-2"}, base=1))
    assert stats.deduplicated == 1
    assert [b.verified_producers for b in v2.bullets] == [("agent-1", "agent-2")]


def test_prompt_diff_names_the_verified_producers() -> None:
    ops = (AddOp(section="refunds", content="check the order total first", sources=("t1",)),)
    v1, _ = apply_delta(Playbook(namespace=NS), delta(ops, {"t1": "agent-1"}))
    diff = diff_versions([VersionRecord(0, Playbook(namespace=NS)), VersionRecord(1, v1, "w0")], 0, 1)
    assert diff.changes[0].producers == ("agent-1",)
    assert "verified producers: agent-1" in render_diff(diff)
    assert "    verified producers: agent-1\n" in render_diff(diff, full=True)
    unsigned, _ = apply_delta(Playbook(namespace=NS), delta(ops, {}))
    plain = diff_versions([VersionRecord(0, Playbook(namespace=NS)), VersionRecord(1, unsigned, "w0")], 0, 1)
    assert "verified producers" not in render_diff(plain) + render_diff(plain, full=True)


def test_records_written_before_identity_existed_still_load() -> None:
    prov = {"window_id": "w", "version": 1}
    old_bullet = {"id": "b00001", "section": "s", "content": "c", "created": prov, "updated": prov}
    assert Bullet.model_validate(old_bullet).verified_producers == ()
    old_delta = {"namespace": NS, "window_id": "w", "base_version": 0, "ops": []}
    assert Delta.model_validate(old_delta).verified_producers == {}
    record = {
        "schema": "combee.delta/1", "namespace": NS, "version": 1, "window_id": "w", "seq": 0,
        "delta": old_delta, "trace_count": 0, "entries": 1, "applied_at": 1.0,
    }  # fmt: skip
    assert isinstance(decode(json.dumps(record).encode()), DeltaRecord)
    window = {
        "schema": "combee.window/1", "window_id": "w", "namespace": NS, "source": "p0", "first_offset": 0,
        "last_offset": 0, "offsets": [0], "seed_key": "w", "closed_by": "size", "traces": [], "closed_at": 1.0,
    }  # fmt: skip
    env = decode(json.dumps(window).encode())
    assert isinstance(env, WindowEnvelope) and env.verified_producers == {}
    assert WindowPlan.model_fields["verified_producers"].default_factory is dict
    assert Bullet(id="b00001", section="s", content="c", created=Provenance(**prov), updated=Provenance(**prov))


def test_a_pending_lesson_keeps_its_verified_producers_until_it_goes_live() -> None:
    policy = Corroboration(min_traces=2)
    lesson = "check the order total first"
    first = corroborate(
        (AddOp(section="refunds", content=lesson, sources=("t1",)),), (), Playbook(namespace=NS), policy,
        window_id="w1", at=1.0, producers={"t1": "agent-1"}, verified={"t1": "agent-1"},
    )  # fmt: skip
    assert first.ops == () and first.pending[0].verified == {"t1": "agent-1"} and first.verified == {}
    second = corroborate(
        (AddOp(section="refunds", content=lesson, sources=("t2",)),), first.pending, Playbook(namespace=NS), policy,
        window_id="w2", at=2.0, producers={"t2": "bob"}, verified={},
    )  # fmt: skip
    assert len(second.ops) == 1 and second.verified == {"t1": "agent-1"}  # bob only claims: not verified
    stored = {"id": "p0123456789ab", "namespace": NS, "op": "ADD", "first_window": "w", "last_window": "w",
              "held_at": 1.0, "supported_at": 1.0}  # fmt: skip
    assert PendingLesson.model_validate(stored).verified == {}  # a pool entry written before identity
