"""Run the simulator for tests and benchmarks: in a subprocess, in a thread, or from the command line.

* :class:`SimProcess` starts ``python -m combee.sim.runner`` as a child process, so the server's CPU does not
  share the client's GIL. The child prints one ready line (``COMBEE-SIM READY <base_url>``) on stdout and
  watches its stdin: when the parent closes the pipe — or dies, which closes it too — the child exits.
* :class:`SimThread` runs the same server in a background thread with its own event loop (fast unit tests).

Both take a :class:`~combee.sim.config.SimConfig` and a *world* naming the responder to build: a key of
:data:`RESPONDERS`, or ``"package.module:factory"`` (a callable taking the ``SimConfig`` and returning a
responder, imported in the server's process). :class:`SimThread` also accepts a responder object directly.

Command line (every delay is multiplied by ``--time-scale``; the server labels every answer as simulated)::

    python -m combee.sim.runner --port 8000 --seed 0 --time-scale 1 --max-concurrency 256 --world none \\
        [--fault-500-rate R] [--fault-429-rate R] [--retry-after-s S] [--fault-timeout-rate R] \\
        [--timeout-hang-s S] [--fault-malformed-rate R] [--outage] [--config-json JSON] [--exit-on-stdin-eof]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

from combee.errors import CombeeError
from combee.sim.config import SimConfig
from combee.sim.protocol import Responder, SimRequest
from combee.sim.server import build_app, serve, start_site

__all__ = [
    "READY_PREFIX",
    "RESPONDERS",
    "NullResponder",
    "SimProcess",
    "SimStartupError",
    "SimThread",
    "main",
    "make_responder",
]

log = logging.getLogger("combee.sim")

READY_PREFIX = "COMBEE-SIM READY "
"""The child's stdout line announcing the base URL, e.g. ``COMBEE-SIM READY http://127.0.0.1:40123/v1``."""


class SimStartupError(CombeeError):
    """The simulator did not come up (bad world name, port in use, child died before its ready line)."""


class NullResponder:
    """Recognises nothing: every request gets the server's generic answer."""

    def respond(self, request: SimRequest, rng: Any) -> str | None:
        return None


def _combee_world(config: SimConfig) -> Responder:
    from combee.sim.world import Behaviour, WorldResponder

    return WorldResponder(
        Behaviour(seed=config.seed, merge_capacity_factor=config.merge_capacity_factor, labels=config.labels)
    )


RESPONDERS: dict[str, Callable[[SimConfig], Responder]] = {
    "none": lambda config: NullResponder(),
    "combee": _combee_world,
}
"""Named responder factories a subprocess can build. Register more with ``RESPONDERS["name"] = factory`` in
this module (the child imports it), or pass ``world="package.module:factory"`` instead."""


def make_responder(world: str | None, config: SimConfig) -> Responder | None:
    """The responder named by ``world`` (None or ``"none"`` → None: generic answers only).

    Raises :class:`SimStartupError` for an unknown name or an import path that does not resolve.
    """
    if world is None or world == "none":
        return None
    factory = RESPONDERS.get(world)
    if factory is None:
        if ":" not in world:
            known = ", ".join(sorted(RESPONDERS))
            raise SimStartupError(f"unknown world {world!r}: use one of {known} or 'package.module:factory'")
        module_name, _, attr = world.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise SimStartupError(f"cannot import world factory {world!r}: {exc}") from exc
    return factory(config)


class _Admin:
    """Blocking admin calls over HTTP (proxies ignored); shared by SimProcess and SimThread."""

    _opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    root_url: str

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ending in ``/v1``."""
        return self.root_url + "/v1"

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(self.root_url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        with self._opener.open(request, timeout=30) as response:
            return json.loads(response.read())

    def set_faults(self, **faults: Any) -> dict[str, Any]:
        """Change fault settings (``fault_500_rate=0.1``, ``outage=True``, …); returns the new settings.

        Raises ``urllib.error.HTTPError`` (400) for an unknown field or an invalid value.
        """
        result: dict[str, Any] = self._call("POST", "/admin/faults", faults)
        return result

    def stats(self) -> dict[str, Any]:
        """The server's ``/admin/stats`` document."""
        result: dict[str, Any] = self._call("GET", "/admin/stats")
        return result

    def malformed_log(self) -> dict[str, list[int]]:
        """The request counters of every malformed-content fault, per request digest (hex), in order
        (``/admin/malformed``): what :class:`combee.sim.inproc.InProcessSim` needs to replay them."""
        result: dict[str, list[int]] = {}
        for entry in self._call("GET", "/admin/malformed")["malformed"]:
            result.setdefault(entry["digest"], []).append(int(entry["counter"]))
        return result

    def reset_stats(self) -> dict[str, Any]:
        """Zero the server's counters; returns the fresh stats."""
        result: dict[str, Any] = self._call("POST", "/admin/stats/reset", {})
        return result

    def config(self) -> dict[str, Any]:
        """The server's current config (faults as changed at run time)."""
        result: dict[str, Any] = self._call("GET", "/admin/config")
        return result


