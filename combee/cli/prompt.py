"""``combee prompt get|show|watch|history|diff|rollback|repair``: read, compare or roll back the learned prompt of
a namespace, or repair a version number written to Redis by hand. ``diff`` reads the versions from Redis and
leaves the comparison to :mod:`combee.promptdiff`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any

from combee.cli.base import (
    EXIT_NOT_YET,
    EXIT_SERVICE,
    EXIT_UNKNOWN_NAMESPACE,
    CliError,
    add_connection_options,
    no_new_version,
    positive_int,
    prompt_client,
    service_errors,
    stream_settings,
    wait_for_version,
    with_start_hint,
)
from combee.cli.promote import COMMANDS as PROMOTION_COMMANDS
from combee.cli.promote import add_promotion_commands, cmd_promotion

if TYPE_CHECKING:
    from streams.client import PromptClient

__all__ = ["add_prompt_command", "cmd_prompt"]


def add_prompt_command(sub: Any) -> None:
    """Register ``prompt`` on ``combee``'s subparsers."""
    p = sub.add_parser("prompt", help="read the learned prompt of a namespace from Redis")
    psub = p.add_subparsers(dest="prompt_command", required=True, parser_class=type(p))
    g = psub.add_parser(
        "get",
        help="print the current prompt",
        description="Print the current prompt. Exit status 5: the namespace has traces but no version yet; "
        "6: unknown namespace (no worker has received a trace of it); 4: Redis unreachable.",
    )
    g.add_argument("namespace")
    g.add_argument("--json", action="store_true")
    g.add_argument(
        "--wait",
        nargs="?",
        type=float,
        const=math.inf,
        metavar="SECONDS",
        help="wait for a first version when there is none yet (without SECONDS: as long as it takes)",
    )
    w = psub.add_parser("watch", help="print every new version as it is published")
    w.add_argument("namespace")
    w.add_argument("--count", type=positive_int, help="stop after COUNT versions")
    w.add_argument("--timeout", type=float, help="stop after SECONDS without a new version")
    w.add_argument("--versions-only", action="store_true")
    h = psub.add_parser(
        "history", help="list published versions, newest first, each with its outcomes (n, success rate, score)"
    )
    h.add_argument("namespace")
    h.add_argument("--limit", type=positive_int, default=20)
    s = psub.add_parser("show", help="print one version's prompt")
    s.add_argument("namespace")
    s.add_argument("--version", type=positive_int, required=True, metavar="V")
    d = psub.add_parser(
        "diff",
        help="bullets added, changed and removed between two versions, and why",
        description="Bullets added, changed and removed between two versions. Per bullet: the curator's operation "
        "(ADD, UPDATE, REMOVE, and whether it merged into or confirmed a bullet), the traces whose reflections "
        "taught it (the first few, '+N more') and one lesson as the reflector stated it. --full lists every "
        "operation, trace id and recorded lesson; --json gives the same as data.",
    )
    d.add_argument("namespace")
    d.add_argument("--from", dest="from_version", type=int, metavar="V", help="default: the previous version")
    d.add_argument("--to", dest="to_version", type=positive_int, metavar="W", help="default: the current version")
    d.add_argument("--json", action="store_true", help="the whole diff as JSON (every trace id and lesson)")
    d.add_argument("--full", action="store_true", help="every operation, trace id and recorded lesson")
    r = psub.add_parser("rollback", help="publish an earlier version's content as a new version")
    r.add_argument("namespace")
    r.add_argument("--to", type=positive_int, required=True, metavar="VERSION")
    r.add_argument("--timeout", type=float, default=60.0)
    fix = psub.add_parser(
        "repair",
        help="reset the current version to the highest valid one stored (after a version above 2**53 - 1 was "
        "written to Redis outside Combee)",
    )
    fix.add_argument("namespace")
    promotion = add_promotion_commands(psub)
    for q in (g, s, w, h, d, r, fix, *promotion):
        add_connection_options(q)
    p.set_defaults(func=service_errors(cmd_prompt))


