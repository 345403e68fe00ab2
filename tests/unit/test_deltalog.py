"""The deltas log's fencing rule (streams/deltalog.py), checked with hypothesis against a model of owners.

The model: several combiners take turns at one partition in any interleaving a scheduler could produce. A
combiner that claims appends a Claim and learns the log up to its claim by the rule (the replay); then, as
long as it lives — superseded or not, it cannot tell — it applies windows it has not seen applied, each at
most once, appending a record per window with its epoch and its next version. Some writers predate claims
(no epoch). Whatever the interleaving, the records the rule calls valid must hold each window once, with
versions 1, 2, 3, … in log order; a writer's own check (no other claim between its claim and its record)
must agree with the rule; and a reader starting from any position, given the epoch in force there, must
agree with one reading from the start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from combee.models import Delta, Playbook
from streams.codec import encode
from streams.deltalog import (
    ClaimTracker,
    Position,
    decode_checkpoint,
    encode_checkpoint,
    replay_start,
    split_log,
    valid_records,
)
from streams.envelopes import Claim, DeltaRecord, Snapshot

WINDOWS = [f"ns/p0/{i}" for i in range(8)]


def record(window: str, version: int, epoch: int | None) -> DeltaRecord:
    return DeltaRecord(
        namespace="ns",
        version=version,
        window_id=window,
        seq=version - 1,
        delta=Delta(namespace="ns", window_id=window, base_version=version - 1),
        trace_count=1,
        entries=0,
        applied_at=0.0,
        epoch=epoch,
    )


@dataclass
class Owner:
    epoch: int | None = None
    known: list[str] = field(default_factory=list)  # windows applied as far as this owner knows, in order
    mine: list[int] = field(default_factory=list)  # offsets of the records it appended

    def next_version(self) -> int:
        return len(self.known) + 1


Step = tuple[int, str, int]  # (owner, "claim" | "append", window choice)

steps = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(["claim", "append", "append", "append"]), st.integers(0, 7)),
    max_size=60,
)


def run(schedule: list[Step], legacy: int) -> tuple[list[Claim | DeltaRecord], list[Owner]]:
    """Play a schedule; ``legacy`` records first come from a writer that predates claims (owner 0, no epoch)."""
    log: list[Claim | DeltaRecord] = []
    owners = [Owner() for _ in range(4)]
    for i in range(legacy):  # an old worker, before the upgrade: no claim, no epoch
        owners[0].known.append(WINDOWS[i])
        log.append(record(WINDOWS[i], i + 1, None))
        owners[0].mine.append(len(log) - 1)
    for who, action, choice in schedule:
        me = owners[who]
        if action == "claim":
            log.append(Claim(partition=0, owner=f"o{who}", claimed_at=0.0))
            me.epoch = len(log) - 1
            valid, _ = valid_records(enumerate(log))  # the replay up to and including its own claim
            me.known = [r.window_id for r in valid]
            continue
        if me.epoch is None and who != 0:
            continue  # never claimed: not a combiner yet
        todo = [w for w in WINDOWS if w not in me.known]
        if not todo:
            continue
        window = todo[choice % len(todo)]
        log.append(record(window, me.next_version(), me.epoch))
        me.known.append(window)
        me.mine.append(len(log) - 1)
    return log, owners


@settings(max_examples=400, deadline=None)
@given(schedule=steps, legacy=st.integers(0, 3))
def test_valid_records_hold_each_window_once_with_consecutive_versions(schedule: list[Step], legacy: int) -> None:
    log, _ = run(schedule, legacy)
    valid, fenced = valid_records(enumerate(log))
    windows = [r.window_id for r in valid]
    assert len(windows) == len(set(windows))
    assert [r.version for r in valid] == list(range(1, len(valid) + 1))
    assert len(valid) + len(fenced) == sum(isinstance(x, DeltaRecord) for x in log)


@settings(max_examples=300, deadline=None)
@given(schedule=steps, legacy=st.integers(0, 3))
def test_a_writers_own_check_agrees_with_the_rule(schedule: list[Step], legacy: int) -> None:
    """What Tenure.check decides (no other claim between my claim and my record) is what every reader sees."""
    log, owners = run(schedule, legacy)
    tracker = ClaimTracker()
    verdicts = [tracker.judge(o, x) for o, x in enumerate(log)]
    for owner in owners:
        for offset in owner.mine:
            rec = log[offset]
            assert isinstance(rec, DeltaRecord)
            if rec.epoch is None:  # a legacy writer: valid while no claim at all precedes it
                expected = not any(isinstance(x, Claim) for x in log[:offset])
            else:
                expected = not any(isinstance(x, Claim) for x in log[rec.epoch + 1 : offset])
            assert (verdicts[offset] == "valid") == expected


@settings(max_examples=300, deadline=None)
@given(schedule=steps, legacy=st.integers(0, 3), cut=st.integers(0, 100))
def test_a_reader_starting_at_a_position_agrees_with_one_from_the_start(
    schedule: list[Step], legacy: int, cut: int
) -> None:
    log, _ = run(schedule, legacy)
    start = cut % (len(log) + 1) - 1  # -1 .. len-1
    tracker = ClaimTracker()
    for offset in range(start + 1):
        tracker.judge(offset, log[offset])
    position = Position(start, tracker.in_force)
    tail_valid, tail_fenced = valid_records(((o, log[o]) for o in range(start + 1, len(log))), position.epoch)
    all_valid, all_fenced = valid_records(enumerate(log))
    after = [r for o, r in enumerate(log) if o > start]
    assert tail_valid == [r for r in all_valid if any(r is x for x in after)]
    assert tail_fenced == [r for r in all_fenced if any(r is x for x in after)]


def test_split_log_judges_partitions_apart_and_counts_what_it_cannot_read() -> None:
    claim = encode(Claim(partition=0, owner="a", claimed_at=0.0))
    entries = [
        (0, 0, encode(record("w0", 1, None))),  # before any claim: valid
        (1, 0, encode(record("w9", 1, 5))),  # partition 1 has no claim: an epoch there is fenced
        (0, 1, claim),
        (0, 2, encode(record("w0", 1, None))),  # an old writer after a claim: fenced
        (0, 3, encode(record("w1", 2, 1))),
        (0, 4, b"not json"),
    ]
    split = split_log(entries)
    assert [(x.partition, x.offset) for x in split.valid] == [(0, 0), (0, 3)]
    assert [(x.partition, x.offset) for x in split.fenced] == [(1, 0), (0, 2)]
    assert [(p, o) for p, o, _ in split.claims] == [(0, 1)]
    assert split.unreadable == 1
    assert [r.window_id for r in split.records("ns")] == ["w0", "w1"]


def test_checkpoints_round_trip_and_old_ones_still_read() -> None:
    assert decode_checkpoint(encode_checkpoint(Position(41, 7))) == Position(41, 7)
    assert decode_checkpoint(b"123") == Position(123, None)  # written before claims existed
    assert decode_checkpoint(b"{oops") == Position(-1, None)  # unreadable: replay everything, never skip


def test_replay_starts_at_the_earliest_point_anything_vouches_for() -> None:
    """A superseded owner's late snapshot can land after its successor's checkpoint: start before both."""
    late = Snapshot(playbook=Playbook(namespace="x"), delta_offset=10, epoch=3, updated_at=0.0)
    fresh = Snapshot(playbook=Playbook(namespace="y"), delta_offset=30, epoch=12, updated_at=0.0)
    assert replay_start(Position(31, 12), [late, fresh]) == Position(10, 3)
    assert replay_start(None, [fresh]) == Position(-1, None)
    assert replay_start(Position(31, 12), [fresh]) == Position(30, 12)
