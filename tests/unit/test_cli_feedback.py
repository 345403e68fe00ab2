"""The command line around trusted feedback (no broker needed: each case stops before connecting)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_cli import combee

UNREACHABLE = {"COMBEE_KAFKA_BOOTSTRAP": "127.0.0.1:1"}


def test_publish_feedback_without_a_key_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    verdicts = tmp_path / "v.jsonl"
    verdicts.write_text('{"trace_id": "t1", "namespace": "support", "feedback": {"success": true}}\n')
    done = combee("publish", "--feedback", str(verdicts), env={**UNREACHABLE, "COMBEE_PRODUCER_KEY": ""})
    assert done.returncode == 2 and "must be signed" in done.stderr


def test_publish_feedback_refuses_a_malformed_line_naming_it(tmp_path: Path) -> None:
    verdicts = tmp_path / "v.jsonl"
    verdicts.write_text('{"trace_id": "t1", "namespace": "support", "feedback": {"success": "maybe"}}\n')
    done = combee(
        "publish", "--feedback", str(verdicts), "--producer", "grader",
        env={**UNREACHABLE, "COMBEE_PRODUCER_KEY": "grader-key-0123456789"},
    )  # fmt: skip
    assert done.returncode == 2 and f"{verdicts}:1: invalid feedback record" in done.stderr


def test_replay_refuses_a_namespace_whose_feedback_is_trusted() -> None:
    env = {**UNREACHABLE, "COMBEE_FEEDBACK_NAMESPACES": "graded=required"}
    done = combee("replay", "--namespace", "graded", "--into", "copy", env=env)
    assert done.returncode == 2 and "graded takes its feedback from trusted records" in done.stderr


def test_topics_acls_prints_the_feedback_sources_grant() -> None:
    done = combee("topics", "acls", "feedback", "--principal", "User:graders", "--prefix", "acme")
    assert done.returncode == 0
    assert done.stdout.count("kafka-acls.sh") == 1
    assert "--topic 'acme.feedback'" in done.stdout and "--operation Write" in done.stdout
