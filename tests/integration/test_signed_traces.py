"""Signed traces end to end on the real Kafka and Redis (issue 25, item 3, first half), with the SIMULATED model:
``combee publish --producer`` signs a producer's traces with its key (COMBEE_PRODUCER_KEY), the worker verifies
them against COMBEE_PRODUCER_KEYS_FILE, and ``combee prompt diff`` names the verified producer of what they
taught; an unsigned trace to the namespace that requires signatures (COMBEE_REQUIRE_SIGNED) is dead-lettered
with the reason, even when it names that producer; ``combee replay`` leaves it out too and keeps the verified
producer of the others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.pipeline import Pipeline

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

NS = "ns-signed"
KEY = "agent-seven-key-0123456789abcdef"


def test_a_signed_traces_lesson_names_its_producer_and_an_unsigned_one_is_dead_lettered(
    pipe: Pipeline, tmp_path: Path
) -> None:
    keys = tmp_path / "producer-keys.json"
    keys.write_text(json.dumps({"agent-7": {"key": KEY, "namespaces": [NS]}}))
    pipe.env_extra.update({"COMBEE_PRODUCER_KEYS_FILE": str(keys), "COMBEE_REQUIRE_SIGNED": NS})
    pipe.create_topics()
    pipe.start_worker()

    traces, _ = pipe.traces(12, seed=5, namespace=NS)  # SIMULATED traces: hidden insights the sim reflects on
    signed_file = tmp_path / "signed.jsonl"
    signed_file.write_text("".join(json.dumps(t) + "\n" for t in traces[:10]))
    out = pipe.cli("publish", "--traces", str(signed_file), "--producer", "agent-7", COMBEE_PRODUCER_KEY=KEY)
    assert "signed as agent-7" in out.stdout
    unsigned = [dict(t, metadata={"producer": "agent-7"}) for t in traces[10:]]  # claims agent-7, no signature
    pipe.publish_traces(unsigned)

    pipe.wait_learned({NS: 10}, timeout_s=600)
    letters = [d for d in pipe.dead_letters() if d.key == NS]
    assert sorted(d.reason for d in letters) == sorted(
        f"unsigned: trace {t['trace_id']!r} of {NS!r} is not signed (COMBEE_REQUIRE_SIGNED)" for t in unsigned
    )
    bullets = pipe.published_playbook(NS).bullets
    taught = [b for b in bullets if b.sources]
    assert taught and all(b.verified_producers == ("agent-7",) for b in taught)

    diff = pipe.cli("prompt", "diff", NS, "--from", "0").stdout
    assert f"{NS}: v0 -> v" in diff
    assert "verified producers: agent-7" in diff
    as_json = json.loads(pipe.cli("prompt", "diff", NS, "--from", "0", "--json").stdout)
    assert {tuple(c["producers"]) for c in as_json["changes"] if c["traces"]} == {("agent-7",)}

    # A replay leaves out what the live run refused and keeps the producers verified for the source namespace.
    copy = f"{NS}-copy"
    replayed = pipe.cli("replay", "--namespace", NS, "--into", copy, "--wait", "--timeout", "600").stdout
    assert "replaying 10 traces" in replayed and "2 traces the producer identity policy refuses left out" in replayed
    copied = [b for b in pipe.published_playbook(copy).bullets if b.sources]
    assert copied and all(b.verified_producers == ("agent-7",) for b in copied)
