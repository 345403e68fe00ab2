"""``combee prompt policy|promote|reject``: a namespace's promotion policy, and an operator's decision on a
candidate version (docs/promotion.md). ``policy`` writes Redis directly; ``promote`` and ``reject`` are signed
control records (``COMBEE_CONTROL_KEY``, like ``prompt rollback``) that the worker owning the namespace applies,
and wait until the decision is recorded."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from combee.cli.base import CliError, positive_int
from combee.promotion_text import describe_decision, serving_summary

if TYPE_CHECKING:
    from streams.redis_promotion import RedisPromotion

__all__ = [
    "add_promotion_commands",
    "cmd_promotion",
    "gate_sets",
    "read_head",
    "with_promotion",
]

T = TypeVar("T")
COMMANDS = ("policy", "promote", "reject")


def add_promotion_commands(psub: Any) -> list[Any]:
    """Register ``policy``, ``promote`` and ``reject`` under ``combee prompt``; returns their parsers."""
    p = psub.add_parser(
        "policy",
        help="show or set a namespace's promotion policy: direct, manual, canary --fraction F, gate --validation FILE",
        description="Without a policy: show it. direct serves every new version at once; manual keeps new versions "
        "as candidates until `combee prompt promote` or `reject`; canary serves the candidate to a stable FRACTION "
        "of the agents (those that give PromptClient an agent id) and lets their outcomes decide; gate serves a "
        "candidate once it answers a validation set no worse than the live version (docs/promotion.md).",
    )
    p.add_argument("namespace")
    p.add_argument("policy", nargs="?", choices=("direct", "manual", "canary", "gate"))
    p.add_argument("--fraction", type=float, default=0.1, help="canary: the share of agents in the arm (0 < F <= 1)")
    p.add_argument(
        "--validation",
        metavar="FILE",
        help="gate: this namespace's validation set (JSON lines: task, truth, grader, params), kept in Redis; "
        "without it the workers' COMBEE_PROMOTION_GATE_VALIDATION_FILE applies",
    )
    p.add_argument("--actor", help="who decides, for the record (default: the OS user)")
    parsers = [p]
    for verb, what in (("promote", "serve a candidate version to every agent"), ("reject", "reject candidates")):
        q = psub.add_parser(verb, help=what)
        q.add_argument("namespace")
        q.add_argument("version", type=positive_int)
        q.add_argument("--actor", help="who decides, for the record (default: the OS user)")
        q.add_argument("--timeout", type=float, default=60.0)
        parsers.append(q)
    return parsers


def with_promotion(settings: Any, work: Callable[[RedisPromotion], Awaitable[T]]) -> T:
    """Run ``work`` against the settings' Redis, closing the connection afterwards."""
    from streams.redis_promotion import RedisPromotion
    from streams.redis_store import RedisPromptStore

    async def run() -> T:
        store = RedisPromptStore.from_settings(settings, client_name="combee-promotion")
        try:
            return await work(RedisPromotion(store.redis, store.keys))
        finally:
            await store.aclose()

    return asyncio.run(run())


def gate_sets(own: str | None, held: int) -> str:
    """Where a gated namespace's validation tasks come from: its own set (kept in Redis) or the workers' default
    file, and its held-out traces."""
    where = (
        f"its own validation set ({sum(1 for line in own.splitlines() if line.strip())} tasks)"
        if own is not None
        else "the workers' default validation file"
    )
    return f"{where} and {held} held-out traces"


def cmd_promotion(settings: Any, args: argparse.Namespace) -> int:
    from combee.models import validate_namespace

    validate_namespace(args.namespace)
    if args.prompt_command == "policy":
        return _policy(settings, args)
    return _decide(settings, args)


def _policy(settings: Any, args: argparse.Namespace) -> int:
    from combee.promotion import Decision

    ns = args.namespace
    if args.policy is None:

        async def show(p: RedisPromotion) -> str:
            head, serving = await read_head(p, ns), await p.serving(ns)
            summary = serving_summary(serving, head)
            if serving.policy == "gate":
                summary += f"; {gate_sets(await p.validation(ns), len(await p.held_out(ns)))}"
            return summary

        print(f"{ns}: {with_promotion(settings, show)}")
        return 0
    validation = _validation_text(settings, args)
    if not 0.0 < args.fraction <= 1.0:
        raise CliError(f"--fraction must be in (0, 1], got {args.fraction}")
    fraction = args.fraction if args.policy == "canary" else 0.0
    actor = f"operator:{args.actor or getpass.getuser()}"
    now = time.time()

    async def set_it(p: RedisPromotion) -> int | None:
        before = await p.serving(ns)
        reason = f"policy {args.policy}" + (f" (fraction {fraction:g})" if args.policy == "canary" else "")
        decision = Decision("policy", 0, actor, args.policy, f"{reason}; was {before.policy}", at=now)
        if validation is not None:
            await p.set_validation(ns, validation)
        return await p.set_policy(ns, args.policy, fraction, decision.as_json(), set_by=actor, at=now)

    live = with_promotion(settings, set_it)
    served = "the head" if args.policy == "direct" else (f"v{live}" if live is not None else "nothing yet")
    print(f"{ns}: policy {args.policy}; agents are served {served}")
    return 0


def _validation_text(settings: Any, args: argparse.Namespace) -> str | None:
    """The validation file's text, checked line by line (None: no --validation). Only with the gate policy."""
    if args.validation is None:
        return None
    if args.policy != "gate":
        raise CliError("--validation goes with the gate policy")
    from pathlib import Path

    from combee.errors import ConfigError
    from combee.validation import parse_validation

    try:
        text = Path(args.validation).read_text(encoding="utf-8")
        tasks = parse_validation(text, default_grader=settings.promotion_gate_grader, source=args.validation)
    except (OSError, UnicodeDecodeError, ConfigError) as exc:
        raise CliError(f"--validation: {exc}") from exc
    if not tasks:
        raise CliError(f"--validation: {args.validation} holds no task")
    return text


async def read_head(p: RedisPromotion, namespace: str) -> int | None:
    """The namespace's newest published version (None: none)."""
    from streams.redis_records import reply_text

    raw = reply_text(await p._redis.hget(p.keys.current(namespace), "version"))
    return int(raw) if raw is not None and raw.isdigit() else None


def _decide(settings: Any, args: argparse.Namespace) -> int:
    from streams.control import send_control
    from streams.envelopes import Control

    ns, version = args.namespace, args.version
    actor = args.actor or getpass.getuser()
    ctrl = Control(namespace=ns, kind=args.prompt_command, to_version=version, actor=actor, requested_at=time.time())
    signed = send_control(settings, ctrl)
    wanted = f"{args.prompt_command}/v{version}"
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        found = with_promotion(settings, lambda p: p.decision(ns, wanted))
        if found is not None:
            print(f"{ns}: {describe_decision(found)}")
            return 0
        time.sleep(0.5)
    raise CliError(
        f"{args.prompt_command} of v{version} requested, but no decision was recorded within {args.timeout:g}s: "
        "it is not a pending candidate (see the worker's log and `combee prompt policy NS`), or no worker runs; "
        f"the request was {'signed with this' if signed else 'not signed: no'} COMBEE_CONTROL_KEY",
        4,
    )
