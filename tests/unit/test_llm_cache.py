"""ResponseCache and cache_key on their own: the key's contract, storage round trips, sharing between
connections, threads and processes, and clear errors for unusable cache directories."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import combee
from combee.errors import ConfigError
from combee.llm import ChatResponse, Usage
from combee.llm_openai.cache import CACHE_FILENAME, ResponseCache, cache_key

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
BASE: dict[str, Any] = {
    "model": "m",
    "messages": MESSAGES,
    "response_format": None,
    "max_tokens": 100,
    "temperature": 0.0,
    "seed": None,
}


def answer(text: str = "hello", *, simulated: bool = False) -> ChatResponse:
    return ChatResponse(
        text=text,
        usage=Usage(prompt_tokens=5, completion_tokens=2),
        model="served",
        service_time_s=0.7,
        simulated=simulated,
    )


# ---------------------------------------------------------------------- the key


def test_key_is_a_stable_sha256_hex() -> None:
    key = cache_key(**BASE)
    assert key == cache_key(**BASE)
    assert len(key) == 64 and int(key, 16) >= 0


@pytest.mark.parametrize(
    "change",
    [
        {"model": "other"},
        {"messages": [*MESSAGES, {"role": "user", "content": "more"}]},
        {"messages": [{"role": "user", "content": "Be brief."}, MESSAGES[1]]},
        {"response_format": {"type": "json_object"}},
        {"max_tokens": 101},
        {"temperature": 0.1},
        {"seed": 0},
        {"seed": 1},
    ],
)
def test_every_sent_field_is_part_of_the_key(change: dict[str, Any]) -> None:
    assert cache_key(**{**BASE, **change}) != cache_key(**BASE)


def test_key_ignores_representation_only_differences() -> None:
    as_int = cache_key(**{**BASE, "temperature": 0})
    assert as_int == cache_key(**BASE)
    fmt = {"type": "json_object", "schema": {"type": "object"}}
    proxied = MappingProxyType({"type": "json_object", "schema": MappingProxyType({"type": "object"})})
    assert cache_key(**{**BASE, "response_format": proxied}) == cache_key(**{**BASE, "response_format": fmt})


def test_schema_property_order_is_significant() -> None:
    # Grammar-constrained decoders generate properties in schema order: another order is another request.
    ab = {"type": "json_object", "schema": {"properties": {"a": {}, "b": {}}}}
    ba = {"type": "json_object", "schema": {"properties": {"b": {}, "a": {}}}}
    assert cache_key(**{**BASE, "response_format": ab}) != cache_key(**{**BASE, "response_format": ba})


def test_key_rejects_values_that_are_not_json() -> None:
    with pytest.raises(ValueError):
        cache_key(**{**BASE, "temperature": float("nan")})
    with pytest.raises(TypeError):
        cache_key(**{**BASE, "response_format": {"type": object()}})


@given(
    seed_a=st.none() | st.integers(min_value=-(2**31), max_value=2**31),
    seed_b=st.none() | st.integers(min_value=-(2**31), max_value=2**31),
    content=st.text(alphabet=st.characters(codec=None), max_size=40),
)
def test_keys_equal_exactly_when_requests_equal(seed_a: int | None, seed_b: int | None, content: str) -> None:
    messages = [{"role": "user", "content": content}]
    key_a = cache_key(**{**BASE, "messages": messages, "seed": seed_a})
    key_b = cache_key(**{**BASE, "messages": messages, "seed": seed_b})
    assert (key_a == key_b) == (seed_a == seed_b)


# ---------------------------------------------------------------------- storage


def test_put_get_round_trip_marks_the_answer_cached(tmp_path: Path) -> None:
    with ResponseCache(tmp_path) as cache:
        assert cache.get("k") is None
        assert cache.put("k", answer("hi", simulated=True)) is True
        hit = cache.get("k")
    assert hit == ChatResponse(
        text="hi",
        usage=Usage(prompt_tokens=5, completion_tokens=2),
        model="served",
        service_time_s=None,
        simulated=True,
        cached=True,
    )


def test_first_writer_wins(tmp_path: Path) -> None:
    with ResponseCache(tmp_path) as cache:
        assert cache.put("k", answer("first")) is True
        assert cache.put("k", answer("second")) is False
        hit = cache.get("k")
    assert hit is not None and hit.text == "first"


@settings(max_examples=50, deadline=None)
@given(text=st.text(alphabet=st.characters(codec=None)))
def test_any_text_round_trips_exactly(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    # Includes lone surrogates, which a JSON "\ud800" escape from a model can produce.
    with ResponseCache(tmp_path_factory.mktemp("cache")) as cache:
        cache.put("k", answer(text))
        hit = cache.get("k")
    assert hit is not None and hit.text == text


def test_lone_surrogate_round_trips(tmp_path: Path) -> None:
    with ResponseCache(tmp_path) as cache:
        cache.put("k", answer("broken \ud800 escape"))
        hit = cache.get("k")
    assert hit is not None and hit.text == "broken \ud800 escape"


def test_answers_persist_across_instances(tmp_path: Path) -> None:
    with ResponseCache(tmp_path) as cache:
        cache.put("k", answer("kept"))
    with ResponseCache(tmp_path) as reopened:
        hit = reopened.get("k")
        assert hit is not None and hit.text == "kept"


def test_stats_and_clear(tmp_path: Path) -> None:
    with ResponseCache(tmp_path) as cache:
        cache.put("a", answer())
        cache.put("b", answer())
        cache.put("a", answer())
        cache.get("a")
        cache.get("missing")
        stats = cache.stats()
        assert (stats.entries, stats.hits, stats.misses, stats.writes) == (2, 1, 1, 2)
        assert stats.path == tmp_path / CACHE_FILENAME and stats.size_bytes > 0
        assert len(cache) == 2
        assert cache.clear() == 2
        assert len(cache) == 0 and cache.get("a") is None


def test_file_is_in_wal_mode(tmp_path: Path) -> None:
    ResponseCache(tmp_path).close()
    conn = sqlite3.connect(tmp_path / CACHE_FILENAME)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_two_connections_see_each_others_writes(tmp_path: Path) -> None:
    with ResponseCache(tmp_path) as one, ResponseCache(tmp_path) as two:
        one.put("k", answer("from one"))
        hit = two.get("k")
        assert hit is not None and hit.text == "from one"
        assert two.clear() == 1
        assert one.get("k") is None


def test_threads_share_one_cache(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    with ResponseCache(tmp_path) as cache:

        def work(worker: int) -> None:
            try:
                for i in range(50):
                    cache.put(f"{worker}-{i}", answer(f"{worker}-{i}"))
                    hit = cache.get(f"{worker}-{i}")
                    assert hit is not None and hit.text == f"{worker}-{i}"
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert len(cache) == 400


def test_processes_share_one_cache_directory(tmp_path: Path) -> None:
    writer = textwrap.dedent(
        f"""
        from combee.llm import ChatResponse
        from combee.llm_openai.cache import ResponseCache
        with ResponseCache({str(tmp_path)!r}) as cache:
            print("ready", flush=True)
            for i in range(1000):
                cache.put(f"child-{{i}}", ChatResponse(text=f"child {{i}}"))
                cache.put(f"shared-{{i % 20}}", ChatResponse(text="child"))
        """
    )
    repo_root = Path(combee.__file__).resolve().parent.parent
    child = subprocess.Popen([sys.executable, "-c", writer], cwd=repo_root, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        with ResponseCache(tmp_path) as cache:  # writes interleave with the child's
            for i in range(1000):
                cache.put(f"parent-{i}", answer(f"parent {i}"))
                cache.put(f"shared-{i % 20}", answer("parent"))
            assert child.wait(timeout=60) == 0
            assert len(cache) == 1000 + 1000 + 20
            hit = cache.get("child-999")
            assert hit is not None and hit.text == "child 999"
    finally:
        child.kill()
        child.communicate()  # reaps the child and closes its stdout pipe


# ---------------------------------------------------------------------- unusable directories


def test_directory_under_a_file_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot open the LLM response cache"):
        ResponseCache(blocker / "cache")


def test_a_file_that_is_not_sqlite_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / CACHE_FILENAME).write_bytes(b"definitely not a database" * 100)
    with pytest.raises(ConfigError, match="cannot use"):
        ResponseCache(tmp_path)


def test_a_cache_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    ResponseCache(tmp_path).close()
    conn = sqlite3.connect(tmp_path / CACHE_FILENAME)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(ConfigError, match="newer"):
        ResponseCache(tmp_path)
