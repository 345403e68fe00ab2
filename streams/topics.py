"""Every Kafka topic Combee uses: names and configs, in one place.

All learner topics are keyed by namespace (so one namespace's records share a partition and stay in order)
except the pool's task topics: ``groups``, keyed by ``window_id/group`` so curate work spreads over every
partition, and ``reflect``, keyed by ``window_id/task`` and placed by :func:`task_partition` so one window's
reflection tasks go round the partitions (and so round the workers) evenly. ``traces``, ``feedback``,
``windows``, ``reflections``, ``partials``, ``deltas`` and ``playbooks`` must have the same partition count: the
window stage, the map stage, the combiner and their tables are co-partitioned by namespace (one owner per
namespace; the window stage joins a trace to its trusted feedback there, combee/feedback.py). A key's partition
is :func:`partition_for`, the one rule every client here uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka.partitioner import murmur2

from combee.models import LIMITS

__all__ = [
    "DEFAULT_PARTITIONS",
    "DEFAULT_PREFIX",
    "MAX_MESSAGE_BYTES",
    "TRACES_MAX_MESSAGE_BYTES",
    "TopicSpec",
    "Topics",
    "partition_for",
    "task_partition",
]

DEFAULT_PREFIX = "combee"
DEFAULT_PARTITIONS = 4

# A window envelope carries its traces (up to bs_max of them): allow 8 MiB records on Combee's topics.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
# The traces topic takes no record larger than a trace may be (LIMITS.trace_bytes, the encoded value) plus room
# for its key (a namespace), headers and the record batch's framing: a bigger one is refused at the producer, so
# it never reaches the workers or the disk.
TRACE_FRAMING_BYTES = 4 * 1024
TRACES_MAX_MESSAGE_BYTES = LIMITS.trace_bytes + TRACE_FRAMING_BYTES


def partition_for(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner (murmur2), as every client here uses it."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def task_partition(window_id: str, index: int, partitions: int) -> int:
    """Where task ``index`` of window ``window_id`` goes: consecutive tasks on consecutive partitions, from
    one the window id picks, so a window's tasks spread evenly however few they are."""
    return (partition_for(window_id.encode("utf-8"), partitions) + index) % partitions


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]
    keyed_by: str
    doc: str


@dataclass(frozen=True)
class Topics:
    """Topic names under a prefix (default ``combee``); tests use unique prefixes to share one broker."""

    prefix: str = DEFAULT_PREFIX
    partitions: int = DEFAULT_PARTITIONS
    traces_retention_ms: int = -1  # -1: forever (COMBEE_TRACES_RETENTION_MS)

    @property
    def traces(self) -> str:
        return f"{self.prefix}.traces"

    @property
    def windows(self) -> str:
        return f"{self.prefix}.windows"

    @property
    def reflect(self) -> str:
        return f"{self.prefix}.reflect"

    @property
    def reflections(self) -> str:
        return f"{self.prefix}.reflections"

    @property
    def groups(self) -> str:
        return f"{self.prefix}.groups"

    @property
    def partials(self) -> str:
        return f"{self.prefix}.partials"

    @property
    def deltas(self) -> str:
        return f"{self.prefix}.deltas"

    @property
    def playbooks(self) -> str:
        return f"{self.prefix}.playbooks"

    @property
    def mapstate(self) -> str:
        return f"{self.prefix}.mapstate"

    @property
    def feedback(self) -> str:
        return f"{self.prefix}.feedback"

    @property
    def deadletter(self) -> str:
        return f"{self.prefix}.deadletter"

    @property
    def stage_inputs(self) -> frozenset[str]:
        """The topics the workers' stages consume (one agent each)."""
        return frozenset(
            {self.traces, self.feedback, self.windows, self.reflect, self.reflections, self.groups, self.partials}
        )

    def specs(self) -> list[TopicSpec]:
        big = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
        keep = {"cleanup.policy": "delete", "retention.ms": "-1", **big}  # the delta log stays for replay
        week = {"cleanup.policy": "delete", "retention.ms": str(7 * 24 * 3600 * 1000), **big}
        traces = {
            "cleanup.policy": "delete",
            "retention.ms": str(self.traces_retention_ms),
            "max.message.bytes": str(TRACES_MAX_MESSAGE_BYTES),
        }
        p = self.partitions
        return [
            TopicSpec(self.traces, p, traces, "namespace", "agent traces (any producer, JSON)"),
            TopicSpec(self.windows, p, week, "namespace", "window decisions with their traces (durable handoff)"),
            TopicSpec(self.reflect, p, week, "window_id/task", "reflection tasks (a slice of a window's traces)"),
            TopicSpec(self.reflections, p, week, "namespace", "reflection tasks' answers, to the window's owner"),
            TopicSpec(self.groups, p, week, "window_id/group", "level-1 curate tasks"),
            TopicSpec(self.partials, p, week, "namespace", "window plans, partial deltas and control records"),
            TopicSpec(self.deltas, p, keep, "namespace", "applied deltas, one record per window (the log)"),
            TopicSpec(
                self.playbooks,
                p,
                {"cleanup.policy": "compact", "min.compaction.lag.ms": "0", "segment.ms": "3600000", **big},
                "namespace",
                "latest playbook snapshot per namespace (compacted)",
            ),
            TopicSpec(
                self.mapstate,
                p,
                {"cleanup.policy": "compact", "min.compaction.lag.ms": "0", "segment.ms": "3600000", **big},
                "namespace",
                "map-stage acceptance state per namespace (changelog of a table, compacted)",
            ),
            TopicSpec(
                self.feedback,
                p,
                {**traces, "retention.ms": str(7 * 24 * 3600 * 1000)},
                "namespace",
                "trusted feedback records, joined to traces by trace id (signed, combee/feedback.py)",
            ),
            TopicSpec(self.deadletter, 1, week, "namespace or none", "rejected records with the reason"),
        ]
