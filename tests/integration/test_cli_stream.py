"""The streaming verbs of the ``combee`` command against the real services: publish, prompt, status."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from combee.playbook import render_prompt
from tests.integration.pipeline import Pipeline, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_publish_prompt_history_rollback_and_status(pipe: Pipeline, tmp_path: Path) -> None:
    traces, _ = pipe.traces(60, 8, "ns-cli")
    path = tmp_path / "t.jsonl"
    lines = [json.dumps(t) for t in traces]
    lines.insert(5, "{not json")
    path.write_text("\n".join(lines) + "\n")
    pipe.create_topics()  # deployment creates the topics; the worker's own creation may come after the publish
    pipe.start_worker()

    out = pipe.cli("publish", "--traces", str(path))
    assert "published 60 traces" in out.stdout and "1 malformed lines skipped" in out.stdout
    assert f"{path}:6: skipped: not valid JSON" in out.stderr
    pipe.wait_learned({"ns-cli": 60})
    version = pipe.current_version("ns-cli")
    assert version >= 2

    got = pipe.cli("prompt", "get", "ns-cli")
    assert got.stdout == render_prompt(pipe.published_playbook("ns-cli"))
    as_json = json.loads(pipe.cli("prompt", "get", "ns-cli", "--json").stdout)
    assert as_json["version"] == version

    history = pipe.cli("prompt", "history", "ns-cli").stdout.splitlines()
    assert history[-1].startswith("policy direct:"), history  # the promotion summary last (docs/promotion.md)
    versions = [line for line in history if re.match(r"v\d", line)]
    assert [int(line.split()[0][1:]) for line in versions] == list(range(version, 0, -1))

    watched = pipe.cli("prompt", "watch", "ns-cli", "--count", "1", "--versions-only").stdout
    assert f"--- version {version} " in watched

    rolled = pipe.cli("prompt", "rollback", "ns-cli", "--to", "1")
    assert f"version {version + 1} now holds the content of version 1" in rolled.stdout
    new = pipe.published_playbook("ns-cli")
    old = pipe.published_playbook("ns-cli", 1)
    assert new.version == version + 1 and new.bullets == old.bullets
    rollback_record = pipe.deltas("ns-cli")[-1]
    assert rollback_record.rollback_to == 1 and rollback_record.version == version + 1

    def status_ready() -> bool:
        rows = json.loads(pipe.cli("status", "ns-cli", "--json").stdout)["namespaces"]
        return bool(rows and rows[0].get("worker_status"))

    wait_until(status_ready, 30, "the worker's status report")
    text = pipe.cli("status").stdout
    assert f"ns-cli: version {version + 1}" in text and "controller:" in text
    row = json.loads(pipe.cli("status", "ns-cli", "--json").stdout)["namespaces"][0]
    assert row["lag"] == 0 and row["worker_status"]["traces_seen"] == 60


def test_cli_errors_are_one_line(pipe: Pipeline) -> None:
    bad = pipe.cli("prompt", "get", "no such ns!", check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "invalid namespace" in bad.stderr
    missing = pipe.cli("prompt", "get", "never-published", check=False)
    assert missing.returncode == 6 and missing.stderr.count("\n") == 1  # unknown namespace (5: not learned yet)
