"""Which records of the deltas log count: claims, epochs and fencing. One rule for every reader.

Each partition of ``<prefix>.deltas`` decides who owns it. A combiner that takes a partition first appends a
:class:`~streams.envelopes.Claim` there; the claim's offset is its *epoch*, and every
:class:`~streams.envelopes.DeltaRecord` it appends afterwards carries that epoch. A delta record is **valid**
iff its epoch is the offset of the latest claim before it in its partition; records written before claims
existed carry no epoch and are valid while no claim precedes them. Any other record is **fenced**: its writer
had been superseded when it wrote (a zombie), and it counts for nobody — not for recovery, replay, status,
benchmarks or the fault suite's checks. Why that applies each window at most once: docs/reliability.md,
"Fencing zombie combiners".

A reader that starts in the middle of a partition must know the epoch in force where it starts: a
:class:`Position` (offset, epoch), as snapshots and the combiner's checkpoint record it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from streams.codec import CodecError, decode
from streams.envelopes import Claim, DeltaRecord, Snapshot

__all__ = [
    "ClaimTracker",
    "LogJudge",
    "LogSplit",
    "Logged",
    "Position",
    "Verdict",
    "decode_checkpoint",
    "decode_log_record",
    "encode_checkpoint",
    "replay_start",
    "split_log",
    "valid_records",
]

Verdict = Literal["claim", "valid", "fenced"]


class ClaimTracker:
    """Judges the records of ONE partition, shown in offset order.

    ``in_force`` is the epoch in force just before the first record shown: None at the start of the log, or
    the epoch of the :class:`Position` a reader starts after.
    """

    def __init__(self, in_force: int | None = None) -> None:
        self.in_force = in_force

    def judge(self, offset: int, record: Claim | DeltaRecord) -> Verdict:
        if isinstance(record, Claim):
            self.in_force = offset
            return "claim"
        return "valid" if record.epoch == self.in_force else "fenced"


def valid_records(
    records: Iterable[tuple[int, Claim | DeltaRecord]], in_force: int | None = None
) -> tuple[list[DeltaRecord], list[DeltaRecord]]:
    """One partition's ``(offset, record)`` pairs in offset order → (valid, fenced) delta records, in order."""
    tracker = ClaimTracker(in_force)
    valid: list[DeltaRecord] = []
    fenced: list[DeltaRecord] = []
    for offset, record in records:
        verdict = tracker.judge(offset, record)
        if isinstance(record, DeltaRecord):
            (valid if verdict == "valid" else fenced).append(record)
    return valid, fenced


@dataclass(frozen=True)
class Logged:
    """A delta record and where it lies."""

    partition: int
    offset: int
    record: DeltaRecord


@dataclass
class LogSplit:
    """A deltas log judged record by record (see :func:`split_log`)."""

    valid: list[Logged] = field(default_factory=list)
    fenced: list[Logged] = field(default_factory=list)
    claims: list[tuple[int, int, Claim]] = field(default_factory=list)  # (partition, offset, claim)
    unreadable: int = 0

    def records(self, namespace: str | None = None) -> list[DeltaRecord]:
        """The valid delta records (of ``namespace``), in log order per partition."""
        return [x.record for x in self.valid if namespace is None or x.record.namespace == namespace]

    def fenced_records(self, namespace: str | None = None) -> list[DeltaRecord]:
        return [x.record for x in self.fenced if namespace is None or x.record.namespace == namespace]


def decode_log_record(value: bytes | None) -> Claim | DeltaRecord | None:
    """A record of the deltas log, or None for anything else (unreadable, or another envelope)."""
    try:
        env = decode(value or b"")
    except CodecError:
        return None
    return env if isinstance(env, Claim | DeltaRecord) else None


class LogJudge:
    """Judges raw deltas-log records as a consumer reads them from the START of each partition: partitions may
    interleave, each partition's records must come in offset order (ValueError otherwise: a verdict depends
    on what precedes a record). Returns the verdict (None for a record that is not a claim or a delta record:
    unreadable) and the record."""

    def __init__(self) -> None:
        self._trackers: dict[int, ClaimTracker] = {}
        self._last: dict[int, int] = {}

    def judge(
        self, partition: int, offset: int, value: bytes | None
    ) -> tuple[Verdict | None, Claim | DeltaRecord | None]:
        if offset <= self._last.get(partition, -1):
            raise ValueError(f"deltas[{partition}]: offset {offset} after {self._last[partition]} (read in order)")
        self._last[partition] = offset
        record = decode_log_record(value)
        if record is None:
            return None, None
        return self._trackers.setdefault(partition, ClaimTracker()).judge(offset, record), record


def split_log(entries: Iterable[tuple[int, int, bytes | None]]) -> LogSplit:
    """Judge raw deltas-log records ``(partition, offset, value)`` read from the start of each partition
    (see :class:`LogJudge`)."""
    out = LogSplit()
    judge = LogJudge()
    for partition, offset, value in entries:
        verdict, record = judge.judge(partition, offset, value)
        if isinstance(record, Claim):
            out.claims.append((partition, offset, record))
        elif isinstance(record, DeltaRecord):
            (out.valid if verdict == "valid" else out.fenced).append(Logged(partition, offset, record))
        else:
            out.unreadable += 1
    return out


@dataclass(frozen=True, order=True)
class Position:
    """A point in one partition of the deltas log (``offset`` -1: before its first record) and the epoch in
    force there. A replay may start right after it, judging with ``ClaimTracker(epoch)``."""

    offset: int
    epoch: int | None = None


START = Position(-1, None)


def encode_checkpoint(position: Position) -> bytes:
    return json.dumps({"offset": position.offset, "epoch": position.epoch}, separators=(",", ":")).encode()


def decode_checkpoint(raw: bytes) -> Position:
    """A checkpoint as :func:`encode_checkpoint` writes it, or as written before epochs (a bare offset, from a
    time when no claim existed). Anything unreadable is the start of the log (a longer replay, never a skip)."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return START
    if isinstance(obj, int) and not isinstance(obj, bool):
        return Position(obj, None)
    if isinstance(obj, dict):
        offset, epoch = obj.get("offset"), obj.get("epoch")
        if isinstance(offset, int) and (epoch is None or isinstance(epoch, int)):
            return Position(offset, epoch)
    return START


def replay_start(checkpoint: Position | None, snapshots: Iterable[Snapshot]) -> Position:
    """Where to replay a partition from: the earliest of its checkpoint and every snapshot's own position.

    Each is a true statement ("everything up to here is in the snapshots", "this namespace's snapshot holds
    the log up to here"), but writers of different tenures can leave them out of order — a superseded owner's
    late, valid snapshot can land after its successor's checkpoint — so only the earliest is safe to skip to.
    """
    candidates = [checkpoint or START]
    candidates += [Position(s.delta_offset, s.epoch if s.delta_offset >= 0 else None) for s in snapshots]
    return min(candidates, key=lambda p: p.offset)
