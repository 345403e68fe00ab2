"""Settings of the simulated OpenAI-compatible endpoint.

One frozen :class:`SimConfig` describes a simulator run: the seed that makes answers reproducible, the latency
model, the server-side concurrency limit and the injected faults. Only the fault fields (:data:`FAULT_FIELDS`)
may change while a server runs, through ``POST /admin/faults``; a change produces a new validated config.

``time_scale`` multiplies *every* delay the simulator imposes — service time, the timeout-fault hang and the
``Retry-After`` hint — so a benchmark at ``time_scale=0.01`` runs 100× faster with the same ratios. A client
whose own timeout should be compared with ``timeout_hang_s`` must scale that timeout the same way.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["FAULT_FIELDS", "SimConfig"]

FAULT_FIELDS: tuple[str, ...] = (
    "fault_500_rate",
    "fault_429_rate",
    "retry_after_s",
    "fault_timeout_rate",
    "timeout_hang_s",
    "fault_malformed_rate",
    "outage",
)
"""Fields that ``POST /admin/faults`` may change at run time."""

_Rate = Field(default=0.0, ge=0.0, le=1.0)


class SimConfig(BaseModel):
    """Everything that shapes a simulator's behaviour except the world model (the responder).

    Invariant: the four fault rates sum to at most 1 (they are disjoint outcomes of one draw per request).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = 0
    time_scale: float = Field(default=1.0, ge=0.0)

    # Latency (combee.sim.latency): (ttft + prompt·prefill + completion/decode) · jitter · time_scale.
    ttft_s: float = Field(default=0.4, ge=0.0)
    prefill_s_per_token: float = Field(default=0.0002, ge=0.0)
    decode_tokens_per_s: float = Field(default=60.0, gt=0.0)
    jitter_sigma: float = Field(default=0.1, ge=0.0)

    max_concurrency: int = Field(default=256, ge=1)

    # Serving (combee.sim.serving): a named profile presets these; see SimConfig.for_profile.
    profile: str = "unlimited"
    # Continuous batching: when both are set, the requests in flight share these aggregate rates (tokens per
    # simulated second) instead of each being served at single-stream speed; decode_tokens_per_s caps a stream.
    prefill_tokens_per_s_total: float | None = Field(default=None, gt=0.0)
    decode_tokens_per_s_total: float | None = Field(default=None, gt=0.0)
    # A hosted tier's limits: 429 + Retry-After beyond them, x-ratelimit-* headers on every answer.
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    # Prefix caching: cached prompt tokens skip prefill and are reported in usage.prompt_tokens_details.
    prefix_cache: bool = True
    prefix_block_tokens: int = Field(default=16, ge=1)
    prefix_min_tokens: int = Field(default=0, ge=0)

    # Faults: per-request probabilities, drawn from a fault rng that also mixes in a request counter.
    fault_500_rate: float = _Rate
    fault_429_rate: float = _Rate
    retry_after_s: float = Field(default=1.0, ge=0.0)
    fault_timeout_rate: float = _Rate
    timeout_hang_s: float = Field(default=60.0, ge=0.0)
    fault_malformed_rate: float = _Rate
    outage: bool = False

    models: tuple[str, ...] = ("combee-sim",)

    # The world model's one knob a benchmark varies per run (combee.sim.world.Behaviour): a merge call shown m
    # proposals writes at most merge_capacity_factor · K(m), K being the curator's capacity law. 1 = a merge
    # overloads exactly like a curator call; None = unlimited (no overload in merges).
    merge_capacity_factor: float | None = Field(default=1.0, gt=0.0)
    # How the simulated reflector labels a lesson's section (combee.sim.world.Behaviour.labels): "consistent"
    # (the insight's own section), "random:N" (one of N sections drawn per trace) or "free" (a label per trace).
    labels: str = "consistent"

    @field_validator("labels")
    @classmethod
    def _labels_known(cls, value: str) -> str:
        from combee.sim.world import Behaviour

        Behaviour(labels=value)  # raises ValueError for an unknown spelling
        return value

    @model_validator(mode="after")
    def _rates_are_a_distribution(self) -> SimConfig:
        total = self.fault_rate_total
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault rates sum to {total:.4f}; they must sum to at most 1")
        return self

    @classmethod
    def for_profile(cls, profile: str, **fields: Any) -> SimConfig:
        """The config of a named serving profile (:data:`combee.sim.serving.PROFILES`), ``fields`` overriding it.

        Raises ``ValueError`` for an unknown profile.
        """
        from combee.sim.serving import PROFILES

        if profile not in PROFILES:
            raise ValueError(f"unknown serving profile {profile!r} (choose among {', '.join(PROFILES)})")
        return cls.model_validate({**PROFILES[profile], **fields})

    @property
    def shared_throughput(self) -> bool:
        """True when requests in flight share aggregate prefill/decode throughput (continuous batching)."""
        return self.prefill_tokens_per_s_total is not None and self.decode_tokens_per_s_total is not None

    @property
    def any_fault_rate(self) -> bool:
        """True when some request may draw a fault (the outage switch aside)."""
        return self.fault_rate_total > 0.0

    @property
    def fault_rate_total(self) -> float:
        """Probability that a request draws some fault."""
        return self.fault_500_rate + self.fault_429_rate + self.fault_timeout_rate + self.fault_malformed_rate

    def faults(self) -> dict[str, Any]:
        """The current fault settings, as ``POST /admin/faults`` returns them."""
        return {name: getattr(self, name) for name in FAULT_FIELDS}

    def with_faults(self, **changes: Any) -> SimConfig:
        """A new validated config with some fault fields changed.

        Raises ``ValueError`` for a field that is not a fault field, and pydantic's ``ValidationError`` (also
        a ``ValueError``) for an invalid value or rates summing above 1.
        """
        unknown = sorted(set(changes) - set(FAULT_FIELDS))
        if unknown:
            raise ValueError(f"not fault settings: {', '.join(unknown)} (allowed: {', '.join(FAULT_FIELDS)})")
        return SimConfig.model_validate({**self.model_dump(), **changes})
