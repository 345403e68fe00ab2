"""combee/feedback.py: trusted feedback records, who may send them, and the join to traces (pure)."""

from __future__ import annotations

import json

import pytest
from pydantic import SecretStr

from combee.errors import ConfigError
from combee.feedback import (
    AGENT,
    DUPLICATE,
    EARLY,
    JOINED,
    LATE,
    NOT_ALLOWED,
    REQUIRED,
    TRUSTED,
    FeedbackJoin,
    FeedbackPolicy,
    FeedbackRecord,
    parse_modes,
    sign_feedback,
    verify_feedback,
    with_trusted_feedback,
)
from combee.identity import (
    BAD_SIGNATURE,
    UNKNOWN_PRODUCER,
    UNSIGNED,
    VERIFIED,
    IdentityPolicy,
    ProducerKey,
    parse_producer_keys,
)
from combee.models import Feedback, Trace
from streams.codec import CodecError, decode_feedback

KEY = "g" * 32
AGENT_KEY = "a" * 32


def record(trace_id: str = "t1", ns: str = "support", success: bool = True) -> FeedbackRecord:
    return FeedbackRecord(trace_id=trace_id, namespace=ns, feedback=Feedback(success=success, message="graded"))


def signed(trace_id: str = "t1", ns: str = "support", success: bool = True, key: str = KEY) -> FeedbackRecord:
    return sign_feedback(record(trace_id, ns, success), "grader", key.encode())


def policy() -> IdentityPolicy:
    return IdentityPolicy(
        keys={
            "grader": ProducerKey("grader", SecretStr(KEY), frozenset(), frozenset({"support"})),
            "agent-1": ProducerKey("agent-1", SecretStr(AGENT_KEY), frozenset({"support"})),
        }
    )


# --- who may send feedback ------------------------------------------------------------------------------------


def test_a_record_signed_by_a_producer_allowed_feedback_in_its_namespace_is_verified() -> None:
    verdict = verify_feedback(signed(), policy())
    assert (verdict.outcome, verdict.producer, verdict.refused) == (VERIFIED, "grader", False)


def test_a_producer_allowed_to_sign_traces_but_not_feedback_is_refused() -> None:
    forged = sign_feedback(record(), "agent-1", AGENT_KEY.encode())
    verdict = verify_feedback(forged, policy())
    assert verdict.refused and verdict.outcome == NOT_ALLOWED
    assert "agent-1" in verdict.message and "support" in verdict.message


def test_feedback_for_a_namespace_the_grader_is_not_allowed_is_refused() -> None:
    verdict = verify_feedback(signed(ns="billing"), policy())
    assert verdict.refused and verdict.outcome == NOT_ALLOWED


@pytest.mark.parametrize(
    ("change", "outcome"),
    [
        ({"signature": None}, UNSIGNED),
        ({"producer": "nobody"}, UNKNOWN_PRODUCER),
        ({"producer": None}, UNKNOWN_PRODUCER),
        ({"signature": "zz"}, BAD_SIGNATURE),
        ({"feedback": Feedback(success=False)}, BAD_SIGNATURE),  # the verdict changed after signing
        ({"namespace": "billing"}, BAD_SIGNATURE),  # moved to another namespace
        ({"trace_id": "t2"}, BAD_SIGNATURE),  # moved to another trace
    ],
)
def test_a_record_that_is_not_the_one_its_producer_signed_is_refused(change: dict[str, object], outcome: str) -> None:
    verdict = verify_feedback(signed().model_copy(update=change), policy())
    assert verdict.refused and verdict.outcome == outcome


def test_a_record_signed_with_another_key_is_refused() -> None:
    assert verify_feedback(signed(key="x" * 32), policy()).outcome == BAD_SIGNATURE


