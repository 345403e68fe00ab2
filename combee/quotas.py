"""Quotas: how many traces a namespace, and one producer in it, may have learned per second (token buckets).

Every trace costs a reflector call, so a runaway or hostile producer is a cost and a poisoning risk. The window
stage asks :func:`admit` about each valid trace before buffering it; a refused trace is dead-lettered with the
reason :func:`admit` gives (never dropped unseen). Pure: the caller passes the time ``at`` (seconds), the same
timestamps give the same decisions.

A bucket holds at most ``burst`` tokens and gains ``per_s`` tokens per second; a trace takes one token from its
namespace's bucket and, when it names a producer (``metadata["producer"]``, :func:`combee.forget.producer_of`),
one from that producer's bucket in that namespace — both, or neither: a refused trace spends nothing. A trace that
names no producer is bounded by its namespace's limit alone. Time never runs backwards for a bucket: a timestamp
older than the bucket's last one counts as that one (an old timestamp earns no tokens).

The producer is a label the agent sets, not an authenticated identity: a producer that changes its name gets a
fresh bucket, so the namespace limit is the bound that holds whatever producers claim.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from combee.errors import ConfigError

__all__ = ["QUOTA_KIND", "Bucket", "QuotaLedger", "Quotas", "RateLimit", "Verdict", "admit", "bucket_key", "prune"]


QUOTA_KIND = "rate_limited"
"""The dead-letter kind (the metrics' ``reason`` label) of a trace refused by a rate limit."""


@dataclass(frozen=True)
class RateLimit:
    """``per_s`` tokens per second, at most ``burst`` saved up."""

    per_s: float
    burst: float

    def __post_init__(self) -> None:
        if not self.per_s > 0 or not self.burst >= 1:
            raise ConfigError(f"a rate limit needs per_s > 0 and burst >= 1 (got {self.per_s}, {self.burst})")

    def describe(self) -> str:
        return f"{self.per_s:g} traces/s, burst {self.burst:g}"


@dataclass(frozen=True)
class Quotas:
    """The limits of a namespace and of each producer within one; None: no limit of that kind."""

    namespace: RateLimit | None = None
    producer: RateLimit | None = None

    @property
    def active(self) -> bool:
        return self.namespace is not None or self.producer is not None


@dataclass(frozen=True)
class Bucket:
    tokens: float
    at: float


@dataclass(frozen=True)
class Verdict:
    """``admitted``, or the reason the trace was refused (a dead letter's reason)."""

    admitted: bool
    reason: str = ""


BucketKey = tuple[str, str | None]
"""(namespace, None) for a namespace's bucket, (namespace, producer) for a producer's bucket in it."""


def bucket_key(namespace: str, producer: str | None = None) -> BucketKey:
    return (namespace, producer)


def _refill(limit: RateLimit, bucket: Bucket | None, at: float) -> Bucket:
    if bucket is None:
        return Bucket(limit.burst, at)
    at = max(at, bucket.at)
    return Bucket(min(limit.burst, bucket.tokens + (at - bucket.at) * limit.per_s), at)


def admit(
    quotas: Quotas, buckets: Mapping[BucketKey, Bucket], namespace: str, producer: str | None, at: float
) -> tuple[Verdict, dict[BucketKey, Bucket]]:
    """Whether one trace of ``namespace`` (from ``producer``, None: unnamed) arriving at ``at`` is admitted, and
    the buckets it touched as they are after the decision (refilled to ``at``; one token taken from each if
    admitted). The caller stores them back; ``buckets`` is not changed."""
    checks: list[tuple[BucketKey, RateLimit, str]] = []
    if quotas.namespace is not None:
        checks.append((bucket_key(namespace), quotas.namespace, f"namespace {namespace!r}"))
    if quotas.producer is not None and producer is not None:
        checks.append((bucket_key(namespace, producer), quotas.producer, f"producer {producer!r} in {namespace!r}"))
    after = {key: _refill(limit, buckets.get(key), at) for key, limit, _ in checks}
    for key, limit, who in checks:
        if after[key].tokens < 1.0:
            return Verdict(False, f"rate limit: {who} is over its quota of {limit.describe()}"), after
    return Verdict(True), {key: Bucket(b.tokens - 1.0, b.at) for key, b in after.items()}


def prune(quotas: Quotas, buckets: Mapping[BucketKey, Bucket], at: float, keep: int) -> dict[BucketKey, Bucket]:
    """At most ``keep`` buckets: first those full again at ``at`` go (a full bucket is the same as none), then the
    least recently used. Dropping a bucket that is not full forgives its debt: a bounded memory for many
    producer names costs that much leniency; the namespace buckets, far fewer, are dropped last."""
    live: dict[BucketKey, Bucket] = {}
    for key, bucket in buckets.items():
        limit = quotas.producer if key[1] is not None else quotas.namespace
        if limit is not None and _refill(limit, bucket, at).tokens < limit.burst:
            live[key] = bucket
    if len(live) <= keep:
        return live
    order = sorted(live, key=lambda k: (k[1] is None, live[k].at, k[0], k[1] or ""))
    return {key: live[key] for key in order[len(live) - keep :]}


class QuotaLedger:
    """The buckets of one window stage, kept between calls of :func:`admit` and bounded to ``max_buckets``
    (pruned to half of it when it grows past). Deterministic: no clock of its own."""

    def __init__(self, quotas: Quotas, max_buckets: int = 10_000) -> None:
        self.quotas = quotas
        self.max_buckets = max(2, max_buckets)
        self.buckets: dict[BucketKey, Bucket] = {}

    def admit(self, namespace: str, producer: str | None, at: float) -> Verdict:
        verdict, touched = admit(self.quotas, self.buckets, namespace, producer, at)
        self.buckets.update(touched)
        if len(self.buckets) > self.max_buckets:
            self.buckets = prune(self.quotas, self.buckets, at, self.max_buckets // 2)
        return verdict
