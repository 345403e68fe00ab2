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
