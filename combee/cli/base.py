"""What every ``combee`` verb shares: exit codes, the one-line error, the progress line, option groups and
turning options into :class:`~combee.settings.Settings`.

Errors a user can cause (missing file, bad option, unreachable endpoint, invalid namespace) end the command
with one line on stderr and a non-zero exit status, never a traceback.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from combee.models import Trace, validate_namespace
from combee.redaction import redact
from combee.settings import Settings
from combee.tracefile import read_traces

if TYPE_CHECKING:
    from streams.client import PromptClient

__all__ = [
    "EXIT_LLM",
    "EXIT_NOT_YET",
    "EXIT_SERVICE",
    "EXIT_UNKNOWN_NAMESPACE",
    "EXIT_USAGE",
    "CliError",
    "Parser",
    "Progress",
    "add_connection_options",
    "add_llm_options",
    "add_method_options",
    "batch_size",
    "first_line",
    "given_options",
    "load_trace_file",
    "no_new_version",
    "positive_int",
    "prompt_client",
    "service_errors",
    "settings_from_args",
    "stream_settings",
    "wait_for_version",
    "with_start_hint",
]

EXIT_USAGE = 2
EXIT_LLM = 3
EXIT_SERVICE = 4
EXIT_NOT_YET = 5  # the namespace is known (a worker has its traces) but nothing is published yet
EXIT_UNKNOWN_NAMESPACE = 6  # no worker has received a trace of the namespace and nothing is published


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status ``code``."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


class Parser(argparse.ArgumentParser):
    """``combee``'s parser: a usage error is one line that points at ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"combee: error: {message} (see `{self.prog} --help`)\n")


# --- progress -------------------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on a TTY; a line every 10 % otherwise; nothing when quiet."""

    def __init__(self, label: str, stream: TextIO = sys.stderr, quiet: bool = False) -> None:
        self.label = label
        self.stream = stream
        self.quiet = quiet
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self._last_decile = -1

    def update(self, done: int, total: int, note: str = "") -> None:
        if self.quiet or total <= 0:
            return
        frac = min(1.0, done / total)
        elapsed = time.monotonic() - self.started
        if self.tty:
            width = 28
            filled = int(frac * width)
            bar = "#" * filled + "." * (width - filled)
            self.stream.write(f"\r{self.label} [{bar}] {done}/{total} {note} {elapsed:5.1f}s ")
            self.stream.flush()
        else:
            decile = int(frac * 10)
            if decile != self._last_decile:
                self._last_decile = decile
                self.stream.write(f"{self.label}: {done}/{total} {note} ({elapsed:.1f}s)\n")
                self.stream.flush()

    def close(self) -> None:
        if self.tty and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()


# --- option types and groups ----------------------------------------------------------------------------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def batch_size(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"batch size must be a positive integer or 'auto', got {text!r}") from None