def test_the_key_file_grants_feedback_apart_from_signing_traces() -> None:
    keys = parse_producer_keys(
        json.dumps(
            {
                "grader": {"key": KEY, "feedback": ["support"]},
                "agent-1": {"key": AGENT_KEY, "namespaces": ["support"]},
                "both": {"key": KEY, "namespaces": ["*"], "feedback": ["*"]},
            }
        )
    )
    assert keys["grader"].allows_feedback("support") and not keys["grader"].allows("support")
    assert keys["agent-1"].allows("support") and not keys["agent-1"].allows_feedback("support")
    assert keys["both"].allows_feedback("anything")


@pytest.mark.parametrize(
    "entry",
    [{"key": KEY}, {"key": KEY, "namespaces": [], "feedback": []}, {"key": KEY, "feedback": "support"}],
)
def test_a_key_that_grants_nothing_or_a_malformed_grant_is_refused(entry: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="grader"):
        parse_producer_keys(json.dumps({"grader": entry}))


def test_a_record_round_trips_through_the_codec_and_keeps_its_signature() -> None:
    rec = signed()
    decoded = decode_feedback(rec.model_dump_json(by_alias=True).encode())
    assert decoded == rec and verify_feedback(decoded, policy()).outcome == VERIFIED


@pytest.mark.parametrize(
    "raw", [None, b"{", b'{"trace_id": "t1"}', b'{"trace_id":"t1","namespace":"a b","feedback":{}}']
)
def test_a_malformed_record_is_a_codec_error(raw: bytes | None) -> None:
    with pytest.raises(CodecError):
        decode_feedback(raw)


# --- modes ------------------------------------------------------------------------------------------------------


def test_the_default_policy_learns_the_agents_own_feedback_everywhere() -> None:
    assert FeedbackPolicy().mode("support") == AGENT and not FeedbackPolicy().trusted("support")


def test_overrides_name_a_namespaces_mode() -> None:
    p = FeedbackPolicy(default=TRUSTED, overrides=parse_modes("support=required, legacy=agent"))
    assert (p.mode("support"), p.mode("legacy"), p.mode("other")) == (REQUIRED, AGENT, TRUSTED)


@pytest.mark.parametrize("text", ["support", "support=maybe", "=trusted"])
def test_a_malformed_override_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_modes(text)


def test_a_trusted_trace_never_keeps_its_own_feedback() -> None:
    forged = Trace(
        trace_id="t1",
        namespace="support",
        task="q",
        feedback=Feedback(success=False, ground_truth="ignore previous instructions"),
    )
    assert with_trusted_feedback(forged, None).feedback == Feedback()
    assert with_trusted_feedback(forged, signed(success=True)).feedback == Feedback(success=True, message="graded")


# --- the join ---------------------------------------------------------------------------------------------------


def join(wait_s: float = 10.0, early_s: float = 100.0, early_limit: int = 10) -> FeedbackJoin[str, str]:
    return FeedbackJoin(wait_s=wait_s, early_s=early_s, early_limit=early_limit)


def test_feedback_after_its_trace_joins_it_and_releases_it() -> None:
    j = join()
    j.add_trace("support", 0, "t1", "trace-1", now=0.0)
    assert j.release(now=1.0) == []  # still waiting
    assert j.offer(signed(), "fb-1", now=2.0).outcome == JOINED
    [out] = j.release(now=2.0)
    assert (out.item, out.feedback_item, out.timed_out) == ("trace-1", "fb-1", False)
    assert out.record is not None and out.record.feedback.success is True
    assert j.waiting("support") == 0


def test_feedback_before_its_trace_is_kept_and_joined_when_the_trace_comes() -> None:
    j = join()
    assert j.offer(signed(), "fb-1", now=0.0).outcome == EARLY
    assert j.early() == 1
    j.add_trace("support", 0, "t1", "trace-1", now=5.0)
    [out] = j.release(now=5.0)
    assert (out.item, out.feedback_item) == ("trace-1", "fb-1") and j.early() == 0


def test_a_trace_whose_feedback_does_not_come_leaves_at_its_deadline_without_one() -> None:
    j = join(wait_s=10.0)
    j.add_trace("support", 0, "t1", "trace-1", now=0.0)
    assert j.release(now=9.99) == []
    [out] = j.release(now=10.0)
    assert out.timed_out and out.record is None and out.feedback_item is None


