"""Kafka client options from :class:`~streams.settings.KafkaSettings`, and topic creation/verification.

One mapping of Combee's security settings to each Kafka client's spelling, so the trace publisher
(kafka-python), the admin tools (kafka-python) and the workers (aiokafka / Faust) connect the same way:

============================  ==================================  =========================================
Settings                      kafka-python                        aiokafka
============================  ==================================  =========================================
kafka_security_protocol       security_protocol                   security_protocol
kafka_sasl_mechanism          sasl_mechanism                      sasl_mechanism
kafka_sasl_username           sasl_plain_username                 sasl_plain_username
kafka_sasl_password           sasl_plain_password                 sasl_plain_password
kafka_ssl_cafile/certfile/    ssl_cafile / ssl_certfile /         ssl_context (built with
keyfile                       ssl_keyfile                         ``aiokafka.helpers.create_ssl_context``)
============================  ==================================  =========================================

Both clients use the ``sasl_plain_*`` names for SCRAM too. Faust (on aiokafka) takes the same settings as
``broker_credentials`` (:func:`faust_security_kwargs`). The password is handed over as a ``str`` whose
``repr()`` is ``'***'``: the client libraries use its value, while logging a kwargs dict (kafka-python's
admin client logs its whole configuration at DEBUG) or printing it shows no secret.
"""

from __future__ import annotations

import logging
import shlex
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from combee.errors import ConfigError, KafkaUnreachable
from streams.topics import DEFAULT_PARTITIONS, DEFAULT_PREFIX, Topics, TopicSpec

if TYPE_CHECKING:
    from streams.settings import KafkaSettings

__all__ = [
    "MaskedSecret",
    "TopicState",
    "TopicsReport",
    "aiokafka_security_kwargs",
    "bootstrap_servers",
    "check_kafka_reachable",
    "create_topics_command",
    "delete_prefixed_topics",
    "describe_topics",
    "ensure_topics",
    "faust_security_kwargs",
    "kafka_security_kwargs",
    "missing_topics",
    "require_kafka",
    "topic_states",
]

log = logging.getLogger(__name__)

_UNKNOWN_TOPIC: Final = 3  # UNKNOWN_TOPIC_OR_PARTITION
_TOPIC_ALREADY_EXISTS: Final = 36


