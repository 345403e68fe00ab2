"""What ``combee prompt history`` and ``combee status`` print about outcomes per version (pure formatting over
what Redis holds; tests/integration/test_outcomes.py runs both against the real services)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from combee.cli.prompt import _history
from combee.cli.status import SHOWN_VERSIONS, format_status
from combee.outcomes import OutcomeCounts, as_json, describe, version_order
from streams.redis_outcomes import parse_outcomes
from streams.redis_records import HistoryEntry


@dataclass
class Client:
    versions: list[int]
    counts: dict[str, OutcomeCounts] = field(default_factory=dict)

    def outcomes(self) -> dict[str, OutcomeCounts]:
        return self.counts

    def history(self, limit: int = 20) -> list[HistoryEntry]:
        return [HistoryEntry(version=v, bullets=v, tokens=10 * v) for v in self.versions[:limit]]


def test_describe_gives_n_rate_interval_and_mean_score() -> None:
    # 6 of 12 at z = 1.96: 1/2 ± 1.96 / (2·sqrt(12 + 1.96²)) = 0.5 ± 0.2463 -> [25%, 75%] after rounding
    text = describe(OutcomeCounts(success=6, failure=6, unknown=2, score_sum=7.0, score_count=14))
    assert text == "n=14 success 50% [25%, 75%] (6/12 decided) mean score 0.5"
    assert describe(OutcomeCounts(unknown=3)) == "n=3 success rate - (no success/failure reported)"


def test_history_puts_each_versions_outcomes_on_its_line(capsys: pytest.CaptureFixture[str]) -> None:
    counts = {
        "3": OutcomeCounts(success=9, failure=1),
        "1": OutcomeCounts(success=1, failure=3),
        "unknown": OutcomeCounts(unknown=2),
    }
    _history(Client([3, 2], counts), limit=2)  # type: ignore[arg-type]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("v3 ") and lines[0].endswith("outcomes: " + describe(counts["3"]))
    assert lines[1].startswith("v2 ") and lines[1].endswith("outcomes: none reported")
    assert lines[2] == "v1      (not listed) outcomes: " + describe(counts["1"])  # past --limit, still counted
    assert (
        lines[3]
        == "unknown version (above the live one when counted): n=2 success rate - (no success/failure reported)"
    )
    assert [int(line.split()[0][1:]) for line in lines[:2]] == [3, 2]  # scripts reading the version still can


def status_with(outcomes: dict[str, OutcomeCounts]) -> dict:
    ordered = {k: as_json(outcomes[k]) for k in sorted(outcomes, key=version_order)}
    row = {"namespace": "demo", "state": "published", "version": 9, "lag": 0, "worker_status": None}
    return {"workers": [], "namespaces": [{**row, "outcomes": ordered}]}


def test_status_shows_the_newest_versions_then_unknown() -> None:
    counts = {str(v): OutcomeCounts(success=v, failure=1) for v in range(1, 10)}
    counts["unknown"] = OutcomeCounts(failure=2)
    text = format_status(status_with(counts), now=0.0)
    shown = [line.split(":")[0].strip() for line in text.splitlines() if line.startswith("  outcomes v")]
    assert shown == [f"outcomes v{v}" for v in range(9, 9 - SHOWN_VERSIONS, -1)]
    assert f"  outcomes v9: {describe(counts['9'])}" in text
    assert f"outcomes of {9 - SHOWN_VERSIONS} older versions" in text
    assert f"  outcomes unknown version: {describe(counts['unknown'])}" in text
    assert "outcomes: none reported" in format_status(status_with({}), now=0.0)


def test_the_stored_hash_reads_back_and_junk_is_skipped() -> None:
    raw = {
        b"3|success": b"4", b"3|failure": b"1", b"3|score_sum": b"2.5", b"3|score_n": b"5",
        "unknown|unknown": "2", "3|bogus": "9", "4|success": "not a number", "nofield": "1",
    }  # fmt: skip
    assert parse_outcomes(raw) == {
        "3": OutcomeCounts(success=4, failure=1, score_sum=2.5, score_count=5),
        "unknown": OutcomeCounts(unknown=2),
    }
