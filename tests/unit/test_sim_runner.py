"""SimProcess / SimThread lifecycles, the responder registry and the command line."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import openai
import pytest

from combee.sim.config import SimConfig
from combee.sim.protocol import SimRequest
from combee.sim.runner import (
    RESPONDERS,
    NullResponder,
    SimProcess,
    SimStartupError,
    SimThread,
    main,
    make_responder,
)

REPO = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    """PIDs of live (non-zombie) processes whose parent is ``pid``."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_sim_process_starts_answers_and_stops_cleanly() -> None:
    before = set(_children(os.getpid()))
    with SimProcess(SimConfig(time_scale=0.001, seed=2)) as sim:
        assert sim.base_url.endswith("/v1") and sim.pid is not None
        pid = sim.pid
        assert pid in _children(os.getpid())
        async with openai.AsyncOpenAI(base_url=sim.base_url, api_key="sim", max_retries=0) as client:
            completion = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hello from another process"}]
            )
        assert completion.system_fingerprint == "combee-sim"
        assert sim.set_faults(fault_500_rate=0.25)["fault_500_rate"] == 0.25
        assert sim.config()["seed"] == 2
        stats = sim.stats()
        assert stats["requests"] == 1 and stats["by_status"] == {"200": 1}
    assert not _alive(pid)
    assert set(_children(os.getpid())) == before
    sim.stop()  # idempotent


def test_the_child_dies_with_its_parent(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys
            from combee.sim.config import SimConfig
            from combee.sim.runner import SimProcess
            sim = SimProcess(SimConfig(time_scale=0.001)).start()
            print(sim.pid, flush=True)
            os._exit(0)  # die without stopping the child
            """
        )
    )
    out = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    child = int(out.stdout.strip())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the orphaned simulator did not notice its parent died"


def test_a_failing_child_is_reported() -> None:
    with pytest.raises(SimStartupError, match="exited with code 2"):
        SimProcess(world="no-such-world").start()


def test_a_taken_port_is_reported() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["--port", str(port), "--quiet"]) == 1
        with pytest.raises(SimStartupError):
            SimThread(port=port).start()


def test_cli_rejects_bad_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--fault-500-rate", "0.8", "--fault-429-rate", "0.8"]) == 2
    assert "at most 1" in capsys.readouterr().err


def test_sim_thread_start_and_stop_are_idempotent() -> None:
    sim = SimThread(SimConfig(time_scale=0.0)).start()
    assert sim.start() is sim
    assert sim.stats()["requests"] == 0
    sim.stop()
    sim.stop()


def _factory(config: SimConfig) -> NullResponder:
    return NullResponder()


class _Constant:
    def __init__(self, text: str) -> None:
        self.text = text

    def respond(self, request: SimRequest, rng: random.Random) -> str | None:
        return self.text


def _constant_factory(config: SimConfig) -> _Constant:
    return _Constant(f"constant answer, seed {config.seed}")


async def test_a_world_given_as_an_import_path_runs_in_the_child() -> None:
    with SimProcess(SimConfig(time_scale=0.0, seed=42), world=f"{__name__}:_constant_factory") as sim:
        async with openai.AsyncOpenAI(base_url=sim.base_url, api_key="sim", max_retries=0) as client:
            completion = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "?"}])
        assert completion.choices[0].message.content == "constant answer, seed 42"
        assert sim.stats()["answered_by"] == {"responder": 1}


def test_the_combee_world_labels_sections_as_its_config_says() -> None:
    from combee.sim.world import WorldResponder

    responder = make_responder("combee", SimConfig(labels="free"))
    assert isinstance(responder, WorldResponder) and responder.behaviour.labels == "free"
    with pytest.raises(ValueError, match="labels"):
        SimConfig(labels="random:0")


def test_responders_are_made_by_name_or_import_path() -> None:
    config = SimConfig()
    assert make_responder(None, config) is None
    assert make_responder("none", config) is None
    assert "none" in RESPONDERS
    assert isinstance(make_responder(f"{__name__}:_factory", config), NullResponder)
    with pytest.raises(SimStartupError, match="unknown world"):
        make_responder("nope", config)
    with pytest.raises(SimStartupError, match="cannot import"):
        make_responder("no.such.module:factory", config)
