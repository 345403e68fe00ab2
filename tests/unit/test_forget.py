"""Forget rules (issue 26, item 3): which traces a rule names, how rules are stored and read, and that a worker's
cached copy follows the store."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from combee.errors import CombeeError
from combee.forget import ForgetRule, forgotten, parse_rules
from combee.models import Trace
from streams.forget import CachedRules


def trace(namespace: str, producer: str | None, i: int = 0) -> Trace:
    metadata: dict[str, Any] = {"producer": producer} if producer is not None else {}
    return Trace(trace_id=f"t{i}", namespace=namespace, task="t", metadata=metadata)


def test_a_rule_names_a_namespace_a_producer_or_a_producer_in_a_namespace() -> None:
    a_x, a_y, b_x, b_none = trace("a", "x"), trace("a", "y"), trace("b", "x"), trace("b", None)
    assert [forgotten(t, [ForgetRule(namespace="a")]) for t in (a_x, a_y, b_x, b_none)] == [True, True, False, False]
    assert [forgotten(t, [ForgetRule(producer="x")]) for t in (a_x, a_y, b_x, b_none)] == [True, False, True, False]
    both = [ForgetRule(namespace="b", producer="x")]
    assert [forgotten(t, both) for t in (a_x, a_y, b_x, b_none)] == [False, False, True, False]
    assert not forgotten(a_x, [])


@pytest.mark.parametrize("kwargs", [{}, {"namespace": "bad ns"}, {"producer": ""}, {"producer": "x\x1by"}])
def test_a_rule_that_names_nothing_or_nothing_valid_is_refused(kwargs: dict[str, str]) -> None:
    with pytest.raises((CombeeError, ValueError)):
        ForgetRule(**kwargs)


def test_rules_round_trip_through_their_stored_text_and_junk_is_skipped() -> None:
    rules = [ForgetRule(namespace="a"), ForgetRule(producer="x"), ForgetRule(namespace="b", producer="y")]
    stored = [r.encode().encode() for r in rules] + [b"not json", b'{"namespace": null, "producer": null}', b"[1]"]
    assert set(parse_rules(stored)) == set(rules)
    assert ForgetRule(namespace="a").encode() == ForgetRule(namespace="a").encode()  # one set member per rule


def test_a_worker_rereads_the_rules_after_their_ttl_and_keeps_them_when_redis_fails() -> None:
    now = [0.0]
    stored: list[Any] = [{ForgetRule(namespace="a").encode().encode()}]
    reads = []

    async def load() -> Any:
        reads.append(now[0])
        if isinstance(stored[0], Exception):
            raise stored[0]
        return stored[0]

    cached = CachedRules(load, lambda: now[0], ttl_s=10.0)

    async def run() -> None:
        assert await cached.rules() == (ForgetRule(namespace="a"),)
        stored[0] = {ForgetRule(producer="x").encode().encode()}
        now[0] = 5.0
        assert await cached.rules() == (ForgetRule(namespace="a"),)  # within the TTL: not read again
        now[0] = 10.0
        assert await cached.rules() == (ForgetRule(producer="x"),)
        stored[0] = ConnectionError("redis down")
        now[0] = 20.0
        assert await cached.rules() == (ForgetRule(producer="x"),)  # kept

    asyncio.run(run())
    assert reads == [0.0, 10.0, 20.0]


def test_a_read_that_hangs_is_cut_short_and_the_old_rules_kept() -> None:
    now = [0.0]
    hang = [False]

    async def load() -> Any:
        if hang[0]:
            await asyncio.sleep(3600)
        return {ForgetRule(namespace="a").encode().encode()}

    cached = CachedRules(load, lambda: now[0], ttl_s=10.0, read_timeout_s=0.01)

    async def run() -> None:
        assert await cached.rules() == (ForgetRule(namespace="a"),)
        hang[0], now[0] = True, 10.0
        assert await cached.rules() == (ForgetRule(namespace="a"),)

    asyncio.run(run())
