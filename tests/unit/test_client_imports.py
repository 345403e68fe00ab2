"""What ``import streams.client`` (the prompt reader agents embed) loads of the project: only what it needs.

Counted in a fresh interpreter. The bound, 18, is the count measured: 13 when the wire moved below the method
(issue 27; 33 project modules before, the engine and every prompt template among them), 2 more when the client
learnt to read outcomes per version (combee.outcomes, streams.redis_outcomes) and 3 more when it learnt to serve by
promotion policy (combee.serving, streams.redis_promotion, and streams.client_cache split off to keep the client
short); the named modules must never load. A new module the client pulls in fails the count: raise it only for
what an agent's reader needs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("combee", "streams", "workers", "deploy")

_PROBE = """
import json, sys
before = set(sys.modules)
import streams.client
print(json.dumps(sorted(m for m in sys.modules if m not in before and m.split('.')[0] in %r)))
"""


def _loaded_by_client() -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE % (PROJECT,)], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return list(json.loads(out.stdout))


def test_importing_the_client_loads_no_method_module() -> None:
    loaded = _loaded_by_client()
    never = {"combee.engine", "combee.settings", "combee.prompts", "combee.learner", "combee.llm", "combee.wiring"}
    assert never.isdisjoint(loaded), sorted(never & set(loaded))


def test_importing_the_client_loads_at_most_its_measured_count() -> None:
    loaded = _loaded_by_client()
    assert len(loaded) <= 18, loaded
