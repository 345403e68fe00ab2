"""``combee llm serve|stop|status``: a REAL local model, llama.cpp's server on 127.0.0.1 (``deploy/llm.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from combee.cli.base import EXIT_SERVICE, CliError
from deploy.llm import add_up_arguments  # standard library only: cheap, and needs no llm extra

__all__ = ["add_llm_command", "cmd_llm"]


def add_llm_command(sub: Any) -> None:
    """Register ``llm`` on ``combee``'s subparsers."""
    p = sub.add_parser("llm", help="a REAL local model: llama.cpp server on 127.0.0.1 (deploy/llm.py)")
    lsub = p.add_subparsers(dest="llm_command", required=True, parser_class=type(p))
    serve = lsub.add_parser("serve", help="start (or reuse) it in the background; print export lines")
    add_up_arguments(serve)
    lsub.add_parser("stop", help="stop it (by verified PID)")
    st = lsub.add_parser("status", help="pid, url, model alias, slots, context per slot")
    st.add_argument("--json", action="store_true")
    for q in lsub.choices.values():
        q.add_argument("--state-dir", type=Path, help="PID file and log (env COMBEE_STATE_DIR; default var/dev)")
    p.set_defaults(func=cmd_llm)


def cmd_llm(args: argparse.Namespace) -> int:
    from deploy import llm

    try:
        return llm.run_command({"serve": "up", "stop": "down"}.get(args.llm_command, args.llm_command), args)
    except llm.DeployError as exc:
        raise CliError(str(exc), EXIT_SERVICE) from None
