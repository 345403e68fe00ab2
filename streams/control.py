"""Operator requests to a namespace's combiner, sent as :class:`~streams.envelopes.Control` records.

A request goes to the partials topic, keyed by the namespace so it lands in the partition whose combiner owns
that namespace, signed with ``COMBEE_CONTROL_KEY`` when one is set (streams/control_auth.py). The combiner applies
it in order with the namespace's partials; whoever sends it watches Redis for the version it produces.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from streams.codec import encode
from streams.control_auth import control_key, sign
from streams.envelopes import Control
from streams.kafka_config import kafka_security_kwargs, require_kafka

if TYPE_CHECKING:
    from streams.settings import StreamSettings

__all__ = ["request_rollback", "send_control"]

SEND_TIMEOUT_S = 30.0


def send_control(settings: StreamSettings, ctrl: Control) -> bool:
    """Sign ``ctrl`` when the settings hold a control key, send it to the partials topic and wait for the broker's
    acknowledgement (acks=all). Returns whether it was signed. Raises KafkaUnreachable when no broker answers and
    kafka-python's errors when the send fails."""
    from kafka import KafkaProducer

    key = control_key(settings)
    if key is not None:
        ctrl = sign(ctrl, key)
    require_kafka(settings)
    producer = KafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", **kafka_security_kwargs(settings))
    try:
        producer.send(settings.topics().partials, key=ctrl.namespace.encode(), value=encode(ctrl)).get(
            timeout=SEND_TIMEOUT_S
        )
    finally:
        producer.close()
    return key is not None


def request_rollback(
    settings: StreamSettings, namespace: str, to_version: int, *, clock: Callable[[], float] = time.time
) -> bool:
    """Ask ``namespace``'s combiner to publish version ``to_version``'s content as a new version. Returns whether
    the request was signed (see :func:`send_control`)."""
    ctrl = Control(namespace=namespace, kind="rollback", to_version=to_version, requested_at=clock())
    return send_control(settings, ctrl)
