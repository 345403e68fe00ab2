"""``combee ui`` without Redis: the data module over a fake store, the pure rendering, and the handlers through
aiohttp's test client (escaping, an empty namespace, an unknown version is a 404 page)."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator, Mapping
from types import MappingProxyType
from typing import Any

import pytest
import redis.exceptions
from aiohttp.test_utils import TestClient, TestServer

from combee.models import Bullet, Playbook, Provenance
from combee.outcomes import OutcomeCounts
from combee.playbook import render_prompt
from combee.promptdiff import PROVENANCE_KEY, VersionRecord, parse_provenance, provenance_entry
from combee.store import PublishedPrompt
from combee.ui import render
from combee.ui.server import build_app
from streams import overview
from streams.redis_records import HistoryEntry
from tests.support import element_texts as texts

NS = "ui-ns"
W1, W2 = f"{NS}/p0/0-2", f"{NS}/p0/3-4"
EVIL = '<script>document.title="pwned"</script> & "quotes"'


def _bullet(bid: str, content: str, created: tuple[str, int], updated: tuple[str, int] | None = None) -> Bullet:
    c = Provenance(window_id=created[0], version=created[1])
    u = Provenance(window_id=updated[0], version=updated[1]) if updated else c
    return Bullet(id=bid, section="formulas", content=content, created=c, updated=u)


V1 = Playbook(namespace=NS, version=1, bullets=(_bullet("b00001", "check the units", (W1, 1)),), next_id=2)
V2 = Playbook(
    namespace=NS,
    version=2,
    bullets=(_bullet("b00001", "check the units", (W1, 1)), _bullet("b00002", EVIL, (W2, 2))),
    next_id=3,
)
STATUS = {
    "worker": "host:42",
    "updated_at": 1_800_000_000.0,
    "traces_seen": 5,
    "buffered": 0,
    "windows_in_flight": 0,
    "controller": {"profiling": False, "next_trial": None, "batch_size": 16, "why": "batch size 16: <keep-up>"},
    "latency_close_to_applied_s": {"p50": 1.25, "p95": 2.5, "n": 2},
}


class FakeStore:
    """The reads of RedisPromptStore that streams.overview makes, over in-memory versions."""

    def __init__(self, playbooks: list[tuple[Playbook, str, list[str]]], status: dict[str, Any] | None) -> None:
        self.records: dict[str, dict[int, tuple[PublishedPrompt, VersionRecord, HistoryEntry]]] = {}
        for pb, window, traces in playbooks:
            meta = {"bullets": len(pb.bullets), "traces": len(traces), "note": ""}
            provenance = parse_provenance({PROVENANCE_KEY: [provenance_entry(pb.version, window, traces)]})
            at = 1_800_000_000.0 + pb.version
            self.records.setdefault(pb.namespace, {})[pb.version] = (
                PublishedPrompt(pb.namespace, pb.version, render_prompt(pb), pb.model_dump_json(), window, at),
                VersionRecord(pb.version, pb, window, provenance),
                HistoryEntry(pb.version, window, at, len(pb.bullets), 10, meta),
            )
        self.status = status

    async def namespaces(self) -> list[str]:
        return sorted(self.records)

    async def current(self, namespace: str) -> PublishedPrompt | None:
        held = self.records.get(namespace, {})
        return held[max(held)][0] if held else None

    async def get_version(self, namespace: str, version: int) -> PublishedPrompt | None:
        found = self.records.get(namespace, {}).get(version)
        return found[0] if found else None

    async def version_record(self, namespace: str, version: int) -> VersionRecord | None:
        found = self.records.get(namespace, {}).get(version)
        return found[1] if found else None

    async def history(self, namespace: str, limit: int = 20) -> list[HistoryEntry]:
        held = self.records.get(namespace, {})
        return [held[v][2] for v in sorted(held, reverse=True)][:limit]

    async def get_status(self, namespace: str) -> dict[str, Any] | None:
        return self.status if namespace in self.records else None

    async def seen_namespaces(self) -> list[str]:
        return []

    async def health_reports(self) -> list[dict[str, Any]]:
        return list(self.health)

    async def outcomes(self, namespace: str) -> dict[str, OutcomeCounts]:
        return dict(self.outcome_counts) if namespace in self.records else {}

    async def promotion(self, namespace: str, head: int | None) -> dict[str, Any]:
        return dict(self.promotion_state) if namespace in self.records else {}

    outcome_counts: Mapping[str, OutcomeCounts] = MappingProxyType({})
    promotion_state: Mapping[str, Any] = MappingProxyType({})

    health: tuple[dict[str, Any], ...] = ()


def store() -> FakeStore:
    return FakeStore([(V1, W1, ["t0", "t1", "t2"]), (V2, W2, ["t3", "t4"])], STATUS)


# --- the data -------------------------------------------------------------------------------------------


async def test_the_overview_lists_versions_windows_and_the_controllers_decision() -> None:
    view = await overview.namespace_overview(store(), NS)
    assert view.current == 2 and [h.version for h in view.versions] == [2, 1]
    assert [(w.version, w.window_id, w.size, w.trace_ids) for w in view.windows] == [
        (2, W2, 2, ("t3", "t4")),
        (1, W1, 3, ("t0", "t1", "t2")),
    ]
    assert view.report is not None and view.report.batch_size == 16 and view.report.latency_p95_s == 2.5
    assert view.report.decision == "batch size 16: <keep-up>"


def test_a_worker_report_of_the_wrong_shape_reads_as_unknown() -> None:
    assert overview.worker_report(None) is None
    report = overview.worker_report({"controller": "junk", "traces_seen": "5", "latency_close_to_applied_s": 3})
    assert report is not None
    assert (report.batch_size, report.traces_seen, report.decision, report.latency_windows) == (
        None,
        None,
        "not reported",
        0,
    )


async def test_the_diff_has_the_defaults_of_combee_prompt_diff() -> None:
    diff = await overview.prompt_diff(store(), NS)
    assert (diff.from_version, diff.to_version) == (1, 2)
    assert [(c.kind, c.bullet_id) for c in diff.changes] == [("added", "b00002")]
    assert diff.changes[0].taught_by.trace_ids == ("t3", "t4")
    first = await overview.prompt_diff(store(), NS, to_version=1)
    assert first.from_version == 0 and [c.bullet_id for c in first.changes] == ["b00001"]


async def test_the_diff_page_says_why_each_bullet_changed_with_only_the_traces_that_taught_it() -> None:
    from combee.evidence import Explanation, Lesson, OpEvidence

    s = store()
    published, record, entry = s.records[NS][2]
    lesson = Lesson(trace_id="t4", text=f"units first {EVIL}")
    why = OpEvidence(op="ADD", outcome="added", bullet_id="b00002", sources=("t4",), lessons=(lesson,))
    s.records[NS][2] = (published, dataclasses.replace(record, evidence=(Explanation(version=2, ops=(why,)),)), entry)
    page = render.diff_page(await overview.prompt_diff(s, NS))
    assert "ADD→added v2" in page
    assert texts(page, "trace-ids")[0] == ["t4"]  # not t3: it is in the window but taught nothing here
    shown, scripts = texts(page, "lesson")
    assert shown == [f"units first {EVIL}"] and scripts == 0


# --- the rendering (pure) -------------------------------------------------------------------------------


async def test_a_bullet_holding_markup_is_shown_as_text_on_every_page() -> None:
    s = store()
    pages = [
        render.version_page(await overview.version_detail(s, NS, 2)),  # type: ignore[arg-type]
        render.diff_page(await overview.prompt_diff(s, NS)),
    ]
    for page in pages:
        shown, scripts = texts(page, "bullet-text")
        assert EVIL in shown  # the text a reader sees is the bullet, markup and all
        assert scripts == 0  # ... and no element was made of it
        assert "<script>" not in page and "&lt;script&gt;" in page
    version_page = pages[0]
    assert "&lt;script&gt;document.title=&quot;pwned&quot;&lt;/script&gt; &amp; &quot;quotes&quot;" in version_page
    namespace_page = render.namespace_page(await overview.namespace_overview(s, NS))
    assert "batch size 16: &lt;keep-up&gt;" in namespace_page


def test_an_empty_namespace_and_no_namespaces_say_so() -> None:
    page = render.namespace_page(overview.NamespaceOverview("quiet", None, (), (), None))
    assert "No version of this namespace is published yet." in page
    assert "No report from a worker" in page
    assert "No namespace has traces or a published prompt yet." in render.index_page([])


def test_the_namespace_page_says_latencies_per_window_are_not_stored() -> None:
    view = overview.NamespaceOverview(NS, 1, (HistoryEntry(1, W1, None, 1, 5, {"traces": 3}),), (), None)
    assert "Per-window latencies are not stored in Redis" in render.namespace_page(view)


def test_the_error_page_escapes_its_message() -> None:
    page = render.error_page(404, "version <b>9</b> is not published")
    assert "<h1>404</h1>" in page and "version &lt;b&gt;9&lt;/b&gt; is not published" in page


# --- the handlers ---------------------------------------------------------------------------------------


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(build_app(store()))) as c:
        yield c


async def test_the_pages_answer(client: TestClient[Any, Any]) -> None:
    index = await client.get("/")
    assert index.status == 200 and index.content_type == "text/html"
    assert texts(await index.text(), "namespace")[0] == [NS]
    ns = await (await client.get(f"/ns/{NS}")).text()
    assert texts(ns, "size")[0] == ["2", "3"]
    version = await client.get(f"/ns/{NS}/v/1")
    assert version.status == 200 and texts(await version.text(), "bullet-text")[0] == ["check the units"]
    diff = await client.get(f"/ns/{NS}/diff", params={"from": "0", "to": "2"})
    assert diff.status == 200 and texts(await diff.text(), "bullet-text")[0] == ["check the units", EVIL]
    api = json.loads(await (await client.get(f"/api/ns/{NS}/diff")).text())
    assert [c["bullet_id"] for c in api["changes"]] == ["b00002"]
    assert json.loads(await (await client.get(f"/api/ns/{NS}/v/2")).text())["playbook"]["version"] == 2


async def test_an_unknown_version_is_a_404_page(client: TestClient[Any, Any]) -> None:
    page = await client.get(f"/ns/{NS}/v/9")
    assert page.status == 404 and page.content_type == "text/html"
    assert f"{NS}: version 9 is not published or no longer retained (there are versions 1..2)" in await page.text()
    diff = await client.get(f"/ns/{NS}/diff", params={"to": "9"})
    assert diff.status == 404
    assert "version 9 is not published or no longer retained (there are versions 1..2)" in await diff.text()
    api = await client.get(f"/api/ns/{NS}/v/9")
    assert api.status == 404 and "error" in json.loads(await api.text())


async def test_bad_requests_are_pages_too(client: TestClient[Any, Any]) -> None:
    assert (await client.get("/ns/not a namespace!")).status == 404
    assert (await client.get(f"/ns/{NS}/diff", params={"from": "x"})).status == 400
    reversed_ = await client.get(f"/ns/{NS}/diff", params={"from": "2", "to": "1"})
    assert reversed_.status == 400 and "--from 2 is newer than --to 1" in await reversed_.text()
    assert (await client.get("/nowhere")).status == 404
    empty = await client.get("/ns/quiet")
    assert empty.status == 200 and "No version of this namespace is published yet." in await empty.text()


class DownStore(FakeStore):
    async def namespaces(self) -> list[str]:
        raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")


async def test_redis_unreachable_is_a_503_page() -> None:
    async with TestClient(TestServer(build_app(DownStore([], None)))) as c:
        page = await c.get("/")
        assert page.status == 503 and "cannot read Redis: ConnectionError" in await page.text()
        api = await c.get("/api/namespaces")
        assert api.status == 503 and json.loads(await api.text()) == {"error": "cannot read Redis: ConnectionError"}
    async with TestClient(TestServer(build_app(DownStore([], None), "redis://app:***@127.0.0.1:6379/0"))) as c:
        page = await c.get("/")
        assert page.status == 503 and "cannot read Redis at redis://app:***@127.0.0.1:6379/0" in await page.text()


async def test_an_outage_a_worker_reports_shows_on_the_pages_and_in_the_api() -> None:
    down = store()
    now = time.time()
    down.health = (
        {
            "worker": "vm:7",
            "updated_at": now - 1,
            "dependencies": {
                "llm": {
                    "name": "llm",
                    "target": "http://127.0.0.1:8000/v1",
                    "state": "down",
                    "since": now - 30,
                    "last_error": "ConnectionError: connection refused",
                    "holds_up": {"windows_waiting": 1, "traces_buffered": 4},
                },
                "redis": {"name": "redis", "target": "redis://127.0.0.1:6379/0", "state": "up"},
            },
        },
    )
    async with TestClient(TestServer(build_app(down))) as c:
        for path in ("/", f"/ns/{NS}"):
            outage = texts(await (await c.get(path)).text(), "outage-text")[0]
            assert len(outage) == 1 and outage[0].startswith("llm http://127.0.0.1:8000/v1: DOWN for 30 s")
            assert outage[0].endswith("ConnectionError: connection refused; holds up 1 window, 4 traces buffered")
        api = json.loads(await (await c.get("/api/health")).text())
        assert api[0]["worker"] == "vm:7" and api[0]["up"] == ["redis"] and len(api[0]["down"]) == 1


# --- the success-rate-by-version chart -----------------------------------------------------------------------


async def test_the_namespace_page_charts_success_rate_by_version_with_wilson_whiskers() -> None:
    import re

    from combee.outcomes import wilson_interval
    from combee.ui.chart import CHART_VERSIONS

    s = store()
    s.outcome_counts = {"1": OutcomeCounts(success=6, failure=6), "2": OutcomeCounts(success=9, failure=1, unknown=2),
                        "unknown": OutcomeCounts(unknown=4)}  # fmt: skip
    page = render.namespace_page(await overview.namespace_overview(s, NS))
    bars = re.findall(r'<g class="rate-bar" data-version="([^"]+)" data-rate="([^"]+)" data-low="([^"]+)"', page)
    lo = wilson_interval(6, 12)[0]
    assert bars == [("1", "0.5000", f"{lo:.4f}"), ("2", "0.9000", f"{wilson_interval(9, 10)[0]:.4f}")]
    assert 'class="no-rate" data-version="unknown"' in page and "n=4" in page  # counted, no success reported
    svg = page[page.index("<svg") : page.index("</svg>")]
    assert "style=" not in svg and "<script" not in svg  # drawn with attributes: the CSP needs no change

    many = {str(v): OutcomeCounts(success=1) for v in range(60)}
    drawn = render.namespace_page(
        dataclasses.replace(await overview.namespace_overview(s, NS), outcomes=many, current=59)
    )
    assert drawn.count('class="rate-bar"') == CHART_VERSIONS + 1  # the newest ones and "older"
    assert 'data-version="older"' in drawn


def test_no_outcomes_say_how_to_get_them() -> None:
    view = overview.NamespaceOverview(NS, 1, (HistoryEntry(1, W1, None, 1, 5, {"traces": 3}),), (), None)
    assert "No outcomes yet" in render.namespace_page(view)


# --- promotion: what agents are served, and the decisions -------------------------------------------------


async def test_the_namespace_page_shows_the_pending_candidate_and_the_decisions_newest_first() -> None:
    s = store()
    reject = {"action": "reject", "version": 3, "decided_by": "gate", "policy": "gate", "serve": 1, "at": 1.8e9 + 9,
              "reason": "worse: <b>bound</b> -0.2", "evidence": {"comparison": {"verdict": "worse"},
              "candidate": {"n": 40, "success": 9}, "baseline": {"n": 40, "success": 17}}}  # fmt: skip
    promote = {"action": "promote", "version": 1, "decided_by": "operator:ana", "policy": "gate", "serve": 1,
               "at": 1.8e9 + 5, "reason": "checked by hand"}  # fmt: skip
    s.promotion_state = {"policy": "gate", "live": 1, "previous": None, "fraction": 0.0, "rejected_through": 0,
                         "serial": 3, "candidate": 2, "decisions": [promote, reject]}  # fmt: skip
    page = render.namespace_page(await overview.namespace_overview(s, NS))
    assert "policy gate: live v1, candidate v2 pending" in page  # the head (v2) is not what agents read
    rows = page[page.index('class="decisions"') :].split('class="decision-row"')[1:]
    assert [("reject" in r, "promote" in r) for r in rows] == [(True, False), (False, True)]  # newest first
    assert "worse: worse: &lt;b&gt;bound&lt;/b&gt; -0.2 [candidate n=40 success=9; baseline n=40 success=17]" in rows[0]
    assert "<b>bound" not in page  # a reason is data: escaped


async def test_a_direct_namespace_without_decisions_says_so_and_a_bad_state_does_not_break_the_page() -> None:
    s = store()
    s.promotion_state = {"policy": "direct", "live": None, "decisions": []}
    page = render.namespace_page(await overview.namespace_overview(s, NS))
    assert "policy direct: every new version is served (head v2)" in page and "No decision recorded yet" in page
    s.promotion_state = {"policy": "lottery", "decisions": []}
    page = render.namespace_page(await overview.namespace_overview(s, NS))
    assert "unreadable serving state (unknown promotion policy &#x27;lottery&#x27;" in page