class SimThread(_Admin):
    """The simulator in a daemon thread with its own event loop; for fast, in-process tests.

    The server shares the caller's GIL, so do not use it to measure throughput (use :class:`SimProcess`).
    """

    def __init__(
        self,
        config: SimConfig | None = None,
        responder: Responder | None = None,
        *,
        world: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.sim_config = config or SimConfig()
        self.responder = responder if responder is not None else make_responder(world, self.sim_config)
        self.host = host
        self.port = port
        self.root_url = ""
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self, timeout: float = 10.0) -> Self:
        """Start serving; returns once the port is bound. Raises :class:`SimStartupError` on failure."""
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._run, name="combee-sim", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise SimStartupError("the simulator thread did not start in time")
        if self._error is not None:
            raise SimStartupError(f"the simulator thread failed: {self._error!r}") from self._error
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()
            loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        runner, self.port = await start_site(build_app(self.sim_config, self.responder), self.host, self.port)
        self.root_url = f"http://{self.host}:{self.port}"
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (in-flight requests get a couple of seconds) and join the thread. Idempotent."""
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed between the check and the call
                loop.call_soon_threadsafe(stop.set)
        thread.join(timeout)
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class SimProcess(_Admin):
    """The simulator in a child process (``python -m combee.sim.runner``).

    The child exits when :meth:`stop` closes its stdin, and also when this process dies (the pipe closes). If
    it does not exit within ``stop``'s timeout it is terminated, then killed, by its PID.
    """

    def __init__(
        self,
        config: SimConfig | None = None,
        *,
        world: str | None = "none",
        host: str = "127.0.0.1",
        port: int = 0,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
        quiet: bool = True,
    ) -> None:
        self.sim_config = config or SimConfig()
        self.world = world or "none"
        self.host = host
        self.port = port
        self.python = python
        self.env = env
        self.quiet = quiet
        self.root_url = ""
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def command(self) -> list[str]:
        """The child's command line."""
        return [
            self.python,
            "-m",
            "combee.sim.runner",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--world",
            self.world,
            "--config-json",
            self.sim_config.model_dump_json(),
            "--exit-on-stdin-eof",
            *(["--quiet"] if self.quiet else []),
        ]

    def start(self, timeout: float = 30.0) -> Self:
        """Start the child and wait for its ready line. Raises :class:`SimStartupError` on failure."""
        if self.process is not None:
            return self
        env = dict(os.environ if self.env is None else self.env)
        if self.python == sys.executable and "PYTHONPATH" not in env:
            # The same interpreter with the same import path: the child imports the code (and any
            # "module:factory" world) exactly as this process would, whatever the working directory.
            env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.process = subprocess.Popen(
            self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True
        )
        try:
            url = self._read_ready_line(timeout)
        except BaseException:
            self.stop()
            raise
        self.root_url = url.removesuffix("/v1")
        self.port = int(self.root_url.rsplit(":", 1)[1])
        return self

    def _read_ready_line(self, timeout: float) -> str:
        assert self.process is not None and self.process.stdout is not None
        stdout = self.process.stdout
        deadline = time.monotonic() + timeout
        buffer = b""
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SimStartupError(f"the simulator did not report ready within {timeout} s")
            readable, _, _ = select.select([stdout], [], [], min(remaining, 0.5))
            if readable:
                chunk = os.read(stdout.fileno(), 4096)
                if not chunk:
                    code = self.process.wait(timeout=5)
                    raise SimStartupError(f"the simulator exited with code {code} before it was ready")
                buffer += chunk
        line = buffer.split(b"\n", 1)[0].decode().strip()
        if not line.startswith(READY_PREFIX):
            raise SimStartupError(f"unexpected first line from the simulator: {line!r}")
        return line[len(READY_PREFIX) :]

    def stop(self, timeout: float = 10.0) -> int | None:
        """Stop the child (close stdin → graceful exit; then SIGTERM, then SIGKILL by PID); returns its exit
        code. Idempotent."""
        process = self.process
        if process is None:
            return None
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                code = process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait(5)
        if process.stdout is not None:
            process.stdout.close()
        self.process = None
        return code

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# ------------------------------------------------------------------------------------------------------------
# Command line