def _no_prompt(settings: Any, namespace: str, waited: float | None) -> CliError:
    """Why there is no prompt to print: nothing learned yet (exit 5) or an unknown namespace (exit 6)."""
    from streams.status import read_namespace_state

    state, report = asyncio.run(read_namespace_state(settings, namespace))
    prefix = f"no version within {waited:g} s: " if waited is not None else ""
    if state == "unknown":
        return CliError(
            f"{prefix}unknown namespace {namespace!r}: no worker has received a trace of it and nothing is "
            "published (`combee status` lists the namespaces there are)",
            EXIT_UNKNOWN_NAMESPACE,
        )
    seen = ""
    if report:
        traces, windows = report.get("traces_seen", "?"), report.get("windows_in_flight", "?")
        seen = f" (its worker has seen {traces} traces; windows in flight: {windows})"
    hint = "" if waited is not None else f"; wait for it with: combee prompt get {namespace} --wait"
    return CliError(f"{prefix}namespace {namespace!r} has nothing learned yet{seen}{hint}", EXIT_NOT_YET)


def _get(client: PromptClient, settings: Any, wait_s: float | None) -> Any:
    from streams.client import PromptUnavailable

    try:
        return client.get()
    except PromptUnavailable as exc:
        if exc.unreadable:  # Redis could not be read: not a question of the namespace
            raise CliError(with_start_hint(str(exc)), EXIT_SERVICE) from None
        if wait_s is None:
            raise _no_prompt(settings, client.namespace, None) from None
    for v in client.watch(timeout=None if math.isinf(wait_s) else wait_s):
        return v
    raise _no_prompt(settings, client.namespace, wait_s)


def cmd_prompt(args: argparse.Namespace) -> int:
    from streams.client import PromptUnavailable

    settings = stream_settings(args)
    if args.prompt_command == "repair":
        return _repair(settings, args.namespace)
    if args.prompt_command in PROMOTION_COMMANDS:
        return cmd_promotion(settings, args)
    with prompt_client(settings, args.namespace) as client:
        try:
            if args.prompt_command == "rollback":
                return _rollback(settings, client, args)
            if args.prompt_command == "get":
                v = _get(client, settings, args.wait)
                if args.json:
                    print(json.dumps({"namespace": v.namespace, "version": v.version, "prompt": v.prompt,
                                      "window_id": v.window_id, "published_at": v.published_at}))  # fmt: skip
                else:
                    print(f"# namespace {v.namespace} · version {v.version} · window {v.window_id}", file=sys.stderr)
                    print(v.prompt, end="")
            elif args.prompt_command == "show":
                shown = client.version(args.version)
                if shown is None:
                    raise CliError(_not_retained(client, args.version))
                header = f"# namespace {shown.namespace} · version {shown.version} · window {shown.window_id}"
                print(header, file=sys.stderr)
                print(shown.prompt, end="")
            elif args.prompt_command == "diff":
                _diff(client, args)
            elif args.prompt_command == "history":
                _history(client, args.limit)
                _decisions(settings, client.namespace)
            else:  # watch
                for count, v in enumerate(client.watch(timeout=args.timeout), start=1):
                    print(f"--- version {v.version} (window {v.window_id}) ---", flush=True)
                    if not args.versions_only:
                        print(v.prompt, flush=True)
                    if args.count and count >= args.count:
                        break
        except PromptUnavailable as exc:
            raise CliError(with_start_hint(str(exc)) if exc.unreadable else str(exc), EXIT_SERVICE) from None
    return 0


def _history(client: PromptClient, limit: int) -> None:
    """One line per published version, newest first, ending with the outcomes the fleet reported for it (n,
    success rate with its 95 % Wilson interval, mean score); then the outcomes of versions not listed."""
    from combee.outcomes import UNKNOWN_VERSION, describe

    outcomes = client.outcomes()
    listed = set()
    for h in client.history(limit=limit):
        when = datetime.fromtimestamp(h.published_at).isoformat(timespec="seconds") if h.published_at else "-"
        note = (h.meta or {}).get("note") or ""
        counts = outcomes.get(str(h.version))
        told = describe(counts) if counts else "none reported"
        head = f"v{h.version:<6} {when}  bullets={h.bullets}  tokens={h.tokens}  {h.window_id or ''} {note}"
        print(f"{head}  outcomes: {told}")
        listed.add(str(h.version))
    older = sorted((k for k in outcomes if k.isdigit() and k not in listed), key=int, reverse=True)
    for key in older:
        print(f"v{key:<6} (not listed) outcomes: {describe(outcomes[key])}")
    if UNKNOWN_VERSION in outcomes:
        print(f"unknown version (above the live one when counted): {describe(outcomes[UNKNOWN_VERSION])}")


