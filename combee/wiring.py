"""The composition root: where :class:`~combee.settings.Settings` become objects.

The worker (``workers/main.py``), the command line (``combee/cli/``) and the benchmark build their LLM client,
method configuration, semantic de-duplicator, topics, prompt store and publisher here and nowhere else, so one
setting means the same thing to all of them. This module sits at the edge, above the pure core and the wire
contract (``streams/``); nothing in either imports it. Heavy clients (httpx, redis, onnxruntime) are imported
when they are built, so a command that needs none of them does not load them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from combee.corroborate import Corroboration
from combee.embeddings import Embedder, NearDuplicates
from combee.engine import Method, MethodConfig
from combee.errors import ConfigError
from combee.feedback import FeedbackPolicy, parse_modes
from combee.graders import JUDGE, make_grader
from combee.identity import IdentityPolicy, parse_producer_keys, parse_required
from combee.llm import Role
from combee.metrics import LLMPrices, Metrics, NoMetrics
from combee.playbook import ApplyPolicy
from combee.promotion import GateRule, PromotionConfig, Rule
from combee.quotas import QuotaLedger, Quotas, RateLimit
from combee.settings import Settings
from combee.validation import ValidationTask, parse_validation

if TYPE_CHECKING:
    from combee.llm_openai import OpenAILLM, RoleRouter
    from streams.redis_publisher import LatestVersionPublisher
    from streams.redis_store import RedisPromptStore

__all__ = [
    "build_llm",
    "build_metrics",
    "build_near_duplicates",
    "build_publisher",
    "build_quotas",
    "feedback_policy",
    "gate_validation",
    "identity_policy",
    "llm_prices",
    "method_config",
    "promotion_config",
    "simulator_llm",
]


def build_llm(settings: Settings) -> OpenAILLM | RoleRouter:
    """The OpenAI-compatible LLM client configured from settings (one per endpoint when roles have their own)."""
    from combee.llm_openai import EndpointConfig, OpenAILLM, RoleRouter

    def endpoint(base_url: str) -> OpenAILLM:
        return OpenAILLM(
            EndpointConfig(
                base_url=base_url,
                api_key=settings.openai_api_key,
                default_model=settings.model,
                models=settings.models(),
                structured_output=settings.structured_output,
                max_concurrency=settings.llm_max_concurrency,
                timeout_s=settings.llm_timeout_s,
                max_attempts=settings.llm_max_attempts,
                backoff_max_s=settings.llm_backoff_max_s,
                cache_dir=settings.cache_dir,
                context_tokens=settings.llm_context_tokens,
                reasoning_models=settings.llm_reasoning_models,
                price_per_1k_prompt=settings.llm_price_per_1k_prompt,
                price_per_1k_completion=settings.llm_price_per_1k_completion,
            )
        )

    default = endpoint(settings.openai_base_url)
    urls = {role: settings.base_url_for(role) for role in Role}
    if all(url == settings.openai_base_url for url in urls.values()):
        return default
    by_url: dict[str, OpenAILLM] = {settings.openai_base_url: default}
    for url in urls.values():
        if url not in by_url:
            by_url[url] = endpoint(url)
    return RoleRouter(default, {role: by_url[url] for role, url in urls.items()})


def llm_prices(settings: Settings) -> LLMPrices:
    """The LLM prices the settings give (unset: zero)."""
    return LLMPrices(settings.llm_price_per_1k_prompt, settings.llm_price_per_1k_completion)


def build_quotas(settings: Settings) -> QuotaLedger | None:
    """The window stage's rate limits (``COMBEE_QUOTA_*``); None when every limit is 0 (off)."""

    def limit(per_s: float, burst: int) -> RateLimit | None:
        return RateLimit(per_s, burst) if per_s > 0 else None

    quotas = Quotas(
        namespace=limit(settings.quota_namespace_per_s, settings.quota_namespace_burst),
        producer=limit(settings.quota_producer_per_s, settings.quota_producer_burst),
    )
    return QuotaLedger(quotas) if quotas.active else None