class MaskedSecret(str):
    """A ``str`` that is the secret to whoever uses its value but shows ``'***'`` in ``repr()``.

    ``repr()`` is what logging a dict of options, a dataclass or an exception's args prints, so passing
    secrets this way keeps them out of logs while client libraries (which encode or join the value) still work.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "'***'"


def bootstrap_servers(kafka: KafkaSettings | str) -> str:
    """The bootstrap list of Kafka settings, or the string itself."""
    return kafka if isinstance(kafka, str) else kafka.kafka_bootstrap


def _addresses(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap.split(","):
        item = item.strip()
        if "://" in item:
            item = item.split("://", 1)[1]
        host, _, port = item.rpartition(":")
        if host and port.isdigit():
            out.append((host.strip("[]"), int(port)))
    return out


def check_kafka_reachable(bootstrap: str, timeout_s: float = 3.0) -> str | None:
    """None when a TCP connection to one of ``bootstrap``'s addresses opens within ``timeout_s`` seconds (in
    all); else why not, one line naming each address. It checks the network path only (a broker that accepts
    the connection but does not answer Kafka requests still passes); kafka-python's bootstrap, by contrast,
    waits about 30 s before it gives up."""
    addresses = _addresses(bootstrap)
    if not addresses:
        return f"no host:port in the bootstrap list {bootstrap!r}"
    deadline = time.monotonic() + timeout_s
    reasons = []
    for host, port in addresses:
        left = max(0.2, deadline - time.monotonic())
        try:
            with socket.create_connection((host, port), timeout=left):
                return None
        except TimeoutError:
            reasons.append(f"{host}:{port}: no answer within {timeout_s:g} s")
        except OSError as exc:
            reasons.append(f"{host}:{port}: {(exc.strerror or str(exc) or type(exc).__name__).lower()}")
    return "; ".join(reasons)


def require_kafka(kafka: KafkaSettings | str, timeout_s: float = 3.0) -> None:
    """Raise :class:`~combee.errors.KafkaUnreachable` — one line naming the address and the command that starts
    a local broker — when no bootstrap address of ``kafka`` accepts a connection within ``timeout_s``."""
    bootstrap = bootstrap_servers(kafka)
    why = check_kafka_reachable(bootstrap, timeout_s)
    if why is not None:
        raise KafkaUnreachable(
            bootstrap,
            f"Kafka is not reachable at {bootstrap} ({why}); start it, or for the local one run: combee dev up",
        )


@dataclass(frozen=True)
class _Security:
    protocol: str
    mechanism: str | None
    username: str | None
    password: MaskedSecret | None
    cafile: str | None
    certfile: str | None
    keyfile: str | None


def _security(settings: KafkaSettings) -> _Security:
    """Check the Kafka security settings for consistency; raise ConfigError saying what is wrong."""
    protocol = settings.kafka_security_protocol
    sasl = protocol in ("SASL_PLAINTEXT", "SASL_SSL")
    tls = protocol in ("SSL", "SASL_SSL")
    password = settings.kafka_sasl_password.get_secret_value() if settings.kafka_sasl_password else None
    if sasl:
        missing = [
            name
            for name, value in (
                ("COMBEE_KAFKA_SASL_MECHANISM", settings.kafka_sasl_mechanism),
                ("COMBEE_KAFKA_SASL_USERNAME", settings.kafka_sasl_username),
                ("COMBEE_KAFKA_SASL_PASSWORD", password),
            )
            if not value
        ]
        if missing:
            raise ConfigError(f"COMBEE_KAFKA_SECURITY_PROTOCOL={protocol} needs {', '.join(missing)}")
    elif settings.kafka_sasl_mechanism or settings.kafka_sasl_username or password:
        raise ConfigError(
            f"SASL settings are given but COMBEE_KAFKA_SECURITY_PROTOCOL={protocol}; "
            "use SASL_SSL (or SASL_PLAINTEXT) to authenticate"
        )
    files = {
        "COMBEE_KAFKA_SSL_CAFILE": settings.kafka_ssl_cafile,
        "COMBEE_KAFKA_SSL_CERTFILE": settings.kafka_ssl_certfile,
        "COMBEE_KAFKA_SSL_KEYFILE": settings.kafka_ssl_keyfile,
    }
    given = {name: path for name, path in files.items() if path is not None}
    if given and not tls:
        raise ConfigError(
            f"{', '.join(given)} given but COMBEE_KAFKA_SECURITY_PROTOCOL={protocol}; use SSL or SASL_SSL"
        )
    if settings.kafka_ssl_keyfile is not None and settings.kafka_ssl_certfile is None:
        raise ConfigError("COMBEE_KAFKA_SSL_KEYFILE needs COMBEE_KAFKA_SSL_CERTFILE (the client certificate)")
    for name, path in given.items():
        if not Path(path).is_file():
            raise ConfigError(f"{name}={str(path)!r} is not a readable file")

    def as_str(path: Path | None) -> str | None:
        return str(path) if path is not None else None

    return _Security(
        protocol=protocol,
        mechanism=settings.kafka_sasl_mechanism if sasl else None,
        username=settings.kafka_sasl_username if sasl else None,
        password=MaskedSecret(password) if sasl and password else None,
        cafile=as_str(settings.kafka_ssl_cafile),
        certfile=as_str(settings.kafka_ssl_certfile),
        keyfile=as_str(settings.kafka_ssl_keyfile),
    )


def kafka_security_kwargs(settings: KafkaSettings) -> dict[str, Any]:
    """Security options for kafka-python's KafkaProducer / KafkaConsumer / KafkaAdminClient.

    PLAINTEXT gives ``{"security_protocol": "PLAINTEXT"}``. SASL protocols add the mechanism and the
    ``sasl_plain_*`` credentials (used for PLAIN and SCRAM alike); SSL protocols add the CA / client
    certificate / key paths that are set, with hostname checking on. The password value is a
    :class:`MaskedSecret`. Raises ConfigError when the settings are incomplete or contradict each other.
    """
    sec = _security(settings)
    out: dict[str, Any] = {"security_protocol": sec.protocol}
    if sec.mechanism is not None:
        out["sasl_mechanism"] = sec.mechanism
        out["sasl_plain_username"] = sec.username
        out["sasl_plain_password"] = sec.password
    if sec.protocol in ("SSL", "SASL_SSL"):
        out["ssl_check_hostname"] = True
        if sec.cafile is not None:
            out["ssl_cafile"] = sec.cafile
        if sec.certfile is not None:
            out["ssl_certfile"] = sec.certfile
        if sec.keyfile is not None:
            out["ssl_keyfile"] = sec.keyfile
    return out


def aiokafka_security_kwargs(settings: KafkaSettings) -> dict[str, Any]:
    """The same options in aiokafka's spelling (AIOKafkaProducer / AIOKafkaConsumer / AIOKafkaAdminClient).

    For SSL protocols ``ssl_context`` is an :class:`ssl.SSLContext` from
    ``aiokafka.helpers.create_ssl_context`` (hostname checking on; system CAs when no CA file is set).
    Raises ConfigError as :func:`kafka_security_kwargs` does, and when a certificate/key file cannot be loaded.
    """
    sec = _security(settings)
    out: dict[str, Any] = {"security_protocol": sec.protocol}
    if sec.mechanism is not None:
        out["sasl_mechanism"] = sec.mechanism
        out["sasl_plain_username"] = sec.username
        out["sasl_plain_password"] = sec.password
    if sec.protocol in ("SSL", "SASL_SSL"):
        from aiokafka.helpers import create_ssl_context

        try:
            out["ssl_context"] = create_ssl_context(cafile=sec.cafile, certfile=sec.certfile, keyfile=sec.keyfile)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise ConfigError(f"cannot load the Kafka TLS certificate files: {exc}") from None
    return out


def faust_security_kwargs(settings: KafkaSettings) -> dict[str, Any]:
    """Faust's ``broker_credentials`` from the Kafka security settings (SASL and/or TLS); ``{}`` for PLAINTEXT."""
    if settings.kafka_security_protocol == "PLAINTEXT":
        return {}
    import ssl

    from faust.auth import SASLCredentials, SSLCredentials

    context = None
    if settings.kafka_security_protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(
            cafile=str(settings.kafka_ssl_cafile) if settings.kafka_ssl_cafile else None
        )
        if settings.kafka_ssl_certfile:
            context.load_cert_chain(
                str(settings.kafka_ssl_certfile),
                str(settings.kafka_ssl_keyfile) if settings.kafka_ssl_keyfile else None,
            )
    if settings.kafka_security_protocol == "SSL":
        return {"broker_credentials": SSLCredentials(context)}
    password = settings.kafka_sasl_password.get_secret_value() if settings.kafka_sasl_password else None
    return {
        "broker_credentials": SASLCredentials(
            username=settings.kafka_sasl_username,
            password=password,
            mechanism=settings.kafka_sasl_mechanism or "PLAIN",
            ssl_context=context,
        )
    }