_FLAG_FIELDS: tuple[tuple[str, str, type], ...] = (
    ("--seed", "seed", int),
    ("--time-scale", "time_scale", float),
    ("--max-concurrency", "max_concurrency", int),
    ("--ttft-s", "ttft_s", float),
    ("--prefill-s-per-token", "prefill_s_per_token", float),
    ("--decode-tokens-per-s", "decode_tokens_per_s", float),
    ("--jitter-sigma", "jitter_sigma", float),
    ("--fault-500-rate", "fault_500_rate", float),
    ("--fault-429-rate", "fault_429_rate", float),
    ("--retry-after-s", "retry_after_s", float),
    ("--fault-timeout-rate", "fault_timeout_rate", float),
    ("--timeout-hang-s", "timeout_hang_s", float),
    ("--fault-malformed-rate", "fault_malformed_rate", float),
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m combee.sim.runner",
        description="Combee's OpenAI-compatible LLM SIMULATOR: modelled answers and latencies, no model.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (see the ready line)")
    parser.add_argument("--world", default="none", help="responder: a RESPONDERS name or 'module:factory'")
    parser.add_argument("--config-json", help="a full SimConfig as JSON; the flags below override it")
    parser.add_argument(
        "--profile", help="a serving profile (unlimited, gpu, api, cpu) preset before --config-json and the flags"
    )
    parser.add_argument(
        "--merge-capacity-factor",
        help="a merge of m proposals keeps at most factor x K(m) (K: the curator's law); 'unlimited' for none",
    )
    parser.add_argument(
        "--labels", help="how the reflector labels sections: consistent, random:N or free (docs/simulator.md)"
    )
    for flag, dest, kind in _FLAG_FIELDS:
        parser.add_argument(flag, dest=dest, type=kind, default=None)
    parser.add_argument("--outage", action="store_true", default=None, help="start with the outage switch on")
    parser.add_argument("--model", dest="models", action="append", help="a model name for /v1/models")
    parser.add_argument(
        "--exit-on-stdin-eof",
        action="store_true",
        help="run as a managed child: exit when stdin closes; stdout after the ready line goes to stderr",
    )
    parser.add_argument("--quiet", action="store_true", help="log warnings only")
    return parser


def _config_from_args(args: argparse.Namespace) -> SimConfig:
    base: dict[str, Any] = {}
    if args.profile:
        from combee.sim.serving import PROFILES

        if args.profile not in PROFILES:
            raise SimStartupError(f"unknown serving profile {args.profile!r} (choose among {', '.join(PROFILES)})")
        base.update(PROFILES[args.profile])
    if args.config_json:
        base.update(json.loads(args.config_json))
    if args.merge_capacity_factor is not None:
        factor = args.merge_capacity_factor
        base["merge_capacity_factor"] = None if factor in ("unlimited", "none", "inf") else float(factor)
    if args.labels is not None:
        base["labels"] = args.labels
    for _, dest, _ in _FLAG_FIELDS:
        value = getattr(args, dest)
        if value is not None:
            base[dest] = value
    if args.outage:
        base["outage"] = True
    if args.models:
        base["models"] = tuple(args.models)
    return SimConfig.model_validate(base)


def _watch_stdin(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Block reading stdin in a daemon thread; EOF (the parent closed the pipe or died) stops the server."""

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(sys.stdin.fileno(), 4096):
                pass
        with contextlib.suppress(RuntimeError):  # loop already closed
            loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=watch, name="combee-sim-stdin-watchdog", daemon=True).start()


async def _run(config: SimConfig, responder: Responder | None, host: str, port: int, watch: bool) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if watch:
        _watch_stdin(loop, stop)

    def ready(url: str) -> None:
        sys.stdout.write(f"{READY_PREFIX}{url}\n")
        sys.stdout.flush()
        if watch:
            # Managed by a parent that reads only the ready line: later prints go to stderr, so a chatty
            # responder can never fill the stdout pipe and block the server.
            os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    server = asyncio.create_task(serve(config, responder, host, port, ready=ready))
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({server, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    if server.done():
        server.result()  # re-raises why serving ended (e.g. the port was taken)
        return
    server.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await server


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m combee.sim.runner``; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        config = _config_from_args(args)
        responder = make_responder(args.world, config)
    except (ValueError, SimStartupError) as exc:
        print(f"combee-sim: {exc}", file=sys.stderr)
        return 2
    log.warning("this is a SIMULATED LLM endpoint: answers and latencies are modelled, not generated")
    try:
        asyncio.run(_run(config, responder, args.host, args.port, args.exit_on_stdin_eof))
    except OSError as exc:
        print(f"combee-sim: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
