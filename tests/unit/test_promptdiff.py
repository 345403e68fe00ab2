"""combee.promptdiff: bullets added, changed and removed between two published versions, with provenance."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest

from combee.errors import ConfigError
from combee.evidence import EVIDENCE_KEY, Explanation, evidence_entry, parse_explanations
from combee.models import Bullet, Playbook, Provenance
from combee.promptdiff import (
    PROVENANCE_KEY,
    UnknownVersion,
    VersionRecord,
    WindowProvenance,
    diff_span,
    diff_versions,
    parse_provenance,
    provenance_entry,
    render_diff,
)
from streams.redis_publisher import LatestVersionPublisher
from streams.redis_records import parse_version_record


def bullet(bid: str, content: str, created: tuple[str, int], updated: tuple[str, int] | None = None) -> Bullet:
    c = Provenance(window_id=created[0], version=created[1])
    u = Provenance(window_id=updated[0], version=updated[1]) if updated else c
    return Bullet(id=bid, section="rules", content=content, created=c, updated=u)


def record(version: int, window: str, bullets: list[Bullet], traces: list[str] | None = None) -> VersionRecord:
    prov = (WindowProvenance(version, window, tuple(traces)),) if traces is not None else ()
    return VersionRecord(version, Playbook(namespace="ns", version=version, bullets=tuple(bullets)), window, prov)


A = bullet("b00001", "check the units", ("ns/p0/0-9", 1))
B = bullet("b00002", "round at the end", ("ns/p0/0-9", 1))
C = bullet("b00003", "quote the source", ("ns/p0/0-9", 1))
B2 = bullet("b00002", "round only at the end", ("ns/p0/0-9", 1), ("ns/p0/10-19", 2))
D = bullet("b00004", "state the period", ("ns/p0/10-19", 2))

V1 = record(1, "ns/p0/0-9", [A, B, C], ["t0", "t1"])
V2 = record(2, "ns/p0/10-19", [A, B2, D], ["t10", "t11", "t12"])


def test_added_changed_and_removed_each_with_the_window_and_traces_that_taught_it() -> None:
    diff = diff_versions([V1, V2], 1, 2)
    assert [(c.kind, c.bullet_id) for c in diff.changes] == [
        ("changed", "b00002"),
        ("added", "b00004"),
        ("removed", "b00003"),
    ]
    changed, added, removed = diff.changes
    assert (changed.before, changed.after) == ("round at the end", "round only at the end")
    assert added.after == "state the period" and removed.before == "quote the source"
    for c in diff.changes:
        assert c.taught_by == WindowProvenance(2, "ns/p0/10-19", ("t10", "t11", "t12"))
    text = render_diff(diff)
    assert text.splitlines()[0] == "ns: v1 -> v2: 1 added, 1 changed, 1 removed"
    assert "+ [b00004] (rules) state the period" in text
    # no evidence recorded, no trace on the bullets: the window is named and its traces counted, not listed
    assert "    taught by window ns/p0/10-19 (v2); traces 3 in the window" in text
    assert "- [b00003] (rules) quote the source" in text and "    removed by window ns/p0/10-19 (v2)" in text
    assert "    traces of the window: t10, t11, t12" in render_diff(diff, full=True)


def test_identical_versions_have_no_changes_and_counters_alone_are_no_change() -> None:
    assert diff_versions([V1], 1, 1).changes == ()
    counted = record(2, "ns/p1/0-3", [A.model_copy(update={"helpful": 5}), B, C], ["x"])
    assert diff_versions([V1, counted], 1, 2).changes == ()
    assert render_diff(diff_versions([V1], 1, 1)) == "ns: v1 -> v1: 0 added, 0 changed, 0 removed\n"


def test_across_several_versions_each_change_names_its_own_window() -> None:
    E = bullet("b00005", "say when unsure", ("ns/p0/20-29", 3))
    v3 = record(3, "ns/p0/20-29", [A, B2, E], ["t20"])  # D gone in v3, E new
    diff = diff_versions([v3, V1, V2], 1, 3)
    by_id = {c.bullet_id: c for c in diff.changes}
    assert by_id["b00002"].taught_by.trace_ids == ("t10", "t11", "t12")  # changed in v2
    assert by_id["b00005"].taught_by == WindowProvenance(3, "ns/p0/20-29", ("t20",))
    assert by_id["b00003"].kind == "removed" and by_id["b00003"].taught_by.version == 2  # gone since v2
    assert "b00004" not in by_id  # added in v2 and removed in v3: no net change


def test_a_version_that_covers_superseded_ones_still_knows_their_windows() -> None:
    # v2 was never published (v3 superseded it); v3's provenance lists both windows.
    E = bullet("b00005", "say when unsure", ("ns/p0/20-29", 3))
    v3 = VersionRecord(
        3,
        Playbook(namespace="ns", version=3, bullets=(A, B2, C, E)),
        "ns/p0/20-29",
        (WindowProvenance(2, "ns/p0/10-19", ("t10",)), WindowProvenance(3, "ns/p0/20-29", ("t20",))),
    )
    by_id = {c.bullet_id: c for c in diff_versions([V1, v3], 1, 3).changes}
    assert by_id["b00002"].taught_by == WindowProvenance(2, "ns/p0/10-19", ("t10",))
    assert by_id["b00005"].taught_by == WindowProvenance(3, "ns/p0/20-29", ("t20",))


def test_unrecorded_trace_ids_are_said_so() -> None:
    old = record(1, "ns/p0/0-9", [A])  # published before provenance was stored
    new = record(2, "ns/p0/10-19", [A, D])
    diff = diff_versions([old, new], 1, 2)
    assert diff.changes[0].taught_by == WindowProvenance(2, "ns/p0/10-19", None)
    assert "traces not recorded" in render_diff(diff)


def test_an_unknown_version_is_a_clear_error() -> None:
    with pytest.raises(
        UnknownVersion, match=r"version 7 is not published or no longer retained; there are versions 1\.\.2"
    ):
        diff_versions([V1, V2], 1, 7)
    with pytest.raises(UnknownVersion, match="no version"):
        diff_versions([], 1, 2)
    with pytest.raises(ConfigError, match="--from 2 is newer than --to 1"):
        diff_versions([V1, V2], 2, 1)


def test_provenance_round_trips_through_meta_and_the_redis_hash() -> None:
    meta = {"bullets": 3, PROVENANCE_KEY: [provenance_entry(2, "ns/p0/10-19", ["t10"]), {"junk": 1}, "x"]}
    assert parse_provenance(meta) == (WindowProvenance(2, "ns/p0/10-19", ("t10",)),)
    assert parse_provenance({}) == () and parse_provenance({PROVENANCE_KEY: "no"}) == ()
    values = ["2", V2.playbook.model_dump_json(), "ns/p0/10-19", json.dumps(meta)]
    parsed = parse_version_record("ns", values)
    assert parsed is not None and parsed.playbook == V2.playbook
    assert parsed.provenance == (WindowProvenance(2, "ns/p0/10-19", ("t10",)),)
    assert parse_version_record("ns", [None, None, None, None]) is None
    legacy = parse_version_record("ns", ["2", V2.playbook.model_dump_json(), "", None])
    assert legacy is not None and legacy.provenance == () and legacy.window_id is None


class _Store:
    def __init__(self) -> None:
        self.published: list[tuple[int, dict[str, Any] | None]] = []

    async def publish(self, namespace: str, version: int, prompt: str, playbook_json: str, **kw: Any) -> bool:
        self.published.append((version, kw.get("meta")))
        return True


def test_the_publisher_carries_superseded_windows_into_the_version_it_publishes() -> None:
    async def run() -> list[tuple[int, dict[str, Any] | None]]:
        store = _Store()
        pub = LatestVersionPublisher(store)
        for v in (1, 2, 3):
            meta = {
                PROVENANCE_KEY: [provenance_entry(v, f"w{v}", [f"t{v}"])],
                EVIDENCE_KEY: evidence_entry(Explanation(version=v)),
            }
            pub.offer("ns", v, "p", "{}", window_id=f"w{v}", meta=meta)
        await pub.run(until_idle=True)
        return store.published

    published = asyncio.run(run())
    assert len(published) == 1 and published[0][0] == 3
    meta = published[0][1]
    assert meta is not None
    assert [p.version for p in parse_provenance(meta)] == [1, 2, 3]
    assert [e.version for e in parse_explanations(meta)] == [1, 2, 3]  # and their evidence


def test_the_span_of_a_diff_defaults_to_the_previous_published_version_and_the_current_one() -> None:
    assert diff_span([5, 2, 1]) == (2, 5, (2, 5))  # 3 and 4 were superseded before publishing
    assert diff_span([1, 2, 5], to_version=2) == (1, 2, (1, 2))
    assert diff_span([1, 2, 5], to_version=1) == (0, 1, (1,))  # 0: the empty playbook, never read
    assert diff_span([1, 2, 5], from_version=1) == (1, 5, (1, 2, 5))
    with pytest.raises(
        UnknownVersion, match=r"version 9 is not published or no longer retained \(there are versions 1\.\.5\)"
    ):
        diff_span([1, 2, 5], to_version=9)
    with pytest.raises(UnknownVersion, match="no version is published yet"):
        diff_span([])
    with pytest.raises(ConfigError, match="--from 5 is newer than --to 2"):
        diff_span([1, 2, 5], from_version=5, to_version=2)


# --- why: the evidence a version stores per operation (combee.evidence) -------------------------------------

WINDOW = tuple(f"t{i}" for i in range(10, 60))  # the whole window: 50 traces
TAUGHT = tuple(f"t{i}" for i in range(10, 18))  # the 8 whose reflections taught the new bullet


def explained_v2() -> VersionRecord:
    from combee.evidence import Explanation, Lesson, OpEvidence

    lesson = Lesson(trace_id="t10", text="a rate means nothing without its period: state it")
    evidence = Explanation(
        version=2,
        ops=(
            OpEvidence(op="UPDATE", outcome="changed", bullet_id="b00002", sources=("t20",)),
            OpEvidence(op="ADD", outcome="added", bullet_id="b00004", sources=TAUGHT, lessons=(lesson,)),
            OpEvidence(op="REMOVE", outcome="removed", bullet_id="b00003", sources=("t30", "t31")),
        ),
    )
    return VersionRecord(2, V2.playbook, V2.window_id, (WindowProvenance(2, V2.window_id, WINDOW),), (evidence,))


def test_each_change_names_only_the_traces_that_taught_it_with_the_operation_and_a_lesson() -> None:
    diff = diff_versions([V1, explained_v2()], 1, 2)
    by_id = {c.bullet_id: c for c in diff.changes}
    assert by_id["b00004"].traces == TAUGHT and by_id["b00004"].from_evidence
    assert by_id["b00002"].traces == ("t20",)
    assert by_id["b00003"].traces == ("t30", "t31")
    assert [(t.op, t.outcome, t.version) for t in by_id["b00004"].why] == [("ADD", "added", 2)]
    text = render_diff(diff)
    assert len(text.splitlines()) == 1 + 2 * len(diff.changes)  # two lines a bullet
    assert "~ [b00002] (rules) round at the end  →  round only at the end" in text
    assert (
        '    ADD→added v2 · 8 traces: t10, t11, t12 +5 more · "a rate means nothing without its period: state it" (t10)'
        in text
    )
    assert "    REMOVE→removed v2 · 2 traces: t30, t31" in text
    assert "t59" not in text  # the rest of the window taught none of these


def test_full_lists_every_trace_and_lesson_and_json_carries_the_same() -> None:
    diff = diff_versions([V1, explained_v2()], 1, 2)
    full = render_diff(diff, full=True)
    assert f"    v2 ADD → added, 8 traces: {', '.join(TAUGHT)}" in full
    assert '      t10: "a rate means nothing without its period: state it"' in full
    assert "    taught by window ns/p0/10-19 (v2; 50 traces in the window)" in full
    doc = json.loads(json.dumps(dataclasses.asdict(diff)))
    added = next(c for c in doc["changes"] if c["bullet_id"] == "b00004")
    assert added["traces"] == list(TAUGHT)
    assert added["why"][0]["lessons"] == [
        {"trace_id": "t10", "text": "a rate means nothing without its period: state it"}
    ]


def test_without_evidence_the_bullets_own_traces_are_named_capped_in_short() -> None:
    cited = D.model_copy(update={"sources": tuple(f"t{i}" for i in range(10, 15)), "support": 9})
    v2 = record(2, "ns/p0/10-19", [A, B2, cited], list(WINDOW))
    c = next(c for c in diff_versions([V1, v2], 1, 2).changes if c.bullet_id == "b00004")
    assert c.traces == cited.sources and not c.from_evidence and c.why == ()
    text = render_diff(diff_versions([V1, v2], 1, 2))
    assert "taught by window ns/p0/10-19 (v2); traces t10, t11, t12 +2 more (the bullet's latest; 9 in all)" in text
    removed = next(c for c in diff_versions([V1, v2], 1, 2).changes if c.kind == "removed")
    assert removed.traces is None  # who taught a bullet is not who removed it


def test_evidence_of_a_superseded_version_carried_into_the_published_one_explains_its_changes() -> None:
    from combee.evidence import Explanation, OpEvidence

    early = Explanation(version=2, ops=(OpEvidence(op="ADD", outcome="added", bullet_id="b00004", sources=("t11",)),))
    late = Explanation(
        version=3, ops=(OpEvidence(op="UPDATE", outcome="changed", bullet_id="b00002", sources=("t21",)),)
    )
    v3 = VersionRecord(3, V2.playbook.model_copy(update={"version": 3}), "ns/p0/20-29", (), (early, late))
    by_id = {c.bullet_id: c for c in diff_versions([V1, v3], 1, 3).changes}
    assert by_id["b00004"].traces == ("t11",)
