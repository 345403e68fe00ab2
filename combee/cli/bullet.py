"""``combee bullet list|release|remove|pin|unpin|audit``: see and act on a namespace's bullets, live and
quarantined (docs/security.md, "Quarantine"), and see the lessons waiting for corroboration (``--pending``,
"Corroboration and caps").

A release, a removal of a live bullet, a pin and an unpin are control records to the namespace's combiner
(signed with ``COMBEE_CONTROL_KEY``, like ``prompt rollback``), which makes them the next version through the
same commit as a learned window; the command waits for that version. Removing a quarantined bullet touches
only the quarantine. Every action is appended to the namespace's audit log, with who asked (``--actor``, else
the OS user), when, the bullet and the SHA-256 of its text, and what came of it.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from combee.cli.base import (
    CliError,
    add_connection_options,
    no_new_version,
    positive_int,
    prompt_client,
    service_errors,
    stream_settings,
    wait_for_version,
)

if TYPE_CHECKING:
    from combee.corroborate import PendingLesson
    from combee.models import Bullet, Playbook
    from combee.quarantine import AuditEntry, QuarantinedBullet
    from streams.quarantine import QuarantineStore
    from streams.redis_store import RedisPromptStore

__all__ = ["add_bullet_command", "cmd_bullet"]

T = TypeVar("T")


def add_bullet_command(sub: Any) -> None:
    """Register ``bullet`` on ``combee``'s subparsers."""
    p = sub.add_parser("bullet", help="list, release, remove or pin a namespace's bullets (live or quarantined)")
    bsub = p.add_subparsers(dest="bullet_command", required=True, parser_class=type(p))
    ls = bsub.add_parser("list", help="the live bullets (default), the quarantined ones, or both")
    ls.add_argument("namespace")
    which = ls.add_mutually_exclusive_group()
    which.add_argument("--quarantined", action="store_true", help="only the bullets the guard held back")
    which.add_argument(
        "--pending", action="store_true", help="only the lessons waiting for corroboration, with who taught them"
    )
    which.add_argument("--all", action="store_true", help="live, quarantined and pending")
    ls.add_argument("--json", action="store_true")
    actions = []
    for name, what in (
        ("release", "publish a quarantined bullet (its id: q...) as a new version"),
        ("remove", "remove a live bullet (new version) or a quarantined one"),
        ("pin", "pin a live bullet: learning never rewrites, removes or evicts it (new version)"),
        ("unpin", "let learning change a pinned bullet again (new version)"),
    ):
        a = bsub.add_parser(name, help=what)
        a.add_argument("namespace")
        a.add_argument("bullet_id", metavar="ID")
        a.add_argument("--actor", help="who is acting, for the audit log (default: the OS user)")
        a.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the new version")
        actions.append(a)
    au = bsub.add_parser("audit", help="the operators' actions on the namespace's bullets, oldest first")
    au.add_argument("namespace")
    au.add_argument("--limit", type=positive_int, help="only the last LIMIT entries")
    au.add_argument("--json", action="store_true")
    for q in (ls, au, *actions):
        add_connection_options(q)
    p.set_defaults(func=service_errors(cmd_bullet))


def cmd_bullet(args: argparse.Namespace) -> int:
    from combee.models import validate_namespace

    validate_namespace(args.namespace)
    settings = stream_settings(args)
    if args.bullet_command == "list":
        return _list(settings, args)
    if args.bullet_command == "audit":
        return _audit(settings, args)
    return _act(settings, args)


def _run(settings: Any, work: Callable[[RedisPromptStore, QuarantineStore], Awaitable[T]]) -> T:
    """Run ``work`` against the namespace's Redis (prompt store and quarantine), closing the connection."""
    from streams.quarantine import QuarantineStore
    from streams.redis_store import RedisPromptStore

    async def run() -> T:
        store = RedisPromptStore.from_settings(settings, client_name="combee-bullet")
        try:
            return await work(store, QuarantineStore(store.redis, store.keys))
        finally:
            await store.aclose()

    return asyncio.run(run())


async def _live(store: RedisPromptStore, namespace: str) -> Playbook | None:
    from combee.models import Playbook

    current = await store.current(namespace)
    return Playbook.model_validate_json(current.playbook_json) if current is not None else None


def _bullet_row(b: Bullet) -> dict[str, Any]:
    return {"id": b.id, "state": "pinned" if b.pinned else "live", "section": b.section, "content": b.content,
            "helpful": b.helpful, "harmful": b.harmful, "support": b.support, "sources": list(b.sources)}  # fmt: skip


def _held_row(e: QuarantinedBullet) -> dict[str, Any]:
    return {"id": e.id, "state": "quarantined", "reason": e.reason, "op": e.op, "section": e.section,
            "bullet_id": e.bullet_id, "content": e.content, "sources": list(e.sources), "window_id": e.window_id,
            "base_version": e.base_version, "quarantined_at": e.quarantined_at}  # fmt: skip


def _pending_row(e: PendingLesson) -> dict[str, Any]:
    return {"id": e.id, "state": "pending", "op": e.op, "section": e.section, "bullet_id": e.bullet_id,
            "content": e.content, "teachers": len(e.teachers), "sources": list(e.traces),
            "producers": list(e.producers), "first_window": e.first_window, "last_window": e.last_window,
            "windows": e.windows, "held_at": e.held_at, "supported_at": e.supported_at}  # fmt: skip