def _decisions(settings: Any, namespace: str) -> None:
    """The promotion policy, what is live, and every decision recorded (docs/promotion.md)."""
    from combee.cli.promote import read_head, with_promotion
    from combee.promotion_text import describe_decision, serving_summary

    async def read(p: Any) -> tuple[Any, int | None, list[dict[str, Any]]]:
        return await p.serving(namespace), await read_head(p, namespace), await p.decisions(namespace)

    serving, head, decisions = with_promotion(settings, read)
    print(serving_summary(serving, head))
    for d in decisions:
        print(f"  {describe_decision(d)}")


def _not_retained(client: PromptClient, version: int) -> str:
    from streams.redis_store import DEFAULT_HISTORY_LIMIT

    versions = [h.version for h in client.history(limit=DEFAULT_HISTORY_LIMIT)]
    held = f"versions {min(versions)}..{max(versions)}" if versions else "no version yet"
    return f"{client.namespace}: version {version} is not published or no longer retained (there are {held})"


def _diff(client: PromptClient, args: argparse.Namespace) -> None:
    from combee.errors import ConfigError
    from combee.models import Playbook
    from combee.promptdiff import UnknownVersion, VersionRecord, diff_span, diff_versions, render_diff
    from streams.redis_store import DEFAULT_HISTORY_LIMIT

    published = [h.version for h in client.history(limit=DEFAULT_HISTORY_LIMIT)]
    if not published:
        raise CliError(f"namespace {client.namespace!r} has no published prompt yet", 4)
    try:
        from_version, to_version, wanted = diff_span(published, args.from_version, args.to_version)
    except UnknownVersion as exc:
        raise CliError(f"{client.namespace}: {exc}") from None
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    records = [r for r in (client.version_record(v) for v in wanted) if r is not None]
    if from_version == 0:  # before the first version: the empty playbook
        records.append(VersionRecord(0, Playbook(namespace=client.namespace)))
    diff = diff_versions(records, from_version, to_version)
    if args.json:
        print(json.dumps(dataclasses.asdict(diff), indent=2))
    else:
        print(render_diff(diff, full=args.full), end="")


def _repair(settings: Any, namespace: str) -> int:
    from streams.redis_repair import repair_namespace
    from streams.redis_store import RedisPromptStore

    async def run() -> Any:
        store = RedisPromptStore.from_settings(settings, client_name="combee-repair")
        try:
            return await repair_namespace(store.redis, store.keys, namespace)
        finally:
            await store.aclose()

    outcome = asyncio.run(run())
    removed = f"; removed {outcome.removed} history entries above 2**53 - 1" if outcome.removed else ""
    if not outcome.reset:
        print(f"{namespace}: current version {outcome.version} is valid, nothing to reset{removed}")
    elif outcome.version is None:
        print(f"{namespace}: no valid version is stored; removed the current prompt{removed}")
    else:
        print(f"{namespace}: current version reset to {outcome.version}, the highest valid one stored{removed}")
    return 0


def _rollback(settings: Any, client: PromptClient, args: argparse.Namespace) -> int:
    from streams.control import request_rollback

    before = client.get().version
    if not 1 <= args.to <= before:
        raise CliError(f"no version {args.to} to roll back to (current is {before})")
    signed = request_rollback(settings, args.namespace, args.to)
    version = wait_for_version(client, before, args.timeout)
    if version is None:
        raise no_new_version("rollback", args.timeout, signed)
    print(f"{args.namespace}: version {version} now holds the content of version {args.to}")
    return 0
