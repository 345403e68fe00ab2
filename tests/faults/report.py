"""Markdown tables of a fault-suite session: ``python -m tests.faults.report [var/faults]``.

Reads ``figures.jsonl`` (one line per scenario run) and, if present, ``soak.json`` from the output directory
(``$COMBEE_FAULTS_OUT``, default ``var/faults``) and prints the tables used in docs/reliability.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return format(value, spec)


def _liveness(per_ns: dict[str, dict[str, float]]) -> str:
    if not per_ns:
        return "–"
    worst = max(per_ns.values(), key=lambda v: v["final_after_s"])
    return f"{worst['final_after_s']:.1f} / {worst['bound_s']:.0f}"


def scenario_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| scenario | run | published | learned | dead-lettered | refused by broker | lost | windows applied "
        "| applied twice | version regressions | half-applied | crashes | retention | vs fault-free same windows "
        "| same answers ⇒ equal | vs control run | stalls | last trace → final version (s, worst ns / bound) "
        "| seconds |"
    )
    lines = [head, "|" + "---|" * 19]
    for f in rows:
        lines.append(
            f"| {f['scenario']} | {f['run']} | {f['published']} | {f['learned']} | {f['dead_lettered']} | "
            f"{f['refused_by_broker']} | {f['lost'] + f['bad_unaccounted']} | {f['windows_applied']} | "
            f"{f['windows_applied_twice']} | {f['version_regressions']} | {f['half_applied']} | "
            f"{f['worker_crashes']} | {_fmt(f.get('retention'), '.3f')} | {_fmt(f.get('retention_ratio'), '.2f')} | "
            f"{_fmt(f.get('same_answers_equal'))} | {_fmt(f.get('ratio_vs_control'), '.2f')} | "
            f"{_fmt(f.get('stalls'))} | {_liveness(f.get('liveness') or {})} | {f['seconds']:.0f} |"
        )
    return "\n".join(lines)


def soak_table(soak: dict[str, Any]) -> str:
    s = soak["summary"]
    lines = [
        "| process | RSS start | RSS middle | RSS end | max | growth over the last half |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("learner", "curate", "simulator"):
        r = s[f"rss_{name}"]
        lines.append(
            f"| {name} | {r['start_mb']} MB | {r['mid_mb']} MB | {r['end_mb']} MB | {r['max_mb']} MB | "
            f"{r['growth_last_half']:+.1%} |"
        )
    lag = s["lag"]
    lines.append("")
    lines.append(
        f"Lag (traces not yet committed by the worker group): max {lag['max_first_half']} in the first half, "
        f"{lag['max_second_half']} in the second (median {lag['median_second_half']}; bound {lag['bound']:.0f}), "
        f"{lag['after_settling']} after settling ({lag['settle_s']} s after the last trace)."
    )
    v = s["versions"]
    lines.append(
        f"Versions (sum over the {s['namespaces']} namespaces) at 0, ¼, ½, ¾ and the end: "
        f"{', '.join(str(x) for x in v['per_quarter_total'])}; namespaces that stalled in a quarter: "
        f"{len(v['stalled'])}."
    )
    lines.append("")
    lines.append("| t (s) | published | RSS learner | RSS curate | RSS simulator | lag | versions |")
    lines.append("|---|---|---|---|---|---|---|")
    samples = soak["samples"]
    step = max(1, len(samples) // 12)
    for row in samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else []):
        lines.append(
            f"| {row['t']:.0f} | {row['published']} | {(row.get('rss_learner_kib') or 0) / 1024:.1f} MB | "
            f"{(row.get('rss_curate_kib') or 0) / 1024:.1f} MB | {(row.get('rss_simulator_kib') or 0) / 1024:.1f} MB"
            f" | {row.get('lag')} | {row.get('versions_total')} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from tests.faults.suite import output_dir

    out = Path(argv[0]) if argv else output_dir()
    figures = out / "figures.jsonl"
    if figures.exists():
        rows = [json.loads(line) for line in figures.read_text().splitlines() if line.strip()]
        print(scenario_table(rows))
    soak = out / "soak.json"
    if soak.exists():
        print()
        print(soak_table(json.loads(soak.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
