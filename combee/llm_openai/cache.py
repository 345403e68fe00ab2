"""An on-disk cache of successful LLM answers, shared safely by several processes.

Why it exists: replays and benchmarks should be reproducible and cheap. The same request sent twice returns
the answer stored the first time — even at ``temperature > 0``; replaying recorded answers is the point.

Contract:

- **Key** — :func:`cache_key`: the SHA-256 of a canonical JSON of the request *exactly as it went over the
  wire*: model, messages, the ``response_format`` actually sent (``None`` when none was), ``max_tokens``,
  ``temperature`` and ``seed``. Never the base URL or the API key, so a cache directory can be shared between
  machines and copied into a bug report without leaking credentials.
- **Value** — the answer text, its usage, the model that served it and whether the server said it was the
  Combee simulator (so a replayed simulated answer stays honestly labelled as simulated).
- Only successful responses are stored (the caller's duty: :class:`combee.llm_openai.OpenAILLM` stores after a
  2xx only). The first answer stored for a key wins (``INSERT OR IGNORE``), so every later reader of a shared
  cache sees the same answer.
- **Storage** — one SQLite file (``responses.sqlite3``) in WAL mode with a busy timeout: any number of readers
  and one writer at a time across processes, writers queue instead of failing. ``synchronous=NORMAL``: a power
  cut may lose the last few stored answers but never corrupts the file — the right trade for a cache.
- **Threads** — one connection per :class:`ResponseCache`, serialised by a lock, so the object may be used
  from ``asyncio.to_thread`` workers (which is how :class:`~combee.llm_openai.OpenAILLM` calls it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import BaseModel, ConfigDict

from combee.errors import ConfigError
from combee.llm import ChatResponse, Usage

__all__ = [
    "CACHE_FILENAME",
    "CacheStats",
    "ResponseCache",
    "cache_key",
]

CACHE_FILENAME = "responses.sqlite3"

# Bumped when the meaning of a key or the table layout changes; part of every key, so old entries simply miss.
_KEY_VERSION = 1
_SCHEMA_VERSION = 1

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS responses (
    key               TEXT PRIMARY KEY,
    model             TEXT NOT NULL,
    text              BLOB NOT NULL,
    prompt_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    simulated         INTEGER NOT NULL
) WITHOUT ROWID
"""


def _json_default(value: object) -> object:
    # ChatRequest stores schemas as Mapping; json only knows dict/list/tuple.
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return list(value)
    raise TypeError(f"not JSON-serialisable in a cache key: {type(value).__name__}")


def cache_key(
    *,
    model: str,
    messages: Sequence[Mapping[str, str]],
    response_format: Mapping[str, Any] | None,
    max_tokens: int,
    temperature: float,
    seed: int | None,
) -> str:
    """The cache key (64 hex characters) of one chat request as sent.

    The JSON is canonical in layout (fixed top-level field order, no whitespace, UTF-8) but keeps the key
    order *inside* messages and the schema as given: property order in a JSON schema changes what a
    grammar-constrained decoder generates, so two schemas that differ only in property order are different
    requests.
    Raises :class:`TypeError` if a value is not JSON-serialisable and :class:`ValueError` for NaN/infinity.
    """
    payload = {
        "v": _KEY_VERSION,
        "model": model,
        "messages": [dict(message) for message in messages],
        "response_format": response_format,
        "max_tokens": int(max_tokens),
        "temperature": float(temperature),
        "seed": seed,
    }
    canonical = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_json_default)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


class CacheStats(BaseModel):
    """A snapshot: ``entries`` and ``size_bytes`` describe the shared file; ``hits``/``misses``/``writes``
    count this :class:`ResponseCache` object's own calls since it was opened."""

    model_config = ConfigDict(frozen=True)

    path: Path
    entries: int
    size_bytes: int
    hits: int
    misses: int
    writes: int


