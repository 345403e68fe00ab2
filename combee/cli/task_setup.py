"""What every ``combee task`` run sets up before it works: the endpoint (the simulator in this process with
``--sim``), its settings, a per-phase LLM factory with its own response cache, and the timings journal that keeps
model timings across a resumed run. Shared by :mod:`combee.cli.task` and :mod:`combee.cli.task_redteam`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
import urllib.request
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from combee.cli.base import CliError, given_options
from combee.redaction import redact_url, strip_query
from combee.settings import Settings
from combee.wiring import build_llm

__all__ = [
    "LOCAL_BASE_URL",
    "LOCAL_MODEL",
    "PARTIAL",
    "TIMINGS",
    "display_url",
    "is_simulator",
    "open_endpoint",
    "probe_models",
    "task_settings",
    "timing_journal",
]

LOCAL_BASE_URL = "http://127.0.0.1:8090/v1"
LOCAL_MODEL = "local"
PARTIAL = "partial"  # in the timings journal: learning phases stopped part-way, by their last fully timed step
TIMINGS = "timings.json"  # in --out: each phase's figures from the run in which the model (not the cache) answered it


def display_url(url: str) -> str:
    """``url`` without its query and fragment, its password redacted."""
    return redact_url(strip_query(url))


def probe_models(base_url: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """``GET {base_url}/models``'s model cards. Raises OSError/ValueError when the endpoint does not answer."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(base_url.rstrip("/") + "/models", timeout=timeout_s) as response:
        doc = json.loads(response.read())
    data = doc.get("data") if isinstance(doc, dict) else None
    return [card for card in data or [] if isinstance(card, dict)]


def is_simulator(cards: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the endpoint's model cards name the Combee simulator."""
    return any("combee-sim" in str(card.get("owned_by", "")) for card in cards)


def task_settings(args: argparse.Namespace, base_url: str | None) -> Any:
    """The settings of a ``combee task`` run: the options over the environment, the simulator's URL when
    ``base_url`` is given, and the harness's own defaults where neither chose. Raises CliError when invalid."""
    mapping = {"base_url": "openai_base_url", "model": "model", "llm_concurrency": "llm_max_concurrency",
               "llm_timeout": "llm_timeout_s"}  # fmt: skip
    overrides = given_options(args, mapping)
    if base_url is not None:
        overrides["openai_base_url"], overrides["model"] = base_url, "combee-sim"
    try:
        settings = Settings(**overrides)
    except Exception as exc:  # pydantic ValidationError: one line, no traceback
        raise CliError("invalid setting: " + " ".join(str(exc).strip().splitlines()[:3])[:300]) from None
    # The harness's own defaults where neither an option nor the environment chose: the local model, a few
    # requests in flight (a CPU server has a few slots) and a timeout long enough for its queue.
    defaults = {"openai_base_url": LOCAL_BASE_URL, "model": LOCAL_MODEL, "llm_max_concurrency": 4,
                "llm_timeout_s": 600.0}  # fmt: skip
    return settings.model_copy(update={k: v for k, v in defaults.items() if k not in settings.model_fields_set})


async def open_endpoint(
    args: argparse.Namespace, stack: contextlib.AsyncExitStack, err: TextIO
) -> tuple[Any, list[dict[str, Any]], Any, Path | None]:
    """Start the simulator on ``stack`` with ``args.sim``, build the settings, probe the endpoint. Returns the
    settings, the endpoint's model cards, ``llm_for(phase)`` (an async context manager: an LLM whose response
    cache is the phase's own subdirectory) and the cache root (None with ``--no-cache``). Raises CliError (code
    3) when the endpoint does not answer."""
    sim_url = None
    if args.sim:
        from combee.sim.config import SimConfig
        from combee.sim.runner import SimThread

        sim = stack.enter_context(SimThread(SimConfig(seed=args.seed, time_scale=args.sim_time_scale),
                                            world="combee"))  # fmt: skip
        sim_url = sim.base_url
        err.write(f"combee task: SIMULATED model (Combee simulator, in this process) at {sim_url}\n")
    settings = task_settings(args, sim_url)
    endpoint = display_url(settings.openai_base_url)
    try:
        cards = await asyncio.to_thread(probe_models, settings.openai_base_url)
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot reach the model at {endpoint}/models ({exc})", code=3) from None
    cache_root = None if args.no_cache else (args.cache_dir or args.out / "cache")

    @contextlib.asynccontextmanager
    async def llm_for(phase: str) -> AsyncIterator[Any]:
        phase_settings = settings.model_copy(update={"cache_dir": cache_root / phase if cache_root else None})
        llm = build_llm(phase_settings)
        try:
            yield llm
        finally:
            await llm.aclose()

    return settings, cards, llm_for, cache_root


def timing_journal(out: Path, enabled: bool) -> tuple[dict[str, Any], dict[str, Any], Any, Any]:
    """The timings of earlier runs into ``out`` and the callbacks that record this run's, so a resumed run
    reports model timings for what it replays from the cache (:func:`combee.tasks.run.with_timing`,
    :class:`combee.tasks.run.Resumed`).

    Returns ``(timed, steps, on_phase, on_step)``: ``timed`` maps a phase to its figures and when they were
    measured, ``steps`` maps a learning phase stopped part-way to its last fully timed step. The journal keeps
    completed phases at the top level and unfinished learning phases under ``"partial"``.
    """
    from combee.tasks.run import PhaseStats, StepTiming

    path = out / TIMINGS
    journal: dict[str, Any] = {}
    if enabled and path.exists():
        try:
            journal = json.loads(path.read_text())
        except ValueError as exc:
            raise CliError(f"{path} is not valid JSON ({exc}); delete it to time every phase again", code=2) from None
    partial: dict[str, Any] = journal.pop(PARTIAL, {})
    timed = {name: (PhaseStats.from_dict(doc), str(doc.get("measured_at", ""))) for name, doc in journal.items()}
    steps = {
        name: StepTiming(int(doc["step"]), PhaseStats.from_dict(doc), str(doc.get("measured_at", "")))
        for name, doc in partial.items()
        if isinstance(doc, dict) and isinstance(doc.get("step"), int)
    }

    def now() -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def save() -> None:
        out.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        doc = {**journal, **({PARTIAL: partial} if partial else {})}
        tmp.write_text(json.dumps(doc, indent=2) + "\n")
        tmp.replace(path)

    def model_timed(stats: PhaseStats) -> bool:
        """Every answer counted was the model's, in this run or in the run a resumed phase continues."""
        own = stats.timed_at is None or stats.resumed_after is not None  # not a whole phase copied from the journal
        return bool(enabled and stats.calls and not stats.cached and own)

    def on_phase(name: str, stats: PhaseStats) -> None:
        if stats.loadavg is None and stats.timed_at is None:  # measured now: how busy the machine was
            stats.loadavg = os.getloadavg()
        if not model_timed(stats):
            return  # nothing measured afresh: keep what the journal has
        journal[name] = {**stats.as_dict(), "measured_at": now()}
        partial.pop(name, None)
        save()

    def on_step(name: str, step: int, stats: PhaseStats) -> None:
        if not model_timed(stats):
            return
        earlier = partial.get(name, {})
        measured_at = stats.timed_at or now()  # a resumed phase keeps the stamp of the run it continues
        partial[name] = {**stats.as_dict(), "step": step, "measured_at": earlier.get("measured_at", measured_at)}
        save()

    return timed, steps, on_phase, on_step
