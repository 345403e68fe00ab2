"""Issue 28, items 2 and 3, against the real services: an LLM outage (the SIMULATED model server stopped) shows in
``combee status`` and on the web page within seconds, with what it holds up; ``combee prompt get`` tells a
namespace still learning (exit 5) from an unknown one (exit 6) and ``--wait`` returns the first version once the
endpoint is back; ``combee status`` of an unknown namespace says so (exit 6).

The times from the outage to it showing are written to ``var/test-artifacts/health/outage.json`` and the page,
when Chromium is installed, to ``var/test-artifacts/health/outage.png``.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from combee.sim.config import SimConfig
from combee.sim.runner import SimProcess
from tests.integration.pipeline import Pipeline
from tests.integration.test_ui import Browser, ui  # noqa: F401 - ui is a fixture
from tests.support import element_texts, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "var" / "test-artifacts" / "health"
LEARNED, LATE = "health-live", "health-late"


def test_an_llm_outage_shows_and_prompt_get_knows_why_there_is_no_prompt(pipe: Pipeline, ui: str) -> None:  # noqa: F811
    assert pipe.sim is not None
    endpoint = pipe.sim.base_url
    traces, _ = pipe.traces(8, 3, LEARNED)
    pipe.start_worker(COMBEE_EMBEDDINGS="off")  # the default health interval (5 s)
    pipe.publish_traces(traces, pace_s=0.01)
    pipe.wait_learned({LEARNED: 8})
    wait_until(
        lambda: f"llm {endpoint}: up" in pipe.cli("status", check=False).stdout, 60, "the worker's health report"
    )

    port = pipe.sim.port
    stopped, stopped_wall = time.monotonic(), time.time()  # the server stops answering during stop()
    pipe.sim.stop()
    down = f"llm {endpoint}: DOWN"
    wait_until(lambda: down in pipe.cli("status", check=False).stdout, 60, "the outage in combee status", poll_s=0.2)
    in_status = time.monotonic() - stopped

    def on_page() -> bool:
        with urllib.request.urlopen(ui + "/", timeout=5) as page:
            shown = element_texts(page.read().decode(), "outage-text")[0]
        return any(t.startswith(down) for t in shown)

    wait_until(on_page, 60, "the outage on the web page", poll_s=0.2)
    on_page_s = time.monotonic() - stopped
    (report,) = json.loads(pipe.cli("status", "--json", check=False).stdout)["workers"]
    timings = {
        "health_interval_s": 5.0,
        "outage_to_detected_s": round(report["dependencies"]["llm"]["since"] - stopped_wall, 1),
        "outage_to_status_s": round(in_status, 1),
        "outage_to_page_s": round(on_page_s, 1),
        "note": "from stopping the SIMULATED model server: to the worker's first failed check (detected), to a "
        "`combee status` process printing it (polled back to back), to the page showing it",
    }
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "outage.json").write_text(json.dumps(timings, indent=1) + "\n")
    print(f"outage: {timings}")

    # A namespace whose traces arrive during the outage: known (exit 5), its window waiting on the LLM
    late, _ = pipe.traces(6, 4, LATE)
    pipe.publish_traces(late, pace_s=0.01)
    wait_until(lambda: pipe.cli("prompt", "get", LATE, check=False).returncode == 5, 60, f"{LATE} known, not learned")
    got = pipe.cli("prompt", "get", LATE, check=False)
    assert got.stderr.startswith(f"combee: error: namespace '{LATE}' has nothing learned yet") and got.stdout == ""
    assert got.stderr.count("\n") == 1 and f"combee prompt get {LATE} --wait" in got.stderr
    wait_until(
        lambda: "holds up 1 window" in pipe.cli("status", check=False).stdout, 60, "the waiting window in the outage"
    )
    text = pipe.cli("status", check=False).stdout
    assert f"{LATE}: no version published yet" in text and "None" not in text, text
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is not None:
        Browser(browser, pipe.tmp / "chromium").screenshot(ui + "/", ARTIFACTS / "outage.png")

    for verb in (("prompt", "get", "never-seen"), ("status", "never-seen")):
        unknown = pipe.cli(*verb, check=False)
        assert unknown.returncode == 6 and unknown.stderr.count("\n") == 1, unknown.stderr
        assert unknown.stderr.startswith("combee: error: unknown namespace 'never-seen'"), unknown.stderr

    # The endpoint back on the same port: --wait returns the first version, and the outage is over
    pipe.sim = SimProcess(SimConfig(seed=pipe.sim_seed, time_scale=pipe.time_scale), world="combee", port=port)
    pipe.sim.start(timeout=120)
    waited = pipe.cli("prompt", "get", LATE, "--wait", "150", check=False)
    assert waited.returncode == 0 and waited.stdout.strip(), waited.stderr
    wait_until(lambda: f"llm {endpoint}: up" in pipe.cli("status", check=False).stdout, 60, "the outage to end")
