"""Redis key names and channels, in one place.

Every key of a namespace carries the hash tag ``{<namespace>}`` so that all of them live in one Redis
Cluster slot and the atomic publish script can touch them together.

``<prefix>:{<ns>}:current``   hash: version, prompt, playbook (JSON), window_id, published_at, meta (JSON)
``<prefix>:{<ns>}:v:<N>``     hash: the same fields for version N (old versions stay addressable); its
                              meta's ``provenance`` lists the windows and trace ids it covers
``<prefix>:{<ns>}:history``   sorted set: member = JSON summary of a version, score = version
``<prefix>:{<ns>}:updates``   pub/sub channel: a message (the version number) per new version
``<prefix>:{<ns>}:status``    string: JSON status of the learner for the namespace (``combee status``)
``<prefix>:{<ns>}:outcomes``  hash: outcomes per version (``<version>|success``, ``|failure``, ``|unknown``,
                              ``|score_sum``, ``|score_n``; version ``unknown`` for one above the live one)
``<prefix>:{<ns>}:outcome-marks`` hash: ``p<partition>`` -> the last traces offset counted into ``outcomes``
``<prefix>:{<ns>}:quarantine`` hash: quarantine id -> JSON of a bullet the guard held back (streams/quarantine.py)
``<prefix>:{<ns>}:quarantine:resolved`` set: quarantine ids an operator released or removed
``<prefix>:{<ns>}:pending`` hash: pending id -> JSON of a lesson waiting for corroboration (streams/pending.py)
``<prefix>:{<ns>}:serving``   hash: the promotion policy and what agents are served (live version, canary
                              fraction, rejected candidates; combee/serving.py). Absent: policy ``direct``
``<prefix>:{<ns>}:decisions`` hash: decision id -> JSON of a promote, reject, rollback or policy decision and
                              its evidence (combee/promotion.py)
``<prefix>:{<ns>}:audit``     stream: the operators' actions on bullets (``combee bullet audit``), append-only
``<prefix>:namespaces``       set of namespaces ever published
``<prefix>:seen``             set of namespaces a worker has received a trace of (published or not yet)
``<prefix>:forget``           set of forget rules (JSON: namespace and/or producer) learning must honour
``<prefix>:health``           hash: worker id -> JSON health report of that worker's dependencies (LLM endpoint,
                              embeddings endpoint, Kafka, Redis; ``combee status``, ``combee ui``)
"""

from __future__ import annotations

from dataclasses import dataclass

from combee.models import validate_namespace

__all__ = ["RedisKeys"]


@dataclass(frozen=True)
class RedisKeys:
    prefix: str = "combee"

    def _ns(self, namespace: str) -> str:
        return f"{self.prefix}:{{{validate_namespace(namespace)}}}"

    def current(self, namespace: str) -> str:
        return f"{self._ns(namespace)}:current"

    def version(self, namespace: str, version: int) -> str:
        return f"{self._ns(namespace)}:v:{int(version)}"

    def history(self, namespace: str) -> str:
        return f"{self._ns(namespace)}:history"

    def updates(self, namespace: str) -> str:
        return f"{self._ns(namespace)}:updates"

    def status(self, namespace: str) -> str:
        return f"{self._ns(namespace)}:status"

    def outcomes(self, namespace: str) -> str:
        return f"{self._ns(namespace)}:outcomes"

    def outcome_marks(self, namespace: str) -> str:
        return f"{self._ns(namespace)}:outcome-marks"

    def serving(self, namespace: str) -> str:
        return f"{self._ns(namespace)}:serving"

    def decisions(self, namespace: str) -> str:
        return f"{self._ns(namespace)}:decisions"

    def validation(self, namespace: str) -> str:
        """The namespace's own validation set for the gate (JSON lines; absent: the worker's default)."""
        return f"{self._ns(namespace)}:validation"

    def holdout(self, namespace: str) -> str:
        """The namespace's held-out traces, as gate validation tasks (a hash: trace id -> task JSON)."""
        return f"{self._ns(namespace)}:holdout"

    def quarantine(self, namespace: str) -> str:
        return f"{self._ns(namespace)}:quarantine"

    def quarantine_resolved(self, namespace: str) -> str:
        return f"{self._ns(namespace)}:quarantine:resolved"

    def pending(self, namespace: str) -> str:
        return f"{self._ns(namespace)}:pending"

    def audit(self, namespace: str) -> str:
        return f"{self._ns(namespace)}:audit"

    @property
    def namespaces(self) -> str:
        return f"{self.prefix}:namespaces"

    @property
    def seen(self) -> str:
        return f"{self.prefix}:seen"

    @property
    def forget(self) -> str:
        return f"{self.prefix}:forget"

    @property
    def health(self) -> str:
        return f"{self.prefix}:health"
