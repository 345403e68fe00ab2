"""The invariants checked after every fault scenario, computed from what the pipeline left in Kafka and Redis.

Sources of truth (read after the run has settled):

* the traces topic — every record the scenario's producer sent, plus copies the window stage forwarded to a
  namespace's home partition; each record is decoded with the workers' own decoder
  (:func:`streams.codec.decode_trace`), so "valid" means exactly what the workers consider valid;
* the delta log (``<prefix>.deltas``) — one record per applied window: the commit point of the combiner. Only
  its *valid* records count (:mod:`streams.deltalog`: a record written after another owner's claim is fenced);
  fenced records and claims are counted apart (``fenced_records``, ``claims``), never as applications;
* the dead-letter topic;
* Redis — every retained version hash (``v:N``), the history and ``current``;
* the compacted snapshot topic (``<prefix>.playbooks``) — the combiner's recovered state;
* what an agent-like reader saw while the run went on (:class:`~tests.faults.harness.PromptWatcher`).

Invariants (each a counter that must be 0, see :class:`Figures`):

1. every valid trace published is covered by exactly one applied window (``lost``, ``learned_twice``), no
   window covers anything that is not a valid trace at its namespace's home partition (``phantom``), and every
   bad record is dead-lettered with a reason or was refused by the broker (``bad_unaccounted``);
2. no window id is applied twice (``windows_applied_twice``);
3. versions per namespace are 1, 2, 3, … in log order, Redis holds none the log does not, and the reader never
   saw a version go backwards (``version_regressions``, ``version_gaps``);
4. each published prompt is the rendering of its version's playbook, also as the reader saw it
   (``prompt_mismatches``, ``torn_reads``);
5. no half-applied delta: replaying the delta log from an empty playbook (``apply_delta``, all or nothing)
   gives, version by version, exactly the playbook Redis published and the snapshot the combiner recovers from
   (``half_applied``).

Quality (6) is measured separately (:func:`quality`): whether the playbook equals a fault-free execution of
the same windows with the same model answers, and the retention of the hidden insights against it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from combee.embeddings import NearDuplicates
from combee.engine import MethodConfig, Window, run_window
from combee.models import Playbook
from combee.playbook import ApplyPolicy, apply_delta, render_prompt
from combee.settings import Settings
from combee.sim.inproc import InProcessSim
from combee.sim.world import Behaviour, WorldResponder, retention
from combee.wiring import build_near_duplicates
from streams.codec import CodecError, decode, decode_trace
from streams.deltalog import split_log
from streams.envelopes import DeadLetter, DeltaRecord, Snapshot
from streams.topics import partition_for
from tests.faults.harness import PromptWatcher, Run, Sent, TopicTail

__all__ = ["Figures", "Observed", "check", "observe", "quality"]


@dataclass
class Figures:
    scenario: str
    run: int = 1
    # inputs
    published: int = 0  # valid traces the scenario published (by trace id)
    bad_published: int = 0  # records the workers' decoder refuses
    refused_by_broker: int = 0  # records the broker refused (over the topic's max.message.bytes)
    # outcome
    learned: int = 0
    dead_lettered: int = 0
    lost: int = 0
    learned_twice: int = 0
    phantom: int = 0
    bad_unaccounted: int = 0
    windows_applied: int = 0
    windows_applied_twice: int = 0
    duplicate_log_records: int = 0
    windows_given_up: int = 0
    fenced_records: int = 0  # delta records a superseded owner wrote after a newer claim: refused by every reader
    claims: int = 0  # claims in the delta log (a combiner taking a partition)
    versions: int = 0
    versions_published: int = 0
    version_regressions: int = 0
    version_gaps: int = 0
    reader_versions_seen: int = 0
    prompt_mismatches: int = 0
    torn_reads: int = 0
    half_applied: int = 0
    worker_crashes: int = 0
    # quality
    retention: float | None = None
    reference_retention: float | None = None  # the fault-free run on the same traces and windows
    retention_ratio: float | None = None
    control_retention: float | None = None  # the suite's fault-free streaming run (other window cuts)
    ratio_vs_control: float | None = None
    retention_by_namespace: dict[str, float] = field(default_factory=dict)
    same_answers_equal: bool | None = None
    same_answers_diff: int | None = None
    # liveness: per namespace, seconds from the last trace (faults over) to its final version, and the bound
    liveness: dict[str, dict[str, float]] = field(default_factory=dict)
    stalls: int = 0
    # the faults themselves
    faults: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Observed:
    """Everything read back after a run."""

    traces: dict[tuple[int, int], tuple[bytes | None, bytes | None]]
    deltas: list[DeltaRecord]  # the valid records, in log order per partition
    dead_letters: list[DeadLetter]
    snapshots: dict[str, Snapshot]
    redis_versions: dict[str, dict[int, tuple[str, str]]]  # ns -> version -> (prompt, playbook json)
    redis_current: dict[str, int]
    seen: dict[str, list[Any]]
    fenced: list[DeltaRecord] = field(default_factory=list)  # written after a newer claim: count for nobody
    claims: int = 0
    # the simulator's malformed answers (request digest -> counters): the same-windows replay gives them too
    malformed: dict[str, list[int]] = field(default_factory=dict)


def _read(run: Run, topic: str) -> list[Any]:
    tail = TopicTail(run.stack.bootstrap, topic)
    try:
        return tail.poll(timeout_s=180)
    finally:
        tail.close()


def observe(run: Run, namespaces: list[str], watcher: PromptWatcher | None) -> Observed:
    traces = {(r.partition, r.offset): (r.key, r.value) for r in _read(run, run.topics.traces)}
    log = split_log((r.partition, r.offset, r.value) for r in _read(run, run.topics.deltas))
    assert log.unreadable == 0, f"{log.unreadable} records of the delta log are neither claims nor delta records"
    letters = []
    for r in _read(run, run.topics.deadletter):
        rec = decode(r.value or b"")
        assert isinstance(rec, DeadLetter)
        letters.append(rec)
    snapshots: dict[str, Snapshot] = {}
    for r in _read(run, run.topics.playbooks):
        if r.key is None or r.key.startswith(b"__") or r.value is None:
            continue
        snap = decode(r.value)
        assert isinstance(snap, Snapshot)
        snapshots[r.key.decode()] = snap  # the last one per key wins, as in the compacted topic
    client = run.redis()
    versions: dict[str, dict[int, tuple[str, str]]] = {}
    current: dict[str, int] = {}
    try:
        for ns in namespaces:
            members = client.zrange(run.keys.history(ns), 0, -1, withscores=True)
            got: dict[int, tuple[str, str]] = {}
            for _, score in members:
                v = int(score)
                prompt, playbook = client.hmget(run.keys.version(ns, v), ["prompt", "playbook"])
                if prompt is not None and playbook is not None:
                    got[v] = (prompt, playbook)
            versions[ns] = got
            raw = client.hget(run.keys.current(ns), "version")
            current[ns] = int(raw) if raw else 0
    finally:
        client.close()
    seen = watcher.stop() if watcher is not None else {}
    malformed = run.sim.malformed_log() if run.sim is not None else {}
    return Observed(
        traces,
        log.records(),
        letters,
        snapshots,
        versions,
        current,
        seen,
        log.fenced_records(),
        len(log.claims),
        malformed,
    )


def check(
    run: Run, sent: list[Sent], obs: Observed, figures: Figures, policy: ApplyPolicy | None = None
) -> dict[str, Playbook]:
    """Fill ``figures`` with the counters of invariants 1–5 (and their violations); return the final
    playbook per namespace as replayed from the delta log."""
    policy = policy or ApplyPolicy()
    partitions = run.partitions
    v = figures.violations

    # 1. traces: classify every record with the workers' own decoder -----------------------------------
    ids_at: dict[str, set[tuple[int, int]]] = defaultdict(set)  # trace id -> home (partition, offset)s
    valid_home: set[tuple[int, int]] = set()
    sent_at: set[tuple[int, int]] = set()
    expected_ids: set[str] = set()
    bad: list[Sent] = []
    for s in sent:
        if s.refused is not None:
            figures.refused_by_broker += 1
            continue
        assert s.partition is not None and s.offset is not None, f"record {s.record.label} never acknowledged"
        sent_at.add((s.partition, s.offset))
        try:
            trace = decode_trace(s.record.value, s.record.key)
        except CodecError:
            bad.append(s)
            continue
        expected_ids.add(trace.trace_id)
    figures.fenced_records = len(obs.fenced)
    figures.claims = obs.claims
    figures.published = len(expected_ids)
    figures.bad_published = len(bad)
    for (p, o), (key, value) in obs.traces.items():
        try:
            trace = decode_trace(value, key)
        except CodecError:
            if (p, o) not in sent_at:
                v.append(f"an undecodable record at traces[{p}]@{o} that the scenario did not send")
            continue
        if (p, o) not in sent_at and trace.trace_id not in expected_ids:
            v.append(f"traces[{p}]@{o}: trace {trace.trace_id} was never published")
        if partition_for(trace.namespace.encode(), partitions) == p:
            valid_home.add((p, o))
            ids_at[trace.trace_id].add((p, o))

    # the delta log, deduplicated by (window, version): a record written twice by a producer retry is one
    # application, counted apart
    by_ns: dict[str, list[DeltaRecord]] = defaultdict(list)
    records: dict[tuple[str, str, int], DeltaRecord] = {}
    for rec in obs.deltas:
        k = (rec.namespace, rec.window_id, rec.version)
        if k in records:
            figures.duplicate_log_records += 1
            continue
        records[k] = rec
        by_ns[rec.namespace].append(rec)
    covered: dict[tuple[int, int], set[str]] = defaultdict(set)
    for rec in records.values():
        if rec.seq < 0 or rec.source is None:
            continue  # rollback records cover no traces
        p = int(rec.source.removeprefix("p"))
        for o in rec.offsets:
            covered[(p, o)].add(rec.window_id)
    for tid in expected_ids:
        windows = set().union(*(covered.get(at, set()) for at in ids_at.get(tid, set())))
        if not windows:
            figures.lost += 1
            if figures.lost <= 5:
                v.append(f"trace {tid} was never learned (home offsets {sorted(ids_at.get(tid, set()))})")
        elif len(windows) > 1:
            figures.learned_twice += 1
            v.append(f"trace {tid} was learned by {len(windows)} windows: {sorted(windows)}")
        else:
            figures.learned += 1
    for at, windows in covered.items():
        if at not in valid_home:
            figures.phantom += 1
            v.append(f"windows {sorted(windows)} cover traces[{at[0]}]@{at[1]}, which is no valid trace there")
    letters = {(d.topic, d.partition, d.offset): d for d in obs.dead_letters}
    for s in bad:
        d = letters.get((run.topics.traces, s.partition, s.offset))
        if d is not None and d.reason:
            figures.dead_lettered += 1
        else:
            figures.bad_unaccounted += 1
            v.append(f"bad record ({s.record.label}) at traces[{s.partition}]@{s.offset} has no dead letter")
    figures.windows_given_up = sum(1 for d in obs.dead_letters if d.topic != run.topics.traces)
    if figures.windows_given_up:
        v.append(f"{figures.windows_given_up} windows or groups were given up (dead-lettered by a later stage)")

    # 2.–5. windows, versions, prompts, deltas per namespace -------------------------------------------
    finals: dict[str, Playbook] = {}
    for ns in sorted(set(by_ns) | set(obs.redis_versions)):
        recs = by_ns.get(ns, [])
        figures.windows_applied += sum(1 for r in recs if r.seq >= 0)
        figures.versions += len(recs)
        per_window = Counter(r.window_id for r in recs)
        for wid, n in per_window.items():
            if n > 1:
                figures.windows_applied_twice += 1
                v.append(
                    f"window {wid} was applied {n} times (versions {[r.version for r in recs if r.window_id == wid]})"
                )
        playbook = Playbook(namespace=ns)
        replayed: dict[int, Playbook] = {}
        previous = 0
        for r in recs:  # in log order
            if r.version <= previous:
                figures.version_regressions += 1
                v.append(f"{ns}: delta log version {r.version} after {previous}")
                continue
            if r.version != previous + 1:
                figures.version_gaps += 1
                v.append(f"{ns}: delta log jumps from version {previous} to {r.version}")
            previous = r.version
            playbook = r.playbook if r.playbook is not None else apply_delta(playbook, r.delta, policy)[0]
            replayed[r.version] = playbook
        finals[ns] = playbook
        published = obs.redis_versions.get(ns, {})
        figures.versions_published += len(published)
        for version, (prompt, raw) in sorted(published.items()):
            stored = Playbook.model_validate_json(raw)
            if stored.version != version or render_prompt(stored) != prompt:
                figures.prompt_mismatches += 1
                v.append(f"{ns}: Redis version {version} holds a prompt that is not its playbook's rendering")
            if version not in replayed:
                figures.version_regressions += 1
                v.append(f"{ns}: Redis holds version {version}, which the delta log never produced")
            elif replayed[version] != stored:
                figures.half_applied += 1
                v.append(f"{ns}: Redis version {version} differs from the full application of its delta")
        if recs and obs.redis_current.get(ns, 0) != previous:
            v.append(f"{ns}: Redis current is v{obs.redis_current.get(ns)} but the log ends at v{previous}")
            figures.version_gaps += 1
        snap = obs.snapshots.get(ns)
        if recs and (snap is None or snap.playbook != playbook):
            figures.half_applied += 1
            v.append(f"{ns}: the combiner's snapshot is not the replay of the delta log")
        seen = obs.seen.get(ns, [])
        figures.reader_versions_seen += len(seen)
        for a, b in itertools.pairwise(seen):
            if b.version < a.version:
                figures.version_regressions += 1
                v.append(f"{ns}: a reader saw version {b.version} after {a.version}")
        for s in seen:
            pb = Playbook.model_validate_json(s.playbook_json) if s.playbook_json else None
            if pb is None or pb.version != s.version or render_prompt(pb) != s.prompt:
                figures.torn_reads += 1
                v.append(f"{ns}: a reader saw version {s.version} with a prompt that is not its playbook")
            elif s.version in replayed and replayed[s.version] != pb:
                figures.half_applied += 1
                v.append(f"{ns}: a reader saw version {s.version} unlike the full application of its delta")
    figures.worker_crashes = len(run.crashes())
    for w in run.crashes():
        v.append(f"worker {w.name} crashed (exit {w.proc.returncode})")
    # A Faust agent that raises is restarted by its supervisor inside a live process: a crash all the same.
    for w in run.workers:
        text = w.log.read_text(errors="replace") if w.log.exists() else ""
        for line in (x for x in text.splitlines() if "Crashed reason=" in x):
            figures.worker_crashes += 1
            v.append(f"an agent of worker {w.name} crashed: {line[:300]}")
    return finals


def quality(
    run: Run,
    obs: Observed,
    finals: dict[str, Playbook],
    truths: dict[str, list[str]],
    control: dict[str, float] | None,
    figures: Figures,
    *,
    require_equal: bool,
    min_ratio: float = 0.9,
    sim_seed: int = 1,
) -> None:
    """6. Quality against a fault-free run on the same traces.

    Window cuts depend on timing (a fault delays closing, a backlog makes bigger windows), so two fault-free
    runs on the same traces already differ a little. The fault-free run compared with is therefore the one
    on the same traces AND the same windows: every window of the delta log re-executed from an empty playbook
    by the engine (:func:`combee.engine.run_window`, what ``combee learn`` runs) against the in-process
    simulator, which answers exactly as the HTTP one does when no fault fires, and gives the same malformed
    answers the HTTP one gave (``obs.malformed``, from its ``/admin/malformed`` log), so the replay takes the
    same repair turns. Transport faults (500, 429, timeouts, outages) change no answer: the client retries
    the same request. Two figures come out:

    * ``same_answers_equal`` — with the same answers, the playbook must be *identical* (bullets, ids,
      counters, version): the exactly-once, deterministic-replay contract. Required in every scenario the
      suite runs (``require_equal=False`` is left for a fault whose answers a replay cannot repeat);
    * ``retention_ratio`` — hidden-insight retention of the published playbook over that fault-free one's,
      pooled over the namespaces; must be at least ``min_ratio`` (0.9, the project's quality bound).

    ``control`` (the retention of the suite's fault-free streaming run, other cuts) is reported beside it.
    """
    weights = {ns: len(insights) for ns, insights in truths.items()}
    total = sum(weights.values()) or 1
    pooled = fault_free = 0.0
    diff = 0
    for ns, insights in sorted(truths.items()):
        final = finals.get(ns, Playbook(namespace=ns))
        ret = retention(render_prompt(final), insights)
        figures.retention_by_namespace[ns] = round(ret, 4)
        pooled += ret * weights[ns] / total
        expected = _fault_free_same_windows(obs, ns, sim_seed)
        fault_free += retention(render_prompt(expected), insights) * weights[ns] / total
        mine, theirs = set(_bullets(final)), set(_bullets(expected))
        diff += len(mine ^ theirs) + (0 if final.version == expected.version else 1)
    figures.retention = round(pooled, 4)
    figures.reference_retention = round(fault_free, 4)
    figures.retention_ratio = round(pooled / fault_free, 4) if fault_free else None
    if figures.retention_ratio is not None and figures.retention_ratio < min_ratio:
        figures.violations.append(
            f"retention {pooled:.3f} is {figures.retention_ratio:.3f} of the fault-free {fault_free:.3f}"
            f" (< {min_ratio})"
        )
    if control:
        ref = sum(control.get(ns, 0.0) * w for ns, w in weights.items()) / total
        figures.control_retention = round(ref, 4)
        figures.ratio_vs_control = round(pooled / ref, 4) if ref else None
    figures.same_answers_diff = diff
    figures.same_answers_equal = diff == 0
    if require_equal and diff:
        figures.violations.append(
            f"{diff} bullets differ from a fault-free execution of the same windows with the same answers"
        )


def _bullets(pb: Playbook) -> list[tuple[str, str, str, int, int]]:
    return [(b.id, b.section, b.content, b.helpful, b.harmful) for b in pb.bullets]


class _WorkersContext:
    """The in-process simulator seen through the workers' context window. The HTTP simulator reports none, so
    the workers size every request to the `COMBEE_LLM_CONTEXT_TOKENS` default (a near-limit trace is clipped to
    fit); the same-windows replay must size its requests the same way, or its answers differ."""

    def __init__(self, inner: InProcessSim, tokens: int) -> None:
        self.inner, self.tokens = inner, tokens

    async def complete(self, request: Any) -> Any:
        return await self.inner.complete(request)

    async def context_tokens(self, role: Any) -> int:
        return self.tokens

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@functools.cache
def _replay_dedup() -> NearDuplicates | None:
    """The workers fold near-duplicate ADDs before logging a delta (semantic de-duplication, on by default where
    the embeddings extra is installed); the replay must de-duplicate the same way. One for the whole suite: the
    local model is loaded once (~0.5 s of CPU each time), not twice per scenario, and embeddings are a function
    of the text, so sharing its cache changes no answer."""
    return build_near_duplicates(Settings(), log=lambda _: None)


def _fault_free_same_windows(obs: Observed, ns: str, seed: int) -> Playbook:
    """The namespace's windows, as the delta log records them, re-executed without faults (see quality)."""
    recs = sorted(
        {(r.window_id, r.version): r for r in obs.deltas if r.namespace == ns}.values(), key=lambda r: r.version
    )
    sim = InProcessSim(WorldResponder(Behaviour(seed=seed)), seed=seed, malformed=obs.malformed)
    llm = _WorkersContext(sim, Settings.model_fields["llm_context_tokens"].default)
    dedup = _replay_dedup()

    async def replay() -> Playbook:
        pb = Playbook(namespace=ns)
        for r in recs:
            if r.playbook is not None or r.source is None:
                pb = r.playbook or pb
                continue
            p = int(r.source.removeprefix("p"))
            traces = []
            for o in r.offsets:
                key, value = obs.traces[(p, o)]
                traces.append(decode_trace(value, key))
            window = Window(ns, r.source, r.offsets[0], r.offsets[-1], tuple(traces), seed_key=r.seed_key)
            # the reduce shape the workers used, as the log records it
            pb = (await run_window(window, pb, llm, MethodConfig(shuffle_key=r.shape), dedup=dedup)).playbook
        return pb

    return asyncio.run(replay())
