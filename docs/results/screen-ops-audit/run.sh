#!/bin/sh
# The live screen's run rules on operations, judged on what the local model's runs published: every committed
# playbook whose run committed its traces, each bullet against the runs its sources name (python -m
# combee.tasks.audit --playbook ... --traces ...), one JSON per run folder, then summary.json. Run from the
# repository's root: sh docs/results/screen-ops-audit/run.sh
set -eu
R=docs/results
OUT=$R/screen-ops-audit
PY=${PYTHON:-.venv/bin/python}
audit() {  # name traces playbook...
    name=$1 traces=$2
    shift 2
    args=""
    for pb in "$@"; do args="$args --playbook $pb"; done
    # shellcheck disable=SC2086
    "$PY" -m combee.tasks.audit $args --traces "$traces" --out "$OUT/$name.json" > /dev/null
}
audit defences-formula64-on $R/defences-formula64/on/traces.jsonl $R/defences-formula64/on/playbooks/*.json
audit defences-formula64-off $R/defences-formula64/off/traces.jsonl $R/defences-formula64/off/playbooks/*.json
audit overload-formula64 $R/overload-formula64/traces.jsonl $R/overload-formula64/playbooks/*.json
audit overload-formula64-final $R/overload-formula64-final/traces.jsonl \
    $R/overload-formula64-final/playbooks/*.json $R/overload-formula64-final/as-run/playbooks/*.json
audit overload-formula64-more $R/overload-formula64-more/traces.jsonl \
    $R/overload-formula64-more/playbooks/*.json $R/overload-formula64-more/rederived/playbooks/*.json
audit finer-accuracy $R/finer-accuracy/traces.jsonl $R/finer-accuracy/playbooks/*.json
audit finer-accuracy-first-100 $R/finer-accuracy/first-100/traces.jsonl $R/finer-accuracy/first-100/playbooks/*.json
for n in "" -2 -3 -4 -5 -6 -7; do
    audit "redteam-real$n" "$R/redteam-real$n/traces.jsonl" "$R/redteam-real$n/playbook.json"
done
"$PY" - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = sorted(p for p in out.glob("*.json") if p.name != "summary.json")
bullets = judged = 0
changed: dict[str, dict] = {}
for path in runs:
    for playbook, doc in json.loads(path.read_text())["playbooks"].items():
        bullets += doc["bullets"]
        judged += doc["judged_with_source_runs"]
        for c in doc["by_run_rules"]:
            changed.setdefault(c["text"], {**c, "playbooks": []})["playbooks"].append(playbook)
summary = {
    "runs": [p.stem for p in runs],
    "bullets": bullets,
    "bullets_with_source_runs": judged,
    "changed_by_run_rules": sum(len(c["playbooks"]) for c in changed.values()),
    "distinct_texts_changed": len(changed),
    "refused_whole": sum(1 for c in changed.values() if c["kept"] is None),
    "changed": list(changed.values()),
}
(out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
print(json.dumps({k: v for k, v in summary.items() if k != "changed"}, indent=2))
PY
