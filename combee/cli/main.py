"""``combee``: the parser of every verb, and the one place a failure becomes a line on stderr and an exit status.

Each verb lives in its own module of this package (``learn``, ``sim``, ``demo``, ``worker``, ``publish``,
``prompt``, ``bullet``, ``replay``, ``status``, ``topics``, ``traces``, ``ui``, ``dev``, ``llm``, ``bench``,
``task``) and registers itself with an ``add_<verb>_command(subparsers)``; what they share is in
:mod:`combee.cli.base`. Every verb is documented in README.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from combee import __version__
from combee.cli.base import EXIT_LLM, EXIT_SERVICE, EXIT_USAGE, CliError, Parser
from combee.cli.bench import add_bench_command
from combee.cli.bullet import add_bullet_command
from combee.cli.demo import add_demo_command
from combee.cli.dev import add_dev_command
from combee.cli.learn import add_learn_command
from combee.cli.llm import add_llm_command
from combee.cli.prompt import add_prompt_command
from combee.cli.publish import add_publish_command
from combee.cli.replay import add_replay_command
from combee.cli.sim import add_sim_command
from combee.cli.status import add_status_command
from combee.cli.task import add_task_command
from combee.cli.topics import add_topics_command
from combee.cli.traces import add_traces_command
from combee.cli.ui import add_ui_command
from combee.cli.worker import add_worker_command
from combee.errors import CombeeError, ConfigError, KafkaUnreachable, LLMRateLimited, LLMUnavailable, TopicMissing

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="combee", description="Combee: learn a better system prompt from agent traces, at scale.")
    parser.add_argument("--version", action="version", version=f"combee {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for add_command in (
        add_learn_command,
        add_sim_command,
        add_demo_command,
        add_worker_command,
        add_publish_command,
        add_prompt_command,
        add_bullet_command,
        add_replay_command,
        add_status_command,
        add_topics_command,
        add_traces_command,
        add_ui_command,
        add_dev_command,
        add_llm_command,
        add_bench_command,
        add_task_command,
    ):
        add_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except CliError as exc:
        return _fail(str(exc), exc.code)
    except LLMRateLimited as exc:
        return _fail(f"the LLM endpoint keeps rate-limiting: {exc}", EXIT_LLM)
    except LLMUnavailable as exc:
        return _fail(f"cannot use the LLM endpoint: {exc}", EXIT_LLM)
    except (TopicMissing, KafkaUnreachable) as exc:
        return _fail(str(exc), EXIT_SERVICE)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except CombeeError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except OSError as exc:
        return _fail(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc), EXIT_USAGE)


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"combee: error: {message}\n")
    return code