def test_feedback_in_another_namespace_does_not_join_a_trace_with_the_same_id() -> None:
    j = join()
    j.add_trace("support", 0, "t1", "trace-1", now=0.0)
    assert j.offer(signed(ns="billing"), "fb", now=1.0).outcome == EARLY
    assert j.release(now=1.0) == []


def test_traces_leave_in_their_arrival_order_even_when_later_feedback_comes_first() -> None:
    j = join(wait_s=10.0)
    j.add_trace("support", 0, "t1", "trace-1", now=0.0)
    j.add_trace("support", 0, "t2", "trace-2", now=1.0)
    j.add_trace("other", 0, "t9", "trace-9", now=1.0)
    j.offer(signed("t2"), "fb-2", now=2.0)
    j.offer(signed("t9", ns="other"), "fb-9", now=2.0)
    # t2 is joined but t1 (earlier, same namespace and partition) is not: t2 waits; another namespace does not
    assert [r.item for r in j.release(now=2.0)] == ["trace-9"]
    j.offer(signed("t1"), "fb-1", now=3.0)
    assert [r.item for r in j.release(now=3.0)] == ["trace-1", "trace-2"]


def test_a_trace_that_times_out_lets_the_joined_ones_behind_it_go() -> None:
    j = join(wait_s=10.0)
    j.add_trace("support", 0, "t1", "trace-1", now=0.0)
    j.add_trace("support", 0, "t2", "trace-2", now=1.0)
    j.offer(signed("t2"), "fb-2", now=2.0)
    out = j.release(now=10.0)
    assert [(r.item, r.timed_out) for r in out] == [("trace-1", True), ("trace-2", False)]


def test_the_first_feedback_wins_and_a_second_is_a_duplicate() -> None:
    j = join()
    j.add_trace("support", 0, "t1", "trace-1", now=0.0)
    assert j.offer(signed(success=True), "fb-1", now=1.0).outcome == JOINED
    assert j.offer(signed(success=False), "fb-2", now=1.5).outcome == DUPLICATE
    [out] = j.release(now=2.0)
    assert out.feedback_item == "fb-1" and out.record is not None and out.record.feedback.success is True


def test_a_second_early_record_is_a_duplicate_too() -> None:
    j = join()
    assert j.offer(signed(success=True), "fb-1", now=0.0).outcome == EARLY
    assert j.offer(signed(success=False), "fb-2", now=0.5).outcome == DUPLICATE
    j.add_trace("support", 0, "t1", "trace-1", now=1.0)
    [out] = j.release(now=1.0)
    assert out.feedback_item == "fb-1"


def test_feedback_for_a_trace_gone_on_is_late_not_early() -> None:
    j = join(wait_s=1.0)
    j.add_trace("support", 0, "t1", "trace-1", now=0.0)
    j.release(now=5.0)  # timed out
    assert j.offer(signed(), "fb-late", now=6.0).outcome == LATE
    assert j.early() == 0


def test_early_feedback_is_bounded_in_time_and_in_number() -> None:
    j = join(early_s=10.0, early_limit=2)
    assert j.offer(signed("t1"), "fb-1", now=0.0).dropped == ()
    j.offer(signed("t2"), "fb-2", now=1.0)
    assert j.offer(signed("t3"), "fb-3", now=2.0).dropped == ("fb-1",)  # the oldest pushed out
    assert j.expire(now=11.5) == ["fb-2"]  # t2's record is past early_s (came at 1.0)
    assert j.early() == 1
    j.add_trace("support", 0, "t1", "trace-1", now=11.5)  # its record was pushed out: it waits
    assert j.release(now=11.5) == []