def identity_policy(settings: Settings) -> IdentityPolicy:
    """The producers' keys (``COMBEE_PRODUCER_KEYS_FILE``, read here once) and the namespaces that refuse unsigned
    traces (``COMBEE_REQUIRE_SIGNED``). Raises ConfigError for a file that cannot be read or is malformed (the
    message names the file and the producer at fault, never a key)."""
    keys = {}
    path = settings.producer_keys_file
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"COMBEE_PRODUCER_KEYS_FILE {path}: cannot read it: {exc.__class__.__name__}") from None
        keys = parse_producer_keys(text, f"COMBEE_PRODUCER_KEYS_FILE {path}")
    return IdentityPolicy(keys=keys, require_signed=parse_required(settings.require_signed))


def feedback_policy(settings: Settings) -> FeedbackPolicy:
    """Where each namespace's feedback comes from (``COMBEE_FEEDBACK``, ``COMBEE_FEEDBACK_NAMESPACES``) and the
    join's bounds. Raises ConfigError for a malformed override."""
    return FeedbackPolicy(
        default=settings.feedback,
        overrides=parse_modes(settings.feedback_namespaces),
        wait_s=settings.feedback_wait_s,
        early_s=settings.feedback_early_s,
        early_limit=settings.feedback_early_max,
    )