# ---------------------------------------------------------------------------------------------------------
# Topics
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicsReport:
    """What :func:`ensure_topics` found and did.

    ``config_drift`` lists, for topics that already existed, each spec'd config whose broker value differs:
    ``{topic: {key: (actual, expected)}}``. Drift is reported (and logged), never changed: altering a live
    topic's retention or cleanup policy is an operator's decision.
    """

    created: tuple[str, ...]
    existing: tuple[str, ...]
    config_drift: Mapping[str, Mapping[str, tuple[str | None, str]]] = field(default_factory=dict)


def _describe(admin: Any, names: list[str]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in admin.describe_topics(names)}


def _describe_until_present(
    admin: Any, names: list[str], deadline: float, pause_s: float = 0.2
) -> dict[str, dict[str, Any]]:
    """Describe ``names`` until every one of them is there with its partitions, or ``deadline`` passes.

    On a cluster a topic the controller has just created reaches the other brokers' metadata a moment later;
    a broker that has not seen it yet (one just restarted, say) describes it as unknown. Seen on a 3-node
    cluster: every topic "missing" right after its creation succeeded.
    """
    while True:
        described = _describe(admin, names)
        present = all(_exists(described.get(n)) and (described[n].get("partitions") or []) for n in names)
        if present or time.monotonic() >= deadline:
            return described
        time.sleep(pause_s)


