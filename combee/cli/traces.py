"""``combee traces forget|forgotten``: stop learning from one namespace's or one producer's traces.

A rule is kept in Redis (:mod:`streams.forget`); the window stage skips the traces it names within seconds and
``combee replay`` leaves them out, so ``replay --namespace NS --into NS2`` relearns NS without them. The records
stay in Kafka until the traces topic's retention passes them (docs/security.md, "Retention and deletion").
"""

from __future__ import annotations

import argparse
from typing import Any

from combee.cli.base import add_connection_options, service_errors, stream_settings

__all__ = ["add_traces_command", "cmd_traces"]


def add_traces_command(sub: Any) -> None:
    """Register ``traces`` on ``combee``'s subparsers."""
    p = sub.add_parser("traces", help="forget one namespace's or one producer's traces (learning skips them)")
    tsub = p.add_subparsers(dest="traces_command", required=True, parser_class=type(p))
    f = tsub.add_parser("forget", help="record a rule: learning and replay skip the traces it names")
    f.add_argument("--namespace", help="every trace of this namespace (with --producer: only that producer's)")
    f.add_argument("--producer", help="every trace whose metadata.producer is this (with --namespace: only there)")
    listed = tsub.add_parser("forgotten", help="list the rules in force")
    for q in (f, listed):
        add_connection_options(q)
    p.set_defaults(func=service_errors(cmd_traces))


def cmd_traces(args: argparse.Namespace) -> int:
    from combee.forget import ForgetRule
    from streams.forget import add_rule, read_rules

    settings = stream_settings(args)
    if args.traces_command == "forget":
        rule = ForgetRule(namespace=args.namespace or None, producer=args.producer or None)
        rules = add_rule(settings, rule)
        print(
            f"forgetting the traces of {rule.describe()}: the workers skip them within seconds, replay leaves them "
            f"out; relearn with `combee replay --namespace NS --into NEW`. {len(rules)} rule(s) in force."
        )
        return 0
    for rule in read_rules(settings):
        print(rule.describe())
    return 0