def build_metrics(settings: Settings) -> Metrics:
    """The worker's metrics: off (:class:`NoMetrics`, no port opened) unless ``metrics_port`` is set; then
    Prometheus, already answering ``GET /metrics`` on ``metrics_host:metrics_port``.

    Raises ConfigError when the address cannot be bound (the port taken: two workers on one host need a port
    each).
    """
    if settings.metrics_port is None:
        return NoMetrics()
    from combee.metrics_prometheus import PrometheusMetrics

    metrics = PrometheusMetrics(llm_prices(settings), max_namespaces=settings.metrics_max_namespaces)
    try:
        metrics.serve(settings.metrics_port, settings.metrics_host)
    except OSError as exc:
        raise ConfigError(
            f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port} ({exc.strerror or exc}); "
            "set COMBEE_METRICS_PORT to a free port (each worker process needs its own) or unset it"
        ) from None
    logging.getLogger("combee").info("metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)
    return metrics


def simulator_llm(base_url: str, *, max_concurrency: int, timeout_s: float) -> OpenAILLM:
    """The benchmark's client of the simulator at ``base_url``: the endpoint defaults, model ``combee-sim``, and
    nothing from the environment (a benchmark run must not change with the shell it is started from)."""
    from combee.llm_openai import EndpointConfig, OpenAILLM

    return OpenAILLM(
        EndpointConfig(
            base_url=base_url,
            default_model="combee-sim",
            max_concurrency=max_concurrency,
            timeout_s=timeout_s,
        )
    )


def build_near_duplicates(settings: Settings, *, log: Callable[[str], object] | None = None) -> NearDuplicates | None:
    """The semantic de-duplicator configured from settings, or None (exact match only), saying which and why.

    ``embeddings``: ``endpoint`` (or ``auto`` with ``embeddings_url`` set) asks an OpenAI-compatible
    ``/v1/embeddings``; ``local`` (``auto`` otherwise) runs all-MiniLM-L6-v2 here when the ``embeddings``
    extra is installed; ``off`` — or ``local``/``auto`` without the extra — leaves the exact rule.
    """
    say = log or logging.getLogger("combee").info
    mode = settings.embeddings
    if mode == "off":
        say("semantic de-duplication off (COMBEE_EMBEDDINGS=off): bullets are de-duplicated by exact match only")
        return None
    embedder: Embedder
    if mode == "endpoint" or (mode == "auto" and settings.embeddings_url):
        from combee.embed_openai import OpenAIEmbedder

        embedder = OpenAIEmbedder(
            settings.embeddings_url or settings.openai_base_url,
            settings.embeddings_model,
            settings.embeddings_api_key or settings.openai_api_key,
        )
    else:
        from combee.embed_local import MiniLMEmbedder, local_embedder_missing

        problem = local_embedder_missing(settings.embeddings_tokenizer)
        if problem is not None:
            say(f"semantic de-duplication off: {problem}; bullets are de-duplicated by exact match only")
            return None
        embedder = MiniLMEmbedder(settings.embeddings_tokenizer, threads=settings.embeddings_threads)
    say(f"semantic de-duplication: {embedder.name}, threshold {settings.embeddings_threshold}")
    return NearDuplicates(embedder, threshold=settings.embeddings_threshold)


def method_config(settings: Settings, method: str, group_factor: float = 1.0) -> MethodConfig:
    """The method's knobs (``p``, group and fan-in bounds, the reduce's shape, parse attempts, token budget)."""
    return MethodConfig(
        method=Method(method),
        p=settings.p or 0,  # 0: the reduce shape's own (combee.plan.DEFAULT_P)
        max_group_items=settings.max_group_items,
        max_fan_in=settings.max_fan_in,
        group_factor=group_factor,
        shuffle_key=settings.reduce_shape,
        sections=settings.sections,
        screen=settings.screen,
        parse_attempts=settings.parse_attempts,
        policy=ApplyPolicy(token_budget=settings.token_budget),
        corroboration=Corroboration(
            min_traces=settings.corroborate_min_traces,
            trace_cap=settings.corroborate_trace_cap,
            producer_cap=settings.corroborate_producer_cap,
            established_helpful=settings.corroborate_established_helpful,
            max_pending=settings.corroborate_max_pending,
            harmful_tags=settings.corroborate_harmful_tags,
        ),
        corroboration_namespaces=tuple(sorted(settings.corroborate_namespaces.items())),
    )


def build_publisher(store: RedisPromptStore, settings: Settings | None = None) -> LatestVersionPublisher:
    """The publisher that keeps Redis at the newest playbook version, whatever order snapshots arrive in. When the
    settings' default promotion policy is not ``direct``, a namespace without a policy gets it before its first
    publish (streams/redis_promotion.py, ``WithDefaultPolicy``), so no candidate is ever served by default."""
    from streams.redis_publisher import LatestVersionPublisher

    if settings is None or settings.promotion_policy == "direct":
        return LatestVersionPublisher(store)
    from streams.redis_promotion import RedisPromotion, WithDefaultPolicy

    promotion = RedisPromotion(store.redis, store.keys)
    policy, fraction = settings.promotion_policy, settings.promotion_canary_fraction
    return LatestVersionPublisher(WithDefaultPolicy(store, promotion, policy, fraction))


def gate_validation(settings: Settings) -> tuple[ValidationTask, ...]:
    """The gate's default validation set (``COMBEE_PROMOTION_GATE_VALIDATION_FILE``; none: empty). Raises
    :class:`ConfigError` for a file that cannot be read or a line that is not a task, so a worker refuses to start
    with a validation set it could not use."""
    if settings.promotion_gate_grader != JUDGE:
        make_grader(settings.promotion_gate_grader)  # an unknown default grader is refused even without a file
    path = settings.promotion_gate_validation_file
    if path is None:
        return ()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"COMBEE_PROMOTION_GATE_VALIDATION_FILE {path}: {exc}") from exc
    return parse_validation(text, default_grader=settings.promotion_gate_grader, source=str(path))


def promotion_config(settings: Settings) -> PromotionConfig:
    """The workers' promotion settings (docs/promotion.md), the gate's default validation set read."""
    rule = Rule(
        margin=settings.promotion_margin, min_decided=settings.promotion_min_decided, alpha=settings.promotion_alpha
    )
    gate = GateRule(
        margin=settings.promotion_gate_margin,
        min_pairs=settings.promotion_gate_min_pairs,
        alpha=settings.promotion_alpha,
        concurrency=settings.promotion_gate_concurrency,
    )
    source = settings.promotion_gate_validation_file
    return PromotionConfig(
        default_policy=settings.promotion_policy,
        canary_fraction=settings.promotion_canary_fraction,
        rule=rule,
        rollback_on_outcomes=settings.rollback_on_outcomes,
        check_s=settings.promotion_check_s,
        gate=gate,
        gate_tasks=gate_validation(settings),
        gate_source=f"file:{source.name}" if source is not None else "",
        gate_grader=settings.promotion_gate_grader,
        gate_holdout=settings.promotion_gate_holdout,
        gate_holdout_max=settings.promotion_gate_holdout_max,
    )