def _exists(info: Mapping[str, Any] | None) -> bool:
    return info is not None and info.get("error_code", _UNKNOWN_TOPIC) == 0


def _config_drift(admin: Any, specs: list[TopicSpec]) -> dict[str, dict[str, tuple[str | None, str]]]:
    from kafka.admin import ConfigResource, ConfigResourceType

    if not specs:
        return {}
    resources = [ConfigResource(ConfigResourceType.TOPIC, s.name, configs=dict.fromkeys(s.config)) for s in specs]
    try:
        described = admin.describe_configs(resources, config_filter="all").get("topic", {})
    except Exception as exc:  # drift is advisory: not being allowed to read configs must not fail startup
        log.warning("could not read topic configs to check for drift: %s", exc)
        return {}
    drift: dict[str, dict[str, tuple[str | None, str]]] = {}
    for spec in specs:
        actual = described.get(spec.name, {})
        for key, expected in spec.config.items():
            value = (actual.get(key) or {}).get("value")
            if value != expected:
                drift.setdefault(spec.name, {})[key] = (value, expected)
    for name, diffs in drift.items():
        log.warning("topic %s exists with different configs (actual, expected): %s", name, diffs)
    return drift


def ensure_topics(
    kafka: KafkaSettings | str,
    topics: Topics,
    *,
    timeout_s: float = 30.0,
    replication_factor: int | None = None,
    min_insync_replicas: int | None = None,
    admin_factory: Callable[..., Any] | None = None,
) -> TopicsReport:
    """Create every topic of ``topics.specs()`` that is missing, with its partition count and configs, and
    check that every topic has the partition count its spec asks for. Idempotent and safe to race: a topic
    another process creates at the same moment counts as existing.

    Raises ConfigError when a topic has the wrong partition count (co-partitioning by namespace would break;
    the message names each topic and both counts) or when the broker refuses to create one (bad replication
    factor, not authorised, ...). No broker at the bootstrap addresses raises KafkaUnreachable within a few
    seconds; other connection failures raise kafka-python's errors (NoBrokersAvailable, KafkaTimeoutError).
    Config drift on existing topics is reported in the result, not raised.
    ``replication_factor`` and ``min_insync_replicas`` (a topic config, set only when given) default to the
    Settings' (``COMBEE_REPLICATION_FACTOR``, ``COMBEE_MIN_INSYNC_REPLICAS``), or to 1 and the broker's
    default for a bare bootstrap string; they apply to the topics created here. ``admin_factory`` (default
    ``KafkaAdminClient``) is for tests.
    """
    if replication_factor is None:
        replication_factor = 1 if isinstance(kafka, str) else kafka.replication_factor
    if min_insync_replicas is None and not isinstance(kafka, str):
        min_insync_replicas = kafka.min_insync_replicas
    if replication_factor < 1:
        raise ConfigError("replication_factor must be at least 1")
    if min_insync_replicas is not None and not 1 <= min_insync_replicas <= replication_factor:
        raise ConfigError(
            f"min_insync_replicas={min_insync_replicas} must be within 1..replication_factor={replication_factor} "
            "(with more, every acks=all write would fail)"
        )
    durability = {"min.insync.replicas": str(min_insync_replicas)} if min_insync_replicas is not None else {}
    timeout_ms = max(1000, int(timeout_s * 1000))
    admin = _admin(kafka, "combee-ensure-topics", timeout_s, admin_factory)
    try:
        specs = topics.specs()
        names = [s.name for s in specs]
        described = _describe(admin, names)
        missing = [s for s in specs if not _exists(described.get(s.name))]
        created: list[str] = []
        if missing:
            result = admin.create_topics(
                {
                    s.name: {
                        "num_partitions": s.partitions,
                        "replication_factor": replication_factor,
                        "configs": {**s.config, **durability},
                    }
                    for s in missing
                },
                timeout_ms=timeout_ms,
                raise_errors=False,
            )
            refused: list[str] = []
            for item in result.get("topics", []):
                code = item.get("error_code", 0)
                if code == 0:
                    created.append(item["name"])
                elif code != _TOPIC_ALREADY_EXISTS:
                    refused.append(f"{item['name']} (error {code}: {item.get('error_message') or 'no message'})")
            if refused:
                raise ConfigError(f"Kafka refused to create topics: {'; '.join(refused)}")
            if created:
                admin.wait_for_topics(created, timeout_ms=timeout_ms)
            described = _describe_until_present(admin, names, time.monotonic() + timeout_s)
        wrong = []
        for spec in specs:
            info = described.get(spec.name)
            if not _exists(info):
                wrong.append(f"{spec.name} is still missing after creation")
                continue
            assert info is not None
            count = len(info.get("partitions") or [])
            if count != spec.partitions:
                wrong.append(f"{spec.name} has {count} partitions, expected {spec.partitions}")
        if wrong:
            raise ConfigError(
                "Kafka topics do not match Combee's specs: "
                + "; ".join(wrong)
                + " (COMBEE_PARTITIONS must equal the existing topics' partition count, or use a new topic prefix)"
            )
        existing = tuple(n for n in names if n not in created)
        drift = _config_drift(admin, [s for s in specs if s.name in existing])
        if created:
            log.info("created Kafka topics: %s", ", ".join(created))
        return TopicsReport(created=tuple(created), existing=existing, config_drift=drift)
    finally:
        admin.close()


