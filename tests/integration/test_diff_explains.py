"""``combee prompt diff`` explains itself (issue 28, item 1), end to end on the real Kafka and Redis: SIMULATED
traces learned by a worker, then the diff of the first version names, per bullet, only the traces whose
reflections taught it (the operations' sources the combiner logged), the operation and a lesson — not the
whole window.

It also measures what a user reads: the sizes of the short, ``--full`` and ``--json`` diffs, and — when
``COMBEE_DIFF_BEFORE_ROOT`` names a checkout of the code before this change — that checkout's
``combee prompt diff`` over the same Redis data, into ``var/test-artifacts/diff/diff-size.json`` (one run's
is docs/results/diff-size.json).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from combee.sim.world import insight_keys_in
from tests.integration.pipeline import Pipeline
from tests.support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]  # five CLI runs besides

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "var" / "test-artifacts" / "diff"
NS = "demo"
TRACES = 160


def prompt_diff(pipe: Pipeline, *args: str, root: Path = ROOT) -> str:
    env = {**pipe.env(), "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-m", "combee.cli", "prompt", "diff", NS, *args], env=env, cwd=root, capture_output=True,
        text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_diff_names_per_bullet_only_the_traces_that_taught_it(pipe: Pipeline) -> None:
    traces, _ = pipe.traces(TRACES, 1, NS, "formula")
    rule_of = {t["trace_id"]: set(insight_keys_in(json.dumps(t))) for t in traces}
    pipe.create_topics()
    pipe.start_worker()
    pipe.publish_traces(traces, pace_s=0.005)
    wait_until(lambda: pipe.current_version(NS) >= 1, 900, "the first window learned", poll_s=2.0)  # all we compare
    first = pipe.deltas(NS)[0]
    window = set(first.trace_ids)
    taught = {}  # bullet id -> the traces the logged operations on it cite (what the curators said)
    assert first.evidence is not None
    for e in first.evidence.ops:
        taught.setdefault(e.bullet_id, set()).update(e.sources)

    doc = json.loads(prompt_diff(pipe, "--from", "0", "--to", "1", "--json"))
    changes = doc["changes"]
    assert changes and all(c["kind"] == "added" and c["from_evidence"] for c in changes)
    for c in changes:
        named = set(c["traces"])
        assert named and named <= window
        assert named == taught[c["bullet_id"]]
        assert named < window  # not the whole window
        bullet_rules = set(insight_keys_in(c["after"]))
        if bullet_rules:  # the SIMULATED reflector teaches a trace's own rule: the traces named carry it (most;
            # a near-duplicate fold may join another rule's lesson), where the window holds many rules
            carrying = sum(1 for t in named if rule_of[t] & bullet_rules)
            assert carrying * 2 > len(named), (c["after"], {t: sorted(rule_of[t]) for t in named})
        for t in c["why"]:
            assert t["op"] == "ADD" and t["version"] == 1
            assert all(q["trace_id"] in named for q in t["lessons"])
    assert any(t["lessons"] for c in changes for t in c["why"])

    short = prompt_diff(pipe, "--from", "0", "--to", "1")
    full = prompt_diff(pipe, "--from", "0", "--to", "1", "--full")
    assert len(short.splitlines()) == 1 + 2 * len(changes)
    for c in changes:
        assert all(t in full for t in c["traces"])
    # the sizes a user reads: the first window, and the last one once every trace is learned (a larger window)
    spans = [_measure(pipe, 0, 1, len(window))]
    wait_until(lambda: pipe.learned(NS) >= TRACES, 900, "every trace learned", poll_s=2.0)
    last = pipe.deltas(NS)[-1]
    if last.version > 1:
        spans.append(_measure(pipe, last.version - 1, last.version, len(last.trace_ids)))
    result = {
        "how": "tests/integration/test_diff_explains.py: SIMULATED traces learned by a worker on real Kafka and Redis; "
        "bytes_before is COMBEE_DIFF_BEFORE_ROOT's (the code before this change) combee prompt diff on the same data",
        "spans": spans,
    }
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "diff-size.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")


def _measure(pipe: Pipeline, v: int, w: int, window: int) -> dict[str, object]:
    span = ("--from", str(v), "--to", str(w))
    short, full, as_json = (
        prompt_diff(pipe, *span),
        prompt_diff(pipe, *span, "--full"),
        prompt_diff(pipe, *span, "--json"),
    )
    out: dict[str, object] = {
        "command": f"combee prompt diff {NS} {' '.join(span)}",
        "bullets_changed": len(json.loads(as_json)["changes"]),
        "traces_in_window": window,
        "bytes_after": {"short": len(short.encode()), "full": len(full.encode()), "json": len(as_json.encode())},
        "entry_after": "\n".join(short.splitlines()[1:3]),
        "entry_after_full": _entry(full),
    }
    before_root = os.environ.get("COMBEE_DIFF_BEFORE_ROOT")
    if before_root:
        before = prompt_diff(pipe, *span, root=Path(before_root))
        out["bytes_before"] = len(before.encode())
        out["entry_before"] = "\n".join(before.splitlines()[1:3])
    return out


def _entry(full: str) -> str:
    """The first bullet's lines of a ``--full`` diff."""
    lines = full.splitlines()[1:]
    end = next((i for i, line in enumerate(lines[1:], start=1) if not line.startswith(" ")), len(lines))
    return "\n".join(lines[:end])