class ResponseCache:
    """Successful chat answers on disk, keyed by :func:`cache_key`.

    ``directory`` is created if missing. Raises :class:`~combee.errors.ConfigError` if it cannot be created or
    the file cannot be opened as a cache (unwritable, not SQLite, written by a newer Combee).
    ``busy_timeout_s`` is how long a call waits for another process's write lock before failing with
    :class:`sqlite3.OperationalError`.
    """

    def __init__(self, directory: Path | str, *, busy_timeout_s: float = 10.0) -> None:
        self._path = Path(directory) / CACHE_FILENAME
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        self._writes = 0
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: autocommit, each statement is its own short transaction.
            self._conn = sqlite3.connect(
                self._path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"cannot open the LLM response cache at {self._path}: {exc}") from exc
        try:
            self._initialise(busy_timeout_ms=max(0, round(busy_timeout_s * 1000)))
        except sqlite3.Error as exc:
            self._conn.close()
            raise ConfigError(f"cannot use {self._path} as an LLM response cache: {exc}") from exc

    def _initialise(self, *, busy_timeout_ms: int) -> None:
        conn = self._conn
        conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(f"could not switch to WAL journal mode (got {mode!r})")
        conn.execute("PRAGMA synchronous = NORMAL")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > _SCHEMA_VERSION:
            raise sqlite3.DatabaseError(
                f"cache schema version {version} is newer than this Combee understands ({_SCHEMA_VERSION})"
            )
        conn.execute(_CREATE_TABLE)
        if version < _SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")

    @property
    def path(self) -> Path:
        """The SQLite file holding the cache."""
        return self._path

    def get(self, key: str) -> ChatResponse | None:
        """The answer stored under ``key`` (``cached=True``, ``service_time_s=None``), or ``None``."""
        with self._lock:
            row = self._conn.execute(
                "SELECT model, text, prompt_tokens, completion_tokens, simulated FROM responses WHERE key = ?",
                (key,),
            ).fetchone()
            if row is None:
                self._misses += 1
                return None
            self._hits += 1
        model, text, prompt_tokens, completion_tokens, simulated = row
        return ChatResponse(
            text=bytes(text).decode("utf-8", "surrogatepass"),
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens),
            model=model,
            service_time_s=None,
            simulated=bool(simulated),
            cached=True,
        )

    def put(self, key: str, response: ChatResponse) -> bool:
        """Store a *successful* answer under ``key``. Returns ``False`` (and changes nothing) if the key
        already holds an answer: the first writer wins, so all readers of a shared cache agree."""
        with self._lock:
            cursor = self._conn.execute(
                "INSERT OR IGNORE INTO responses"
                " (key, model, text, prompt_tokens, completion_tokens, simulated) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    key,
                    response.model,
                    # Bytes, not TEXT: a model can emit a lone surrogate (a JSON "\ud800" escape), which is a
                    # valid Python str but not valid UTF-8; the answer must come back exactly as it was.
                    response.text.encode("utf-8", "surrogatepass"),
                    response.usage.prompt_tokens,
                    response.usage.completion_tokens,
                    int(response.simulated),
                ),
            )
            stored = cursor.rowcount == 1
            if stored:
                self._writes += 1
        return stored

    def __len__(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def stats(self) -> CacheStats:
        """Entry count and on-disk size (main file + WAL) of the shared cache, plus this object's counters."""
        entries = len(self)
        size = 0
        for suffix in ("", "-wal"):
            part = self._path.with_name(self._path.name + suffix)
            with contextlib.suppress(FileNotFoundError):
                size += part.stat().st_size
        with self._lock:
            return CacheStats(
                path=self._path,
                entries=entries,
                size_bytes=size,
                hits=self._hits,
                misses=self._misses,
                writes=self._writes,
            )

    def clear(self) -> int:
        """Delete every stored answer (for every process sharing the file). Returns how many were deleted."""
        with self._lock:
            cursor = self._conn.execute("DELETE FROM responses")
            return max(cursor.rowcount, 0)

    def close(self) -> None:
        """Close the connection. Idempotent; the object must not be used afterwards."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> ResponseCache:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