# ---------------------------------------------------------------------------------------------------------
# Describing topics, and what to say when one is missing
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicState:
    """One of Combee's topics as the cluster has it, beside its spec.

    ``partitions`` and ``replication_factor`` are None when the topic does not exist (``exists`` False);
    ``replication_factor`` is the replica count of the topic's first partition.
    """

    spec: TopicSpec
    exists: bool
    partitions: int | None = None
    replication_factor: int | None = None

    @property
    def ok(self) -> bool:
        """The topic exists with the partition count its spec asks for."""
        return self.exists and self.partitions == self.spec.partitions


def topic_states(specs: list[TopicSpec], described: Mapping[str, Mapping[str, Any]]) -> list[TopicState]:
    """Each spec beside what a metadata answer (kafka-python's ``describe_topics``, by topic name) says of it."""
    states = []
    for spec in specs:
        info = described.get(spec.name)
        if not _exists(info):
            states.append(TopicState(spec, exists=False))
            continue
        assert info is not None
        partitions = sorted(info.get("partitions") or [], key=lambda p: p.get("partition_index", 0))
        replicas = partitions[0].get("replica_nodes") if partitions else None
        states.append(
            TopicState(
                spec,
                exists=True,
                partitions=len(partitions),
                replication_factor=len(replicas) if isinstance(replicas, list) else None,
            )
        )
    return states


