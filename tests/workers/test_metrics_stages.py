"""Worker tier: what the stages report to the metrics port, with in-memory topics (tests/workers/test_stages.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from combee.metrics_prometheus import PrometheusMetrics
from tests.fakes import ScriptedLLM, echo_script
from tests.workers.test_stages import (
    Event,
    MemoryKafka,
    Msg,
    Stream,
    deltas,
    feed_traces,
    learner,
    redeliver_traces,
    run_until_quiet,
    trace,
)
from workers.context import StageContext
from workers.observe import publish_listener, report_lag
from workers.window import handle_trace, namespace_label


def value(metrics: PrometheusMetrics, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when there is none)."""
    want = set(labels.items())
    return sum(
        s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
        if s.name == name and want <= set(s.labels.items())
    )


def with_metrics(ctx: StageContext) -> PrometheusMetrics:
    metrics = PrometheusMetrics()
    ctx.metrics = metrics
    return metrics


async def test_the_stages_report_the_work_they_did() -> None:
    kafka, stream, seen = MemoryKafka(), Stream(), set()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    m = with_metrics(ctx)
    await feed_traces(ctx, kafka, stream, "alpha", 30)
    for i, raw in enumerate([b"{", b'{"namespace": "alpha"}']):
        await handle_trace(ctx, stream, Event(Msg(ctx.topics.traces, 0, 100 + i, b"alpha", raw)))
    await handle_trace(ctx, stream, Event(Msg(ctx.topics.traces, 0, 102, b"not a namespace!", b"\xff")))
    await run_until_quiet(ctx, kafka, stream, seen)

    records = deltas(kafka, ctx.topics)
    snap = ctx.snapshots.get("alpha")
    assert snap is not None and records
    assert value(m, "combee_traces_total", namespace="alpha", outcome="accepted") == 30
    assert value(m, "combee_traces_total", namespace="alpha", outcome="dead_lettered", reason="json") == 1
    assert value(m, "combee_traces_total", namespace="alpha", outcome="dead_lettered", reason="invalid") == 1
    assert value(m, "combee_traces_total", namespace="", outcome="dead_lettered", reason="encoding") == 1
    for stage in ("closed", "mapped", "applied"):
        assert value(m, "combee_windows_total", namespace="alpha", stage=stage) == len(records), stage
    assert value(m, "combee_window_latency_seconds_count", namespace="alpha", step="applied") == len(records)
    assert value(m, "combee_playbook_bullets", namespace="alpha") == len(snap.playbook.bullets) == 30
    assert value(m, "combee_batch_size", namespace="alpha") == 4  # the only candidate
    assert value(m, "combee_llm_calls_total", role="reflector", outcome="ok") == 30
    assert value(m, "combee_llm_calls_total", role="curator", outcome="ok") >= len(records)
    assert value(m, "combee_llm_tokens_total", role="reflector", kind="prompt") > 0


async def test_redelivered_traces_count_as_duplicates_not_as_accepted() -> None:
    kafka, seen = MemoryKafka(), set()
    first = learner(kafka, ScriptedLLM(echo_script))
    await feed_traces(first, kafka, Stream(), "alpha", 8)
    await run_until_quiet(first, kafka, Stream(), seen)

    restarted = learner(kafka, ScriptedLLM(echo_script))
    m = with_metrics(restarted)
    stream = Stream()
    await redeliver_traces(restarted, kafka, stream, "alpha")  # offsets 0..7 again: windowed before
    part = restarted.home_partition("alpha")
    for i in range(8, 20):
        offset = await kafka.send(restarted.topics.traces, b"alpha", trace("alpha", i), part)
        await handle_trace(
            restarted, stream, Event(Msg(restarted.topics.traces, part, offset, b"alpha", trace("alpha", i)))
        )
    await run_until_quiet(restarted, kafka, stream, seen)

    assert value(m, "combee_traces_total", namespace="alpha", outcome="accepted") == 12
    assert value(m, "combee_traces_total", namespace="alpha", outcome="duplicate") == 8