def _list(settings: Any, args: argparse.Namespace) -> int:
    async def work(store: RedisPromptStore, held: QuarantineStore) -> list[dict[str, Any]]:
        from streams.pending import PendingStore

        rows: list[dict[str, Any]] = []
        if not (args.quarantined or args.pending):
            playbook = await _live(store, args.namespace)
            rows += [_bullet_row(b) for b in (playbook.bullets if playbook is not None else ())]
        if args.quarantined or args.all:
            rows += [_held_row(e) for e in await held.entries(args.namespace)]
        if args.pending or args.all:
            rows += [_pending_row(e) for e in await PendingStore(store.redis, store.keys).entries(args.namespace)]
        return rows

    rows = _run(settings, work)
    if args.json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return 0
    for r in rows:
        if r["state"] == "quarantined":
            target = r["section"] if r["op"] == "ADD" else r["bullet_id"]
            taught = ", ".join(r["sources"][:3]) or "-"
            print(f"{r['id']}  quarantined  {r['reason']:<16} {r['op']} {target}  (traces: {taught})  {r['content']}")
        elif r["state"] == "pending":
            target = r["section"] if r["op"] == "ADD" else r["bullet_id"]
            taught = ", ".join(r["sources"][:3]) or "-"
            who = f"producers: {', '.join(r['producers'][:3])}; " if r["producers"] else ""
            print(f"{r['id']}  pending  {r['teachers']} teacher(s)  {r['op']} {target}  ({who}traces: {taught})  "
                  f"{r['content']}")  # fmt: skip
        else:
            print(f"{r['id']}  {r['state']:<11}  +{r['helpful']}/-{r['harmful']}  [{r['section']}]  {r['content']}")
    if not rows:
        kind = "quarantined " if args.quarantined else "pending " if args.pending else ""
        print(f"{args.namespace}: no {kind}bullets")
    return 0


def _audit(settings: Any, args: argparse.Namespace) -> int:
    async def work(store: RedisPromptStore, held: QuarantineStore) -> list[tuple[str, AuditEntry]]:
        return await held.audit_log(args.namespace, args.limit)

    entries = _run(settings, work)
    if args.json:
        print(json.dumps([{"entry_id": i, **e.model_dump()} for i, e in entries], indent=2, ensure_ascii=False))
        return 0
    for _, e in entries:
        when = datetime.fromtimestamp(e.at).isoformat(timespec="seconds")
        text = f" sha256:{e.text_sha256[:16]}" if e.text_sha256 else ""
        version = f" v{e.version}" if e.version is not None else ""
        print(f"{when}  {e.actor:<12} {e.action:<8} {e.bullet_id}{text}{version}  {e.outcome}")
    if not entries:
        print(f"{args.namespace}: no operator action recorded")
    return 0


def _text_of(playbook: Playbook | None, bullet_id: str) -> str:
    """The text of live bullet ``bullet_id``; CliError when there is none."""
    bullet = playbook.bullet(bullet_id) if playbook is not None else None
    if bullet is None:
        held = f" (version {playbook.version})" if playbook is not None else " (nothing is published yet)"
        raise CliError(f"no live bullet {bullet_id!r}{held}; `combee bullet list` shows the ids")
    return bullet.content


def _act(settings: Any, args: argparse.Namespace) -> int:
    from combee.quarantine import AuditEntry, is_quarantine_id, text_hash
    from streams.control import send_control
    from streams.envelopes import Control

    actor = args.actor or getpass.getuser()
    ns, bid, kind = args.namespace, args.bullet_id, args.bullet_command
    quarantined = is_quarantine_id(bid)
    if kind == "release" and not quarantined:
        raise CliError(f"{bid!r} is not a quarantine id (q + 12 hex digits); `combee bullet list {ns} --quarantined`")
    if kind in ("pin", "unpin") and quarantined:
        raise CliError(f"{bid!r} is quarantined: release it first, then pin the bullet it becomes")

    async def look(store: RedisPromptStore, held: QuarantineStore) -> tuple[int, str]:
        playbook = await _live(store, ns)
        version = playbook.version if playbook is not None else 0
        if not quarantined:
            return version, _text_of(playbook, bid)
        entry = await held.get(ns, bid)
        if entry is None:
            raise CliError(f"no quarantined bullet {bid!r} in {ns}; `combee bullet list {ns} --quarantined`")
        return version, entry.content

    before, text = _run(settings, look)
    version: int | None = None
    if kind == "remove" and quarantined:
        _run(settings, lambda store, held: held.resolve(ns, bid))
        outcome = "removed from the quarantine"
    else:
        signed = send_control(settings, Control(namespace=ns, kind=kind, bullet_id=bid, actor=actor,
                                             requested_at=time.time()))  # fmt: skip
        with prompt_client(settings, ns) as client:
            version = wait_for_version(client, before, args.timeout)
        outcome = f"published as v{version}" if version is not None else f"requested, no version in {args.timeout:g}s"
    entry = AuditEntry(action=kind, namespace=ns, bullet_id=bid, text_sha256=text_hash(text), actor=actor,
                       at=time.time(), outcome=outcome, version=version)  # fmt: skip
    _run(settings, lambda store, held: held.audit(entry))
    if version is None and not (kind == "remove" and quarantined):
        raise no_new_version(f"{kind} of {bid}", args.timeout, signed)
    print(f"{ns}: {kind} {bid}: {outcome}")
    return 0
