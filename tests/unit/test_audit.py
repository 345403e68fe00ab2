"""The screen audit (combee/tasks/audit.py): counts over reflector answers a response cache keeps."""

from __future__ import annotations

import json
from pathlib import Path

from combee.llm import ChatResponse
from combee.llm_openai.cache import ResponseCache
from combee.models import Feedback, Trace
from combee.tasks.audit import audit, main


def _reflection(*lessons: str) -> str:
    insights = [{"section": "formulas_and_calculations", "content": text} for text in lessons]
    return json.dumps({"diagnosis": "d", "insights": insights})


TRACE = Trace(trace_id="t1", namespace="ns", task="Compute ROI on a cost of 1,600 and a gain of 4,000.",
              output="2.50", feedback=Feedback(success=False, ground_truth="1.50"))  # fmt: skip

RULE = "ROI is (gain - cost) / cost."
RECORD = "The agent correctly applied the ROI formula."
RULE_AND_EXAMPLE = "ROI is (gain - cost) / cost. In this case we get 2.00."
ANSWER = "The ROI here should be 1.50."


def test_counts_refusals_by_reason_and_what_the_screen_does_sentence_by_sentence() -> None:
    answers = [_reflection(RULE, RECORD), _reflection(RULE_AND_EXAMPLE, ANSWER), "not json", '{"operations": []}']
    doc = audit(answers, [TRACE])
    assert doc["reflector_answers"] == 2 and doc["lessons"] == 4
    # taken whole: the record and the lesson with an example record the run; the answer is the trace's
    assert doc["refused"]["records_the_run"] == 2 and doc["refused"]["copies_the_answer"] == 1
    assert doc["refused_total"] == 3 and doc["refused_share"] == 0.75
    # the live screen without the run: the record goes, the example is trimmed from its rule, the rest passes
    assert doc["sentence_by_sentence"] == {"refused": 1, "trimmed": 1, "unchanged": 2}


def test_the_command_reads_a_response_cache_and_writes_its_counts(tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path / "cache")
    cache.put("k1", ChatResponse(text=_reflection(RULE, RECORD)))
    cache.put("k2", ChatResponse(text='{"operations": []}'))
    traces = tmp_path / "traces.jsonl"
    traces.write_text(TRACE.model_dump_json() + "\n")
    out = tmp_path / "audit.json"
    assert main(["--cache", str(tmp_path / "cache"), "--traces", str(traces), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["reflector_answers"] == 1 and doc["lessons"] == 2 and doc["refused_total"] == 1
    assert doc["examples"] == {"records_the_run": RECORD}


def test_a_playbook_is_judged_bullet_by_bullet(tmp_path: Path) -> None:
    bullets = [{"id": f"b{i:05d}", "section": "s", "content": text} for i, text in
               enumerate((RULE, RECORD, RULE_AND_EXAMPLE), start=1)]  # fmt: skip
    path = tmp_path / "playbook.json"
    path.write_text(json.dumps({"namespace": "ns", "version": 1, "bullets": bullets}))
    out = tmp_path / "audit.json"
    assert main(["--playbook", str(path), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())["playbooks"][str(path)]
    assert doc["bullets"] == 3
    assert doc["screen"] == {"refused": 1, "trimmed": 1, "unchanged": 1}
    assert doc["sentences_taken_out"]["records_the_run"] == 2
    assert doc["examples"] == {"refused": RECORD, "trimmed": RULE_AND_EXAMPLE}


def test_with_the_traces_each_bullet_is_judged_against_its_own_source_runs(tmp_path: Path) -> None:
    # a worked example with the run's numbers passes the rules that need no run; against its source it goes
    example = "ROI is (gain - cost) / cost. With a cost of 1,600 and a gain of 4,000 it is 1.50."
    bullets = [{"id": "b00001", "section": "s", "content": example, "sources": ["t1"]},
               {"id": "b00002", "section": "s", "content": example, "sources": ["elsewhere"]}]  # fmt: skip
    path = tmp_path / "playbook.json"
    path.write_text(json.dumps({"namespace": "ns", "version": 1, "bullets": bullets}))
    traces = tmp_path / "traces.jsonl"
    traces.write_text(TRACE.model_dump_json() + "\n")
    out = tmp_path / "audit.json"
    assert main(["--playbook", str(path), "--out", str(out)]) == 0
    alone = json.loads(out.read_text())["playbooks"][str(path)]
    assert alone["screen"]["unchanged"] == 2 and "by_run_rules" not in alone
    assert main(["--playbook", str(path), "--traces", str(traces), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())["playbooks"][str(path)]
    assert doc["judged_with_source_runs"] == 1 and doc["screen"] == {"refused": 0, "trimmed": 1, "unchanged": 1}
    (changed,) = doc["by_run_rules"]
    assert changed["kept"] == RULE and changed["dropped"] == ["copies_the_answer"]
    assert changed["without_runs"] == {"kept": example, "dropped": []}
