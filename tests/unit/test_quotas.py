"""combee/quotas.py: token buckets per namespace and per producer, at given times (no clock)."""

from __future__ import annotations

import pytest

from combee.errors import ConfigError
from combee.quotas import Bucket, QuotaLedger, Quotas, RateLimit, admit, bucket_key, prune

NS = RateLimit(per_s=2.0, burst=3)
PRODUCER = RateLimit(per_s=1.0, burst=2)


def _run(ledger: QuotaLedger, calls: list[tuple[str, str | None, float]]) -> list[bool]:
    return [ledger.admit(ns, producer, at).admitted for ns, producer, at in calls]


def test_a_burst_is_admitted_then_the_excess_is_refused_with_the_reason() -> None:
    ledger = QuotaLedger(Quotas(namespace=NS))
    assert _run(ledger, [("a", None, 100.0)] * 5) == [True, True, True, False, False]
    verdict = ledger.admit("a", None, 100.0)
    assert not verdict.admitted
    assert verdict.reason == "rate limit: namespace 'a' is over its quota of 2 traces/s, burst 3"


def test_tokens_come_back_at_the_rate_and_never_above_the_burst() -> None:
    ledger = QuotaLedger(Quotas(namespace=NS))
    assert _run(ledger, [("a", None, 0.0)] * 4) == [True, True, True, False]
    assert _run(ledger, [("a", None, 0.5)] * 2) == [True, False]  # 0.5 s at 2/s: one token
    assert _run(ledger, [("a", None, 100.0)] * 4) == [True, True, True, False]  # 100 s idle: the burst, no more


def test_namespaces_have_buckets_of_their_own() -> None:
    ledger = QuotaLedger(Quotas(namespace=NS))
    assert _run(ledger, [("a", None, 0.0)] * 4 + [("b", None, 0.0)] * 3) == [True] * 3 + [False] + [True] * 3


def test_a_producer_is_limited_within_its_namespace_and_others_go_on() -> None:
    ledger = QuotaLedger(Quotas(namespace=RateLimit(100.0, 100), producer=PRODUCER))
    assert _run(ledger, [("a", "noisy", 0.0)] * 3) == [True, True, False]
    refused = ledger.admit("a", "noisy", 0.0)
    assert refused.reason == "rate limit: producer 'noisy' in 'a' is over its quota of 1 traces/s, burst 2"
    assert _run(ledger, [("a", "quiet", 0.0), ("b", "noisy", 0.0), ("a", None, 0.0)]) == [True, True, True]


def test_a_refused_trace_spends_no_token_of_its_namespace() -> None:
    ledger = QuotaLedger(Quotas(namespace=RateLimit(1.0, 3), producer=RateLimit(1.0, 1)))
    assert _run(ledger, [("a", "p", 0.0)] * 5) == [True, False, False, False, False]
    assert _run(ledger, [("a", "q", 0.0), ("a", "r", 0.0), ("a", "s", 0.0)]) == [True, True, False]


def test_an_older_timestamp_earns_nothing_and_a_later_one_only_what_elapsed() -> None:
    ledger = QuotaLedger(Quotas(namespace=RateLimit(1.0, 1)))
    assert _run(ledger, [("a", None, 50.0), ("a", None, 10.0), ("a", None, 49.0)]) == [True, False, False]
    assert _run(ledger, [("a", None, 51.0), ("a", None, 51.0)]) == [True, False]


def test_admit_is_pure_and_returns_the_buckets_it_touched() -> None:
    quotas = Quotas(namespace=NS, producer=PRODUCER)
    before = {bucket_key("a"): Bucket(1.0, 10.0)}
    verdict, after = admit(quotas, before, "a", "p", 10.5)
    assert verdict.admitted
    assert before == {bucket_key("a"): Bucket(1.0, 10.0)}
    assert after == {bucket_key("a"): Bucket(1.0, 10.5), bucket_key("a", "p"): Bucket(1.0, 10.5)}
    assert admit(quotas, before, "a", "p", 10.5) == (verdict, after)  # same input, same answer


def test_no_limits_admit_everything() -> None:
    ledger = QuotaLedger(Quotas())
    assert not ledger.quotas.active
    assert all(_run(ledger, [("a", "p", 0.0)] * 1000))


def test_prune_drops_full_buckets_first_then_the_oldest_producers() -> None:
    quotas = Quotas(namespace=NS, producer=PRODUCER)
    buckets = {
        bucket_key("a"): Bucket(0.0, 9.0),
        bucket_key("a", "full-again"): Bucket(0.0, 0.0),  # 10 s at 1/s: full (2)
        bucket_key("a", "old"): Bucket(0.0, 9.0),
        bucket_key("a", "new"): Bucket(0.0, 9.5),
    }
    assert set(prune(quotas, buckets, 10.0, keep=3)) == {
        bucket_key("a"),
        bucket_key("a", "old"),
        bucket_key("a", "new"),
    }
    assert set(prune(quotas, buckets, 10.0, keep=2)) == {bucket_key("a"), bucket_key("a", "new")}


def test_the_ledger_stays_bounded_with_many_producer_names() -> None:
    ledger = QuotaLedger(Quotas(namespace=RateLimit(1e6, 1e6), producer=PRODUCER), max_buckets=50)
    for i in range(1000):
        ledger.admit("a", f"p{i}", 0.0)
        assert len(ledger.buckets) <= 50
    assert bucket_key("a") in ledger.buckets


@pytest.mark.parametrize(("per_s", "burst"), [(0.0, 1), (-1.0, 5), (1.0, 0.5)])
def test_a_rate_limit_must_be_positive(per_s: float, burst: float) -> None:
    with pytest.raises(ConfigError):
        RateLimit(per_s, burst)
