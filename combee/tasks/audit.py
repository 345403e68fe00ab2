"""How many of a model's recorded lessons are records of a run: the screen (:mod:`combee.screen`) applied to
every reflector answer in response caches, for a before/after comparison of prompts.

    python -m combee.tasks.audit --cache OUT/cache/learn-combee [--cache ...] --traces OUT/traces.jsonl \\
        --out audit.json
    python -m combee.tasks.audit --playbook OUT/playbooks/NAME.json [--playbook ...] [--traces OUT/traces.jsonl] \
        --out audit.json

The second form reads learned playbooks instead (``bullets[].content`` of the JSON that ``combee task`` and
``combee prompt get --json`` write) and says, per playbook, what the live screen would do with each bullet: refuse
it, trim sentences out of it, or pass it unchanged. It judges what a run published, for comparing runs with the
screen on and off (``COMBEE_SCREEN=false``). With ``--traces``, each bullet is judged as the live screen judges an
operation (:func:`combee.screen.screen_ops`): against the runs its ``sources`` name, those of them in the file;
``by_run_rules`` then lists every bullet that the run rules change beyond the rules that need no run.

A response cache keeps answers, not requests, so an answer is not tied to its trace here: the run-number rules
compare a lesson with the numbers of every trace in ``--traces`` and count it when some trace shares enough of
them (the rules that need no trace are exact). Both sides of a comparison are counted the same way.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from combee.models import Trace
from combee.screen import REASONS, RunFacts, Trimmed, run_facts, screen_lesson, trim_lesson

__all__ = ["audit", "audit_playbook", "main"]


def _answers(cache_dir: Path) -> list[str]:
    path = cache_dir / "responses.sqlite3"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return [bytes(row[0]).decode("utf-8") if isinstance(row[0], bytes) else str(row[0])
                for row in db.execute("SELECT text FROM responses")]  # fmt: skip


def _lessons(text: str) -> list[str] | None:
    """The insight texts of a reflector answer; None when ``text`` is not one."""
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("insights"), list):
        return None
    return [str(i.get("content", "")) for i in obj["insights"] if isinstance(i, dict) and i.get("content")]


VERDICTS = ("refused", "trimmed", "unchanged")


def _verdict(trimmed: Trimmed) -> str:
    """What the live screen did with one lesson: refused it (nothing left), trimmed it, or passed it unchanged."""
    return "refused" if trimmed.kept is None else "trimmed" if trimmed.dropped else "unchanged"


def audit(answers: Sequence[str], traces: Sequence[Trace]) -> dict[str, Any]:
    """Counts over the reflector answers among ``answers``: answers, lessons, and lessons per refusal reason
    (the first rule that refuses it, against the trace that makes the rule fire, if any). ``sentence_by_sentence``
    counts what the live screen does with the rules that need no run: lessons refused (nothing left), trimmed
    (some sentences taken out) and passed unchanged."""
    reasons: Counter[str] = Counter()
    by_sentence: Counter[str] = Counter()
    lessons = reflector = 0
    examples: dict[str, str] = {}
    runs = [f for f in (RunFacts.of(t) for t in traces) if f.numbers]  # once, not per lesson
    for text in answers:
        found = _lessons(text)
        if found is None:
            continue
        reflector += 1
        for lesson in found:
            lessons += 1
            trimmed = trim_lesson(lesson)
            by_sentence[_verdict(trimmed)] += 1
            reason = screen_lesson(lesson)
            for facts in runs:
                if reason is not None:
                    break
                reason = screen_lesson(lesson, facts)
            if reason is not None:
                reasons[reason] += 1
                examples.setdefault(reason, lesson[:300])
    refused = sum(reasons.values())
    return {
        "reflector_answers": reflector,
        "lessons": lessons,
        "refused": {r: reasons.get(r, 0) for r in REASONS},
        "refused_total": refused,
        "refused_share": round(refused / lessons, 4) if lessons else None,
        "sentence_by_sentence": {k: by_sentence.get(k, 0) for k in VERDICTS},
        "examples": examples,
    }


def audit_playbook(
    bullets: Sequence[tuple[str, Sequence[str]]], runs: Mapping[str, RunFacts] | None = None
) -> dict[str, Any]:
    """What the live screen does with each of ``bullets`` (text, source trace ids): bullets refused (nothing
    left), trimmed and unchanged, and the sentences it takes out by reason. Without ``runs`` by the rules that
    need no run (:func:`combee.screen.trim_lesson`); with them (trace id -> facts), each bullet against the runs
    of its sources that ``runs`` holds, as an operation is screened, and ``by_run_rules`` lists the bullets
    judged differently than without them."""
    verdicts: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    examples: dict[str, str] = {}
    changed: list[dict[str, Any]] = []
    with_runs = 0
    for text, sources in bullets:
        facts = RunFacts.union(runs[s] for s in sources if s in runs) if runs else None
        with_runs += facts is not None
        trimmed = trim_lesson(text, facts)
        verdict = _verdict(trimmed)
        verdicts[verdict] += 1
        dropped.update(trimmed.dropped)
        if verdict != "unchanged":
            examples.setdefault(verdict, text[:300])
        if facts is not None and trimmed != (alone := trim_lesson(text)):
            changed.append({"text": text, "kept": trimmed.kept, "dropped": list(trimmed.dropped),
                            "without_runs": {"kept": alone.kept, "dropped": list(alone.dropped)}})  # fmt: skip
    return {
        "bullets": len(bullets),
        "screen": {k: verdicts.get(k, 0) for k in VERDICTS},
        "sentences_taken_out": {r: dropped.get(r, 0) for r in REASONS},
        "examples": examples,
        **({"judged_with_source_runs": with_runs, "by_run_rules": changed} if runs is not None else {}),
    }


def _playbook_bullets(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    doc = json.loads(path.read_text())
    return [(str(b["content"]), tuple(str(s) for s in b.get("sources") or ()))
            for b in doc.get("bullets", []) if isinstance(b, dict) and b.get("content")]  # fmt: skip


def _read_traces(path: Path) -> list[Trace]:
    return [Trace.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m combee.tasks.audit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--cache", type=Path, action="append", help="a response cache directory")
    p.add_argument("--traces", type=Path, help="the traces the answers reflect on, or the playbooks' bullets were "
                   "learned from (JSON lines)")  # fmt: skip
    p.add_argument("--playbook", type=Path, action="append", help="a learned playbook (JSON) to judge instead")
    p.add_argument("--out", type=Path, required=True, help="where to write the counts (JSON)")
    args = p.parse_args(argv)
    if bool(args.cache) == bool(args.playbook):
        p.error("give --cache (with --traces) or --playbook, not both")
    if args.playbook:
        runs = run_facts(_read_traces(args.traces)) if args.traces else None
        judged = {str(path): audit_playbook(_playbook_bullets(path), runs) for path in args.playbook}
        doc = {**({"traces": str(args.traces)} if args.traces else {}), "playbooks": judged}
        args.out.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        fields = ("bullets", "screen", "judged_with_source_runs")
        brief = {k: {f: v[f] for f in fields if f in v} | ({"changed_by_run_rules": len(v["by_run_rules"])}
                 if "by_run_rules" in v else {}) for k, v in judged.items()}  # fmt: skip
        sys.stdout.write(json.dumps(brief, indent=2) + "\n")
        return 0
    if args.traces is None:
        p.error("--cache needs --traces")
    traces = _read_traces(args.traces)
    answers = [a for cache in args.cache for a in _answers(cache)]
    doc = {"caches": [str(c) for c in args.cache], "traces": str(args.traces), **audit(answers, traces)}
    args.out.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.write(json.dumps({k: v for k, v in doc.items() if k != "examples"}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