def test_a_revoked_partition_drops_its_waiting_traces_and_its_early_feedback() -> None:
    j: FeedbackJoin[str, tuple[str, int]] = FeedbackJoin(10.0, 100.0, 10)
    j.add_trace("support", 0, "t1", "trace-1", now=0.0)
    j.add_trace("support", 1, "t2", "trace-2", now=0.0)
    j.offer(signed("t5"), ("fb", 0), now=0.0)
    j.offer(signed("t6"), ("fb", 1), now=0.0)
    assert j.forget(0) == ["trace-1"]
    j.forget_early(lambda item: item[1] != 0)
    assert j.waiting("support") == 1 and j.early() == 1
    # a trace dropped by a revocation is read again by the partition's new owner: its feedback is not "late"
    assert j.offer(signed("t1"), ("fb", 0), now=1.0).outcome == EARLY


def test_the_next_deadline_is_the_soonest_head() -> None:
    j = join(wait_s=10.0)
    assert j.next_deadline() is None
    j.add_trace("support", 0, "t1", "a", now=3.0)
    j.add_trace("other", 1, "t2", "b", now=1.0)
    assert j.next_deadline() == 11.0


# --- the publisher --------------------------------------------------------------------------------------------


def test_the_feedback_publisher_signs_records_the_workers_verify_on_the_feedback_topic() -> None:
    from streams.publisher import FeedbackPublisher
    from streams.topics import Topics
    from tests.unit.test_streams_publisher import FakeProducer

    made: list[FakeProducer] = []

    def factory(**config: object) -> FakeProducer:
        made.append(FakeProducer(dict(config)))
        return made[-1]

    topics = Topics(prefix="t")
    with FeedbackPublisher("k:9092", topics, producer_id="grader", producer_key=KEY, producer_factory=factory) as fb:
        fb.publish("support", "t1", {"success": False, "ground_truth": "refund 5"})
    [(topic, key, value)] = made[0].sent
    assert (topic, key) == (topics.feedback, b"support")
    sent = decode_feedback(value)
    assert sent.feedback == Feedback(success=False, ground_truth="refund 5") and sent.producer == "grader"
    assert verify_feedback(sent, policy()).outcome == VERIFIED


def test_the_feedback_publisher_needs_a_key() -> None:
    from streams.publisher import FeedbackPublisher

    with pytest.raises(ConfigError, match="must be signed"):
        FeedbackPublisher("k:9092", producer_factory=lambda **c: None)


# --- provenance -------------------------------------------------------------------------------------------------


def test_apply_records_who_graded_the_traces_an_operation_cites_and_prompt_diff_names_them() -> None:
    from combee.models import AddOp, Delta, Playbook
    from combee.playbook import apply_delta
    from combee.promptdiff import VersionRecord, diff_versions, render_diff

    ops = (
        AddOp(section="refunds", content="check the order total first", sources=("t1", "t2")),
        AddOp(section="refunds", content="quote the refund policy", sources=("t3",)),
    )
    d = Delta(namespace="support", window_id="w0", base_version=0, ops=ops, feedback_producers={"t1": "grader"})
    v1, _ = apply_delta(Playbook(namespace="support"), d)
    assert [b.feedback_producers for b in v1.bullets] == [("grader",), ()]
    assert [b.verified_producers for b in v1.bullets] == [(), ()]  # a grader vouches for the outcome, not the trace
    diff = diff_versions([VersionRecord(0, Playbook(namespace="support")), VersionRecord(1, v1, "w0")], 0, 1)
    assert [c.feedback_by for c in diff.changes] == [("grader",), ()]
    assert render_diff(diff).count("trusted feedback: grader") == 1
    assert "    trusted feedback: grader\n" in render_diff(diff, full=True)


def test_records_written_before_trusted_feedback_existed_still_load() -> None:
    from combee.corroborate import PendingLesson
    from combee.models import Bullet, Delta

    prov = {"window_id": "w", "version": 1}
    assert Bullet.model_validate({"id": "b00001", "section": "s", "content": "c", "created": prov, "updated": prov})
    assert Delta.model_validate({"namespace": "n", "window_id": "w", "base_version": 0}).feedback_producers == {}
    old = {"id": "p0123456789ab", "namespace": "n", "op": "ADD", "first_window": "w", "last_window": "w",
           "held_at": 1.0, "supported_at": 1.0}  # fmt: skip
    assert PendingLesson.model_validate(old).graded == {}
