"""``combee ui``'s guards (issue 26 item 5): the Host allow-list against DNS rebinding, the security headers on
every answer, a bounded diff, and no 500 on any version number."""

from __future__ import annotations

import hashlib
import re
from base64 import b64encode
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from combee.models import Playbook
from combee.promptdiff import MAX_DIFF_VERSIONS, VersionRecord
from combee.store import PublishedPrompt
from combee.ui.guard import HostCheck, host_name
from combee.ui.server import build_app
from streams.redis_records import MAX_VERSION, check_version
from tests.unit.test_ui import NS, STATUS, FakeStore, _bullet, store

HEADERS = ("Content-Security-Policy", "X-Content-Type-Options", "X-Frame-Options", "Referrer-Policy")


class CheckingStore(FakeStore):
    """Refuses a version out of range as :class:`streams.redis_store.RedisPromptStore` does (ValueError), and
    counts the playbooks read."""

    reads = 0

    async def get_version(self, namespace: str, version: int) -> PublishedPrompt | None:
        check_version(version)
        return await super().get_version(namespace, version)

    async def version_record(self, namespace: str, version: int) -> VersionRecord | None:
        check_version(version)
        self.reads += 1
        return await super().version_record(namespace, version)


def _many(n: int) -> CheckingStore:
    playbooks = []
    for v in range(1, n + 1):
        bullets = tuple(_bullet(f"b{i:05d}", f"lesson {i}", (f"{NS}/p0/{i}-{i}", i)) for i in range(1, v + 1))
        pb = Playbook(namespace=NS, version=v, bullets=bullets, next_id=v + 1)
        playbooks.append((pb, f"{NS}/p0/{v}-{v}", [f"t{v}"]))
    return CheckingStore(playbooks, STATUS)


# --- Host allow-list --------------------------------------------------------------------------------------


def test_a_host_header_is_read_without_its_port() -> None:
    assert host_name("LocalHost.:8765") == "localhost"
    assert host_name("[::1]:8765") == "::1" and host_name("127.0.0.1") == "127.0.0.1"
    assert host_name("::1") is None and host_name("[::1") is None and host_name("") is None
    check = HostCheck("ui.internal", ["Combee.Example"])
    for allowed in ("localhost:1", "127.0.0.1:8765", "[::1]:8765", "10.1.2.3", "ui.internal:80", "combee.example"):
        assert check.allows(allowed), allowed
    for refused in (None, "", "attacker.example", "attacker.example:8765", "localhost.attacker.example", "ui"):
        assert not check.allows(refused), refused


async def test_a_request_naming_another_host_is_refused_with_421() -> None:
    hosts = HostCheck("0.0.0.0", ["combee.internal"])
    async with TestClient(TestServer(build_app(store(), hosts=hosts))) as c:
        for path in ("/api/namespaces", f"/api/ns/{NS}", "/"):
            refused = await c.get(path, headers={"Host": "attacker.example:8765"})
            body = await refused.text()
            assert refused.status == 421 and NS not in body, path
            assert "'attacker.example:8765' is not a name of this server" in body and "--allow-host" in body
        for host in ("localhost:8765", "[::1]:8765", "combee.internal", "192.168.1.20:8765"):
            assert (await c.get("/api/namespaces", headers={"Host": host})).status == 200, host


# --- headers ----------------------------------------------------------------------------------------------


async def test_every_answer_carries_the_security_headers_and_the_policy_fits_the_page() -> None:
    async with TestClient(TestServer(build_app(store()))) as c:
        answers = [await c.get(p) for p in ("/", f"/ns/{NS}/v/1", "/api/namespaces", "/nowhere", f"/ns/{NS}/v/9")]
        answers.append(await c.get("/", headers={"Host": "attacker.example"}))
        assert [a.status for a in answers] == [200, 200, 200, 404, 404, 421]
        for answer in answers:
            assert all(answer.headers.get(h) for h in HEADERS), (answer.url, dict(answer.headers))
            assert answer.headers["X-Content-Type-Options"] == "nosniff"
            assert answer.headers["X-Frame-Options"] == "DENY" and answer.headers["Referrer-Policy"] == "no-referrer"
        page = await answers[1].text()
    policy = dict(d.strip().split(" ", 1) for d in answers[0].headers["Content-Security-Policy"].split(";"))
    assert policy["default-src"] == "'none'" and policy["frame-ancestors"] == "'none'"
    styles = re.findall(r"<style>(.*?)</style>", page, re.S)
    assert len(styles) == 1 and "<script" not in page and " src=" not in page and "<link" not in page
    digest = b64encode(hashlib.sha256(styles[0].encode()).digest()).decode()
    assert policy["style-src"] == f"'sha256-{digest}'"  # the page's own stylesheet, and nothing inline else


# --- a bounded diff ---------------------------------------------------------------------------------------


async def test_a_diff_reading_more_versions_than_allowed_is_refused_before_any_read() -> None:
    s = _many(5)
    async with TestClient(TestServer(build_app(s, max_diff_versions=3))) as c:
        wide = await c.get(f"/ns/{NS}/diff", params={"from": "0"})
        text = await wide.text()
        assert wide.status == 400 and s.reads == 0
        assert "reads 5 published versions; at most 3" in text and "compare from v3 or later" in text
        api = await c.get(f"/api/ns/{NS}/diff", params={"from": "1", "to": "4"})
        assert api.status == 400 and s.reads == 0
        within = await c.get(f"/api/ns/{NS}/diff", params={"from": "3"})
        assert within.status == 200 and s.reads == 3


async def test_the_default_bound_refuses_a_diff_from_the_empty_playbook_over_many_versions() -> None:
    s = _many(MAX_DIFF_VERSIONS + 1)
    async with TestClient(TestServer(build_app(s))) as c:
        assert (await c.get(f"/ns/{NS}/diff", params={"from": "0"})).status == 400 and s.reads == 0
        assert (await c.get(f"/ns/{NS}/diff", params={"from": "2"})).status == 200
        assert s.reads == MAX_DIFF_VERSIONS


# --- version numbers --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "params", "status"),
    [
        (f"/ns/{NS}/v/{MAX_VERSION + 1}", {}, 404),
        (f"/api/ns/{NS}/v/{MAX_VERSION + 1}", {}, 404),
        (f"/ns/{NS}/v/{'9' * 5000}", {}, 404),
        (f"/ns/{NS}/v/-1", {}, 404),
        (f"/ns/{NS}/v/x", {}, 404),
        (f"/ns/{NS}/diff", {"from": str(MAX_VERSION + 1)}, 400),
        (f"/ns/{NS}/diff", {"to": str(2**64)}, 400),
        (f"/api/ns/{NS}/diff", {"from": "-1"}, 400),
        (f"/ns/{NS}/diff", {"to": "1e3"}, 400),
    ],
)
async def test_no_version_number_is_a_500(path: str, params: dict[str, Any], status: int) -> None:
    async with TestClient(TestServer(build_app(_many(2)))) as c:
        answer = await c.get(path, params=params)
        assert answer.status == status, await answer.text()