def add_llm_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LLM endpoint (default: $OPENAI_BASE_URL, $OPENAI_API_KEY, COMBEE_* settings)")
    g.add_argument("--base-url", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    g.add_argument("--model", help="model for every role (default: $COMBEE_MODEL or combee-sim)")
    for role in ("reflector", "curator", "merger", "generator"):
        g.add_argument(f"--{role}-model", help=f"model for the {role} role")
    g.add_argument("--structured-output", choices=["auto", "json_schema", "json_object_schema", "json_object", "none"])
    g.add_argument("--llm-concurrency", type=positive_int, help="max requests in flight (default 64)")
    g.add_argument("--cache-dir", type=Path, help="on-disk response cache (replays and benchmarks reuse answers)")


def add_method_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("method")
    g.add_argument("--p", type=positive_int, dest="dup", help="augmented shuffle duplication factor (default 2)")
    g.add_argument("--max-group-items", type=positive_int, help="reflections per level-1 group at most (default 24)")
    g.add_argument("--max-fan-in", type=positive_int, help="partial deltas per merge call at most (default 12)")
    g.add_argument(
        "--reduce-shape",
        choices=["none", "section", "section-union"],
        help="Combee's reduce: section-union (default: a keyed shuffle by section, partials united, no merge "
        "call), section (merges within a section) or none (the paper's: one shuffle, merge calls)",
    )
    g.add_argument("--group-factor", type=float, default=1.0, help="k = floor(factor * sqrt(n)) groups (default 1)")
    g.add_argument("--token-budget", type=positive_int, help="hard size budget of the prompt in tokens")


def add_connection_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("services (default: $COMBEE_KAFKA_BOOTSTRAP, $COMBEE_REDIS_URL, COMBEE_* settings)")
    g.add_argument("--bootstrap", help="Kafka bootstrap servers, e.g. 127.0.0.1:9092")
    g.add_argument("--redis-url", help="Redis URL, e.g. redis://127.0.0.1:6379/0 (password: $COMBEE_REDIS_PASSWORD)")
    g.add_argument("--prefix", help="topic and key prefix (default: combee)")


# --- settings -------------------------------------------------------------------------------------------


def given_options(args: argparse.Namespace, mapping: dict[str, str]) -> dict[str, Any]:
    """``{field: value}`` for each option of ``mapping`` (option name → field name) given on the command line."""
    return {field: value for arg, field in mapping.items() if (value := getattr(args, arg, None)) is not None}


def first_line(exc: BaseException) -> str:
    """The first lines of an exception's message, joined and cut to 300 characters (its type when empty)."""
    text = str(exc).strip().splitlines()
    return " ".join(line.strip() for line in text[:3])[:300] if text else type(exc).__name__


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The settings (environment, then the LLM and method options given) of a verb; CliError when invalid."""
    mapping = {
        "base_url": "openai_base_url",
        "model": "model",
        "reflector_model": "model_reflector",
        "curator_model": "model_curator",
        "merger_model": "model_merger",
        "generator_model": "model_generator",
        "structured_output": "structured_output",
        "llm_concurrency": "llm_max_concurrency",
        "cache_dir": "cache_dir",
        "dup": "p",
        "max_group_items": "max_group_items",
        "max_fan_in": "max_fan_in",
        "reduce_shape": "reduce_shape",
        "token_budget": "token_budget",
    }
    try:
        return Settings(**given_options(args, mapping))
    except Exception as exc:  # pydantic ValidationError: name the setting, not a traceback
        raise CliError(f"invalid setting: {first_line(exc)}") from None


def stream_settings(args: argparse.Namespace) -> Settings:
    """:func:`settings_from_args` with the service options (``--bootstrap``, ``--redis-url``, ``--prefix``)."""
    settings = settings_from_args(args)
    updates: dict[str, Any] = {}
    for arg, field in (("bootstrap", "kafka_bootstrap"), ("redis_url", "redis_url"), ("prefix", "topic_prefix")):
        value = getattr(args, arg, None)
        if value:
            updates[field] = value
    if getattr(args, "prefix", None):
        updates["key_prefix"] = args.prefix
    return settings.model_copy(update=updates) if updates else settings


def service_errors(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Kafka or Redis unreachable, or refusing the credentials, ends a verb with one line and status 4."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        import redis.exceptions
        from aiokafka.errors import KafkaError as AIOKafkaError
        from kafka.errors import KafkaError

        try:
            return func(args)
        except (KafkaError, AIOKafkaError, redis.exceptions.RedisError) as exc:
            service = "Redis" if isinstance(exc, redis.exceptions.RedisError) else "Kafka"
            try:
                s = stream_settings(args)
                secrets = [x.get_secret_value() for x in (s.redis_password, s.kafka_sasl_password) if x is not None]
            except Exception:  # the settings themselves are fine by now; this is only for redaction
                secrets = []
            message = redact(f"{type(exc).__name__}: {exc}", secrets)[:400]
            if isinstance(exc, redis.exceptions.ConnectionError) and not isinstance(
                exc, redis.exceptions.AuthenticationError
            ):
                message = with_start_hint(message)
            raise CliError(f"{service}: {message}", EXIT_SERVICE) from None

    return run


def with_start_hint(message: str) -> str:
    """``message`` (a service that did not answer) with how to start the local one."""
    return message.rstrip(". ") + "; start it, or for the local one run: combee dev up"


def prompt_client(settings: Settings, namespace: str) -> PromptClient:
    """A blocking reader of ``namespace``'s published prompt (the namespace checked first)."""
    from streams.client import PromptClient

    validate_namespace(namespace)
    return PromptClient(settings, namespace, key_prefix=settings.key_prefix)


def wait_for_version(client: PromptClient, before: int, timeout_s: float) -> int | None:
    """The first version of ``client``'s namespace above ``before`` published within ``timeout_s`` seconds, or None.

    Nothing published yet is waited through like an older version (``before`` may be 0). One connection for the
    whole wait: a version is seen when announced, a missed announcement at the client's next poll
    (:meth:`streams.client.PromptClient.watch`); Redis failures are retried until the time is up."""
    for version in client.watch(timeout=timeout_s, after=before):
        return version.version
    return None


def no_new_version(what: str, timeout_s: float, signed: bool) -> CliError:
    """The error of a control request (``what``: a rollback, a bullet action) after which no new version appeared
    within ``timeout_s`` seconds: which worker-side reasons to look at, and whether the request was signed."""
    how = "signed with this" if signed else "not signed: no"
    return CliError(
        f"{what} requested, but no new version appeared within {timeout_s:g}s (is a worker running? The request "
        f"was {how} COMBEE_CONTROL_KEY; a worker whose key differs dead-letters it)",
        EXIT_SERVICE,
    )


# --- trace files ----------------------------------------------------------------------------------------


def load_trace_file(path: Path, namespace: str | None, err: TextIO) -> tuple[list[Trace], int]:
    """The valid traces of a JSON-lines file and the count of malformed lines (the first 20 reported to ``err``).

    Raises CliError when the file is missing, unreadable, a directory or holds no valid trace.
    """
    if namespace is not None:
        validate_namespace(namespace)
    if not path.exists():
        raise CliError(f"trace file not found: {path}")
    if path.is_dir():
        raise CliError(f"trace file is a directory: {path}")
    try:
        tf = read_traces(path, namespace=namespace)
    except PermissionError:
        raise CliError(f"cannot read trace file: {path} (permission denied)") from None
    for e in tf.errors[:20]:
        err.write(f"combee: {path}:{e.line}: skipped: {e.reason}\n")
    if len(tf.errors) > 20:
        err.write(f"combee: {path}: ... and {len(tf.errors) - 20} more malformed lines skipped\n")
    if not tf.traces:
        raise CliError(f"no valid traces in {path} ({len(tf.errors)} malformed lines)")
    return tf.traces, len(tf.errors)