def _admin(
    kafka: KafkaSettings | str, client_id: str, timeout_s: float, admin_factory: Callable[..., Any] | None
) -> Any:
    if admin_factory is None:
        from kafka.admin import KafkaAdminClient

        require_kafka(kafka, min(timeout_s, 3.0))  # a broker that is not there: one line at once, not a timeout

        admin_factory = KafkaAdminClient
    timeout_ms = max(1000, int(timeout_s * 1000))
    security = kafka_security_kwargs(kafka) if not isinstance(kafka, str) else {}
    return admin_factory(
        bootstrap_servers=bootstrap_servers(kafka),
        client_id=client_id,
        request_timeout_ms=timeout_ms,
        bootstrap_timeout_ms=timeout_ms,
        **security,
    )


def describe_topics(
    kafka: KafkaSettings | str,
    topics: Topics,
    *,
    timeout_s: float = 10.0,
    admin_factory: Callable[..., Any] | None = None,
) -> list[TopicState]:
    """Every topic of ``topics.specs()`` as the cluster has it (one metadata request; nothing is changed).

    No broker at the bootstrap addresses raises KafkaUnreachable; other connection failures raise kafka-python's
    errors (NoBrokersAvailable, KafkaTimeoutError).
    """
    admin = _admin(kafka, "combee-describe-topics", timeout_s, admin_factory)
    try:
        specs = topics.specs()
        return topic_states(specs, _describe(admin, [s.name for s in specs]))
    finally:
        admin.close()


def missing_topics(
    kafka: KafkaSettings | str,
    names: list[str],
    *,
    timeout_s: float = 10.0,
    admin_factory: Callable[..., Any] | None = None,
) -> list[str]:
    """The topics of ``names`` that the cluster says do not exist (UNKNOWN_TOPIC_OR_PARTITION), in order.

    A topic the client may not describe (not authorised) is not reported missing: only the broker's "unknown"
    counts. Connection failures raise kafka-python's errors.
    """
    admin = _admin(kafka, "combee-topic-check", timeout_s, admin_factory)
    try:
        described = _describe(admin, names)
    finally:
        admin.close()
    return [n for n in names if (described.get(n) or {}).get("error_code") == _UNKNOWN_TOPIC]


def create_topics_command(bootstrap: str, topics: Topics) -> str:
    """The ``combee topics create`` command line that creates ``topics`` on the cluster at ``bootstrap``.

    Options equal to the defaults (prefix ``combee``, 4 partitions) are left out; security settings come from
    the environment (COMBEE_KAFKA_*), as for every ``combee`` command.
    """
    parts = ["combee", "topics", "create", "--bootstrap", bootstrap]
    if topics.prefix != DEFAULT_PREFIX:
        parts += ["--prefix", topics.prefix]
    if topics.partitions != DEFAULT_PARTITIONS:
        parts += ["--partitions", str(topics.partitions)]
    return shlex.join(parts)


def delete_prefixed_topics(
    kafka: KafkaSettings | str, prefix: str, *, timeout_s: float = 30.0, admin_factory: Callable[..., Any] | None = None
) -> list[str]:
    """Delete every topic whose name starts with ``prefix.`` (Combee's topics under it) or ``prefix-`` (Faust's
    own, e.g. ``<prefix>-worker-__assignor-__leader``); returns their names, sorted. For throw-away runs (the
    demo) that made a prefix of their own: never call it with a prefix other runs share."""
    if not prefix or "*" in prefix:
        raise ConfigError(f"refusing to delete topics under the prefix {prefix!r}")
    admin = _admin(kafka, "combee-delete-topics", timeout_s, admin_factory)
    try:
        names = sorted(t for t in admin.list_topics() if t.startswith((f"{prefix}.", f"{prefix}-")))
        if names:
            admin.delete_topics(names, timeout_ms=max(1000, int(timeout_s * 1000)))
        return names
    finally:
        admin.close()