def test_a_published_version_reports_its_latency_once() -> None:
    ctx = learner(MemoryKafka(), ScriptedLLM(echo_script))
    m = with_metrics(ctx)
    rt = ctx.runtime("alpha")
    rt.applied_version(1, 995.0)
    rt.applied_version(2, 997.0)
    listener = publish_listener(ctx, clock=lambda: 1000.0)
    listener("alpha", 2)  # v1 was superseded before Redis took it: only v2 is observed
    listener("alpha", 2)  # the store refused a repeat: no second observation
    listener("beta", 4)  # a namespace this worker does not own: the version, no latency
    assert value(m, "combee_prompt_version", namespace="alpha") == 2
    assert value(m, "combee_prompt_version", namespace="beta") == 4
    assert value(m, "combee_window_latency_seconds_count", namespace="alpha", step="published") == 1
    assert value(m, "combee_window_latency_seconds_sum", namespace="alpha", step="published") == 3.0
    assert rt.unpublished == {}


class TP(NamedTuple):
    topic: str
    partition: int


@dataclass
class FakeConsumer:
    assigned: set[TP]
    ends: dict[TP, int]
    positions: dict[TP, int] = field(default_factory=dict)

    def assignment(self) -> set[TP]:
        return self.assigned

    def highwater(self, tp: TP) -> int | None:
        return self.ends.get(tp)

    async def position(self, tp: TP) -> int | None:
        return self.positions.get(tp)


async def test_consumer_lag_counts_unfinished_records_of_assigned_partitions() -> None:
    kafka, stream = MemoryKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    m = with_metrics(ctx)
    traces = ctx.topics.traces
    part = ctx.home_partition("alpha")
    for i in range(3):  # buffered, so not done: the first unfinished offset is 0
        await handle_trace(ctx, stream, Event(Msg(traces, part, i, b"alpha", trace("alpha", i))))
    busy, idle, other = TP(traces, part), TP(ctx.topics.windows, 0), TP("someone.else", 0)
    consumer: Any = FakeConsumer({busy, idle, other}, {busy: 10, idle: 7, other: 99}, {idle: 7})
    reported = await report_lag(ctx, consumer, set())
    assert reported == {(traces, part), (ctx.topics.windows, 0)}
    assert value(m, "combee_consumer_lag", topic=traces, partition=str(part)) == 10
    assert value(m, "combee_consumer_lag", topic=ctx.topics.windows, partition="0") == 0
    assert value(m, "combee_consumer_lag", topic="someone.else") == 0  # not a stage's topic: not reported

    consumer.assigned = {idle}  # the traces partition was revoked: its series goes
    await report_lag(ctx, consumer, reported)
    assert value(m, "combee_consumer_lag", topic=traces) == 0
    assert 'topic="' + traces not in m.render().decode()


def test_a_dead_letters_namespace_label_is_its_key_only_when_that_is_a_namespace() -> None:
    assert namespace_label(b"support-bot") == "support-bot"
    assert namespace_label(b"a b") == namespace_label(b"\xff") == namespace_label(None) == ""


async def test_a_trace_on_another_partition_is_moved_and_counted() -> None:
    kafka, stream = MemoryKafka(), Stream()
    ctx = learner(kafka, ScriptedLLM(echo_script))
    m = with_metrics(ctx)
    home = ctx.home_partition("alpha")
    other = (home + 1) % ctx.topics.partitions  # where a CRC32 partitioner (kcat's default) may put it
    raw = trace("alpha", 0)
    offset = await kafka.send(ctx.topics.traces, b"alpha", raw, other)
    await handle_trace(ctx, stream, Event(Msg(ctx.topics.traces, other, offset, b"alpha", raw)))
    moved = [r.value for r in kafka.records(ctx.topics.traces) if r.partition == home]
    assert moved == [raw]  # published again, to the namespace's partition
    assert value(m, "combee_traces_moved_total", namespace="alpha") == 1
    assert value(m, "combee_fenced_writes_total", namespace="alpha") == 0  # a series from the start
    assert any(
        s.name == "combee_fenced_writes_total" and s.labels == {"namespace": "alpha"}
        for f in text_string_to_metric_families(m.render().decode())
        for s in f.samples
    )
