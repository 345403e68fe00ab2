"""``combee replay``: relearn a namespace's traces from Kafka into another namespace."""

from __future__ import annotations

import argparse
import time
from typing import Any

from combee.cli.base import (
    CliError,
    add_connection_options,
    positive_int,
    prompt_client,
    service_errors,
    stream_settings,
)

__all__ = ["add_replay_command", "cmd_replay"]


def add_replay_command(sub: Any) -> None:
    """Register ``replay`` on ``combee``'s subparsers."""
    p = sub.add_parser("replay", help="relearn a namespace's traces from Kafka into another namespace")
    p.add_argument("--namespace", required=True, help="the namespace whose traces to replay")
    p.add_argument("--from", dest="start", default="earliest", help="earliest, an offset, or an ISO time")
    p.add_argument("--into", required=True, help="the namespace to learn into (fresh)")
    p.add_argument("--windows", choices=["logged", "fresh"], default="logged",
                   help="reuse the source's logged window boundaries (default) or cut fresh ones")  # fmt: skip
    p.add_argument("--batch-size", type=positive_int, help="size of fresh windows (default: $COMBEE_BS_DEFAULT)")
    p.add_argument("--wait", action="store_true", help="wait until the replayed versions are published")
    p.add_argument("--timeout", type=float, default=600.0)
    add_connection_options(p)
    p.set_defaults(func=service_errors(cmd_replay))


def cmd_replay(args: argparse.Namespace) -> int:
    from combee.errors import ConfigError
    from combee.wiring import feedback_policy, identity_policy
    from streams.forget import read_rules
    from streams.replay import replay

    settings = stream_settings(args)
    feedback = feedback_policy(settings)
    trusted = [ns for ns in (args.namespace, args.into) if feedback.trusted(ns)]
    if trusted:
        # a replay reads the traces topic, not the feedback topic: it would learn the agents' own feedback
        raise ConfigError(
            f"{', '.join(trusted)} takes its feedback from trusted records (COMBEE_FEEDBACK, _NAMESPACES), which "
            "replay does not join yet: it would learn the traces' own feedback (docs/security.md, 'Trusted feedback')"
        )
    report = replay(
        settings,
        namespace=args.namespace,
        into=args.into,
        start=args.start,
        batch_size=args.batch_size or settings.bs_default,
        windows=args.windows,
        rules=read_rules(settings),
        identity=identity_policy(settings),
    )
    print(
        f"replaying {report.traces} traces of {args.namespace} (partition {report.partition}, offsets "
        f"{report.first_offset}..{report.end_offset - 1}) into {args.into} as {report.windows} windows "
        f"({report.windows_from_log} as logged, {report.windows - report.windows_from_log} fresh)"
        + (f"; {report.forgotten} forgotten traces left out" if report.forgotten else "")
        + (f"; {report.refused} traces the producer identity policy refuses left out" if report.refused else "")
    )
    if not args.wait:
        return 0
    with prompt_client(settings, args.into) as client:
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            try:
                v = client.get()
                if v.version >= report.windows:
                    print(f"{args.into}: learned version {v.version} from the replay")
                    return 0
            except Exception:
                pass
            time.sleep(1.0)
    raise CliError(f"replay sent, but {args.into} did not reach version {report.windows} in {args.timeout:g}s", 4)
