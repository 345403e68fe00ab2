"""The one settings object, read once at an entry point (CLI, worker). Core functions take plain values;
modules of ``streams/`` take the section they need (streams/settings.py), which every Settings object is.

Every field can be set by an environment variable ``COMBEE_<FIELD>`` (case-insensitive). The standard
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` variables work too. Secrets are ``SecretStr``: they never print.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from combee.controller import DEFAULT_BS, DEFAULT_BS_MAX, DEFAULT_BS_MIN, DEFAULT_TRIAL_SIZES
from combee.corroborate import DEFAULT_HARMFUL_TAGS
from combee.dedup import DEFAULT_THRESHOLD
from combee.llm import DEFAULT_REASONING_MODELS, Role
from combee.plan import DEFAULT_SHUFFLE_KEY, ShuffleKey
from combee.promptdiff import MAX_DIFF_VERSIONS
from combee.sections import DEFAULT_SECTIONS
from streams.settings import StreamSettings

__all__ = ["Settings"]


class Settings(StreamSettings):
    """The wire's sections (streams/settings.py: Kafka, topics, Redis, the control key) plus the LLM endpoint,
    the method and the workers' fields. Callers and environment names do not depend on which section holds a
    field."""

    model_config = SettingsConfigDict(env_prefix="COMBEE_", extra="ignore", case_sensitive=False)

    # --- LLM endpoint ---
    openai_base_url: str = Field(
        default="http://127.0.0.1:8000/v1",
        validation_alias=AliasChoices("COMBEE_OPENAI_BASE_URL", "OPENAI_BASE_URL"),
    )
    openai_api_key: SecretStr = Field(
        default=SecretStr("not-needed"), validation_alias=AliasChoices("COMBEE_OPENAI_API_KEY", "OPENAI_API_KEY")
    )
    model: str = "combee-sim"
    model_reflector: str | None = None
    model_curator: str | None = None
    model_merger: str | None = None
    model_generator: str | None = None
    # An endpoint (OpenAI-compatible base URL) per role; unset: openai_base_url. Same API key for all.
    base_url_reflector: str | None = None
    base_url_curator: str | None = None
    base_url_merger: str | None = None
    base_url_generator: str | None = None
    structured_output: Literal["auto", "json_schema", "json_object_schema", "json_object", "none"] = "auto"
    llm_max_concurrency: int = Field(default=64, ge=1)
    llm_timeout_s: float = Field(default=120.0, gt=0)
    llm_max_attempts: int = Field(default=6, ge=1)
    llm_backoff_max_s: float = Field(default=30.0, gt=0)
    # Context window (prompt + completion tokens) assumed when the server reports none (llama.cpp and vLLM do).
    llm_context_tokens: int = Field(default=32_768, ge=256)
    # Regular expression searched in model names: reasoning models get max_completion_tokens, no temperature.
    llm_reasoning_models: str = DEFAULT_REASONING_MODELS
    cache_dir: Path | None = None

    # --- method ---
    # the duplication factor of the augmented shuffle; None: the reduce shape's own (combee.plan.DEFAULT_P)
    p: int | None = Field(default=None, ge=1, le=8)
    max_group_items: int = Field(default=24, ge=2)
    max_fan_in: int = Field(default=12, ge=2)
    # The reduce's shape (docs/benchmarks.md): section-union routes reflections by section and unites the
    # sections' and groups' partial deltas with no merge call; none is the paper's (one shuffle, merge calls).
    reduce_shape: ShuffleKey = DEFAULT_SHUFFLE_KEY
    # The sections offered to the model besides a playbook's own (combee.sections), and the lesson screen.
    sections: tuple[str, ...] = DEFAULT_SECTIONS
    screen: bool = True
    parse_attempts: int = Field(default=3, ge=1)
    token_budget: int = Field(default=24_000, ge=64)

    # --- semantic de-duplication (docs/dedup.md) ---
    # auto: an OpenAI-compatible /v1/embeddings endpoint when embeddings_url is set, else the local model
    # (the `embeddings` extra); off, or the extra missing: exact match after normalisation only (logged).
    embeddings: Literal["auto", "local", "endpoint", "off"] = "auto"
    embeddings_url: str | None = None
    embeddings_model: str = "all-MiniLM-L6-v2"
    embeddings_api_key: SecretStr | None = None  # unset: openai_api_key
    embeddings_threshold: float = Field(default=DEFAULT_THRESHOLD, gt=0, le=1)
    embeddings_threads: int = Field(default=2, ge=1)  # CPU threads of the local model
    embeddings_tokenizer: Path | None = None  # the local model's tokenizer.json; unset: where install puts it

    # --- streaming (the wire's own sections, Kafka, topics and Redis, are in streams/settings.py) ---
    max_inflight_windows: int = Field(default=1, ge=1)
    max_wait_s: float = Field(default=30.0, gt=0)
    bs_min: int = Field(default=DEFAULT_BS_MIN, ge=1)
    bs_max: int = Field(default=DEFAULT_BS_MAX, ge=1)
    bs_default: int = Field(default=DEFAULT_BS, ge=1)
    bs_candidates: tuple[int, ...] = DEFAULT_TRIAL_SIZES
    curate_concurrency: int = Field(default=8, ge=1)
    # The map stage's reflections go out as tasks of at most this many traces, to any worker of the pool
    # (role curate); each worker reflects at most reflect_concurrency tasks at a time.
    reflect_task_size: int = Field(default=8, ge=1, le=256)
    reflect_concurrency: int = Field(default=8, ge=1)
    worker_web_port: int = Field(default=6066, ge=0)
    state_dir: Path = Path("var/dev")

    # --- quotas (docs/security.md, "Quotas") ---
    # Traces learned per second per namespace, and per producer (a trace's metadata "producer") within a
    # namespace, with the burst each may save up; the window stage dead-letters the excess with the reason.
    # 0: no limit of that kind. The defaults stop a runaway producer, not a fleet's normal traffic.
    quota_namespace_per_s: float = Field(default=50.0, ge=0, allow_inf_nan=False)
    quota_namespace_burst: int = Field(default=10_000, ge=1)
    quota_producer_per_s: float = Field(default=20.0, ge=0, allow_inf_nan=False)
    quota_producer_burst: int = Field(default=5_000, ge=1)
    # Namespaces one worker holds in memory at once; a trace of a new namespace past the cap is dead-lettered
    # (reason namespace_limit). A namespace with nothing buffered or in flight for namespace_idle_s seconds is
    # let go (its learning lives in Kafka and is read back when its next trace comes).
    max_namespaces: int = Field(default=1_000, ge=1)
    namespace_idle_s: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    # Traces one namespace may have waiting for its windows; past it, its later traces are held back (only their
    # offsets kept; read again from Kafka when there is room) and the partition's other namespaces go on.
    # held_max: offsets held back per traces partition before that partition waits (the last resort).
    namespace_buffer: int = Field(default=4_096, ge=1)
    held_max: int = Field(default=100_000, ge=1)

    # --- producer identity (docs/security.md, "Signed traces"; combee/identity.py) ---
    # A JSON file {producer_id: {"key": "...", "namespaces": ["ns", ...] or ["*"]}}: the keys the workers verify
    # signed traces with (read once at start). Unset: no producer has a key, every signed trace is refused.
    producer_keys_file: Path | None = None
    # Namespaces that refuse unsigned traces: a comma-separated list, or * for all. Empty: none (as before).
    require_signed: str = ""

    # --- trusted feedback (docs/security.md, "Trusted feedback"; combee/feedback.py) ---
    # Where a namespace's feedback comes from: agent (the trace's own, as before), trusted (a signed record on
    # the feedback topic from a producer whose key grants "feedback" for the namespace; the trace's own is
    # ignored; a trace whose record does not come within feedback_wait_s is learned with no feedback), or
    # required (as trusted, but such a trace is dead-lettered). feedback: the default for every namespace;
    # feedback_namespaces: per-namespace overrides, "ns=mode,ns2=mode".
    feedback: Literal["agent", "trusted", "required"] = "agent"
    feedback_namespaces: str = ""
    feedback_wait_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    # Feedback that comes before its trace is kept this long for it, at most feedback_early_max records.
    feedback_early_s: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    feedback_early_max: int = Field(default=10_000, ge=1)

    # --- corroboration (docs/security.md, "Corroboration and caps"; combee/corroborate.py) ---
    # A new bullet, and an UPDATE or REMOVE of an established bullet (found helpful at least
    # corroborate_established_helpful times, or pinned), goes live only when this many distinct traces taught it
    # (traces of one producer count once); until then it is pending (`combee bullet list NS --pending`). 1: off.
    corroborate_min_traces: int = Field(default=1, ge=1)
    # Per-namespace overrides of corroborate_min_traces, a JSON object: {"finance": 3}.
    corroborate_namespaces: dict[str, int] = Field(default_factory=dict)
    corroborate_established_helpful: int = Field(default=1, ge=1)
    # New bullets one trace / one producer may be a source of per window (the excess is refused and counted).
    corroborate_trace_cap: int | None = Field(default=None, ge=1)
    corroborate_producer_cap: int | None = Field(default=None, ge=1)
    # Pending lessons kept per namespace (the least recently supported go first).
    corroborate_max_pending: int = Field(default=256, ge=0)
    # Harmful tags on an established bullet count only when at least this many reflections of one window gave
    # them (and at least corroborate_min_traces): one failed run cannot mark a proven lesson harmful. 1: off.
    corroborate_harmful_tags: int = Field(default=DEFAULT_HARMFUL_TAGS, ge=1)
    # --- promotion (docs/promotion.md) ---
    # What agents are served of a namespace that has no policy of its own (`combee prompt policy` sets one, kept
    # in Redis): direct = every new version at once (as before promotion existed); manual = candidates wait for
    # `combee prompt promote`/`reject`; canary = candidates go to `promotion_canary_fraction` of the agents and
    # their outcomes decide; gate = candidates are served once they answer a validation set no worse than the live
    # version (`promotion_gate_*`).
    promotion_policy: Literal["direct", "manual", "canary", "gate"] = "direct"
    promotion_canary_fraction: float = Field(default=0.1, gt=0, le=1)
    # The sequential test of a canary and of a rollback on outcomes (combee/compare.py): each side needs
    # `promotion_min_decided` traces with a known outcome; worse/not worse by more than `promotion_margin`, one-sided
    # at level `promotion_alpha`.
    promotion_margin: float = Field(default=0.05, ge=0, lt=1)
    promotion_min_decided: int = Field(default=200, ge=1)
    promotion_alpha: float = Field(default=0.05, gt=0, lt=0.5)
    # Roll a live version back to its predecessor when its outcomes are worse by more than the margin (any policy).
    rollback_on_outcomes: bool = True
    # How often (seconds) the worker that owns a namespace reads its outcomes for a canary or a rollback.
    promotion_check_s: float = Field(default=5.0, gt=0)
    # The gate (docs/promotion.md, "The gate"): the validation set of a namespace that has none of its own in Redis
    # (`combee prompt policy NS gate --validation FILE`), a JSON-lines file read when the worker starts; the grader
    # of its lines that name none; the paired test (at least `promotion_gate_min_pairs` tasks, not worse by more
    # than `promotion_gate_margin`, one-sided at `promotion_alpha`); generator requests in flight per evaluation.
    promotion_gate_validation_file: Path | None = None
    promotion_gate_grader: str = "exact"
    promotion_gate_margin: float = Field(default=0.05, ge=0, lt=1)
    promotion_gate_min_pairs: int = Field(default=30, ge=1)
    promotion_gate_concurrency: int = Field(default=4, ge=1)
    # A share of the traces that carry feedback.ground_truth, chosen by a hash of (namespace, trace id), is held out:
    # never reflected on, kept (at most `promotion_gate_holdout_max` per namespace) as gate validation tasks graded
    # by `promotion_gate_grader`. 0: off. Applies to every namespace of the worker, whatever its policy.
    promotion_gate_holdout: float = Field(default=0.0, ge=0, lt=1)
    promotion_gate_holdout_max: int = Field(default=1000, ge=1)

    # --- operations (docs/operations.md) ---
    # Prometheus metrics of a worker on http://<metrics_host>:<metrics_port>/metrics; unset: no metrics, no port.
    # Every worker process on a host needs a port of its own.
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_host: str = "127.0.0.1"
    # Namespaces with Prometheus series of their own in one worker (the first seen); later ones are counted
    # together under the namespace label "(other)": producers choose namespaces, the series count stays bounded.
    metrics_max_namespaces: int = Field(default=100, ge=1)
    # Dollars per 1,000 tokens, for combee_llm_cost_usd_total and `combee learn`'s cost_usd; unset counts 0.
    llm_price_per_1k_prompt: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    llm_price_per_1k_completion: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    # How often (seconds) a worker checks its dependencies (LLM and embeddings endpoints, Kafka, Redis) and
    # writes what it found to Redis for `combee status` and `combee ui`; 0: no checks.
    health_interval_s: float = Field(default=5.0, ge=0)

    # --- the web page (`combee ui`, docs/operations.md) ---
    # Host names the page answers besides localhost, IP addresses and the address it is bound to (a JSON list);
    # any other Host is refused (421), which stops DNS rebinding from reading /api/*.
    ui_allowed_hosts: tuple[str, ...] = ()
    # The most published versions (full playbooks) one diff request reads.
    ui_max_diff_versions: int = Field(default=MAX_DIFF_VERSIONS, ge=2)

    def model_for(self, role: Role) -> str:
        specific = getattr(self, f"model_{role.value}")
        return specific or self.model

    def models(self) -> dict[Role, str]:
        return {role: self.model_for(role) for role in Role}

    def base_url_for(self, role: Role) -> str:
        specific: str | None = getattr(self, f"base_url_{role.value}")
        return specific or self.openai_base_url
