"""Control characters (NUL, ESC, the C1 range, carriage return) are dropped from every free-text field of a trace
where it is validated, so none reaches a log, a terminal (`combee prompt diff`) or a prompt (issue 26, item 4).
Free text keeps newlines and tabs; one-line fields (ids, step kinds, metadata) keep neither."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from combee.models import Bullet, Playbook, Provenance, Reflection, Trace
from combee.promptdiff import VersionRecord, WindowProvenance, diff_versions, parse_provenance, render_diff

NASTY = "a\x00b\x1b[31mc\x07d\x9b2Je\rf\x85g\x7fh"  # NUL, ESC sequence, BEL, C1 CSI, CR, C1 NEL, DEL
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
LINE_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def strings(value: Any, path: str = "") -> list[tuple[str, str]]:
    """Every (path, string) in a dumped model, dict keys included."""
    if isinstance(value, str):
        return [(path, value)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [(f"{path}.key", str(k)), *strings(v, f"{path}.{k}")]]
    if isinstance(value, list | tuple):
        return [s for i, v in enumerate(value) for s in strings(v, f"{path}[{i}]")]
    return []


def test_every_free_text_field_of_a_trace_is_cleaned() -> None:
    trace = Trace.model_validate(
        {
            "trace_id": f"t-{NASTY}",
            "namespace": "ns",
            "task": f"task {NASTY}\n\tline two",
            "steps": [{"kind": f"tool{NASTY}"[:32], "content": f"step {NASTY}"}],
            "output": f"out {NASTY}",
            "feedback": {"message": f"msg {NASTY}\nmore", "ground_truth": f"gt {NASTY}"},
            "metadata": {f"k{NASTY}": f"v{NASTY}\nforged log line", "n": 3},
        }
    )
    found = strings(trace.model_dump(mode="json"))
    assert len(found) >= 10
    for path, text in found:
        assert not CONTROL.search(text), (path, text)
    one_line = ("trace_id", "steps[0].kind", "metadata.key")
    for path, text in found:
        if path.lstrip(".").startswith(one_line) or path.startswith(".metadata."):
            assert not LINE_CONTROL.search(text), (path, text)
    assert trace.task.endswith("\n\tline two")  # free text keeps its lines and tabs
    assert trace.feedback.message == "msg ab[31mcd2Jefgh\nmore"
    assert trace.trace_id == "t-ab[31mcd2Jefgh"


def test_an_id_of_control_characters_only_is_refused() -> None:
    with pytest.raises(ValidationError):
        Trace.model_validate({"trace_id": "\x1b\x00\n", "namespace": "ns", "task": "x"})
    with pytest.raises(ValidationError):
        Trace.model_validate(
            {"trace_id": "t", "namespace": "ns", "task": "x", "steps": [{"kind": "\x9b", "content": ""}]}
        )


def test_reflections_and_bullets_are_cleaned_too() -> None:
    reflection = Reflection(trace_id=f"t{NASTY}", base_version=0, diagnosis=f"d {NASTY}")
    assert not LINE_CONTROL.search(reflection.trace_id) and not CONTROL.search(reflection.diagnosis)
    p = Provenance(window_id="w", version=1)
    bullet = Bullet(id="b00001", section="rules", content=f"rule {NASTY}", created=p, updated=p, sources=(f"s{NASTY}",))
    assert not CONTROL.search(bullet.content) and not LINE_CONTROL.search(bullet.sources[0])


def test_prompt_diff_shows_no_control_characters() -> None:
    p1, p2 = Provenance(window_id="w1", version=1), Provenance(window_id="w2", version=2)
    old = Bullet(id="b00001", section="rules", content="keep units", created=p1, updated=p1)
    new = Bullet(id="b00002", section="rules", content=f"new {NASTY}", created=p2, updated=p2)
    # Provenance read back from Redis may predate the cleaning at the trace: it is cleaned as it is parsed.
    stored = parse_provenance({"provenance": [{"version": 2, "window_id": f"w2{NASTY}", "trace_ids": [NASTY]}]})
    assert stored == (WindowProvenance(2, "w2ab[31mcd2Jefgh", ("ab[31mcd2Jefgh",)),)
    records = [
        VersionRecord(1, Playbook(namespace="ns", version=1, bullets=(old,)), "w1", ()),
        VersionRecord(2, Playbook(namespace="ns", version=2, bullets=(old, new)), "w2", stored),
    ]
    text = render_diff(diff_versions(records, 1, 2))
    assert "new ab[31mcd2Jefgh" in text
    assert not CONTROL.search(text)


def test_a_dead_letter_shows_a_bad_record_key_escaped() -> None:
    from streams.codec import dead_letter

    letter = dead_letter(
        stage="window", reason="bad", topic="t", partition=0, offset=1, key=b"ns\x1b[2J\n", value=NASTY.encode()
    )
    assert letter.key == "ns\\x1b[2J\\x0a"
    assert not LINE_CONTROL.search(letter.key) and not CONTROL.search(letter.value_preview)
