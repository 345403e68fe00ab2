"""Promotion on the real services (docs/promotion.md): a worker whose default policy is manual keeps every new
version a candidate; an operator promotes one and rejects the next through signed control records; under a canary
only the agents of the arm are served the candidate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from combee.serving import in_canary_arm
from streams.client import PromptClient, PromptUnavailable
from streams.redis_promotion import SERVING_FIELDS, parse_serving
from tests.integration.pipeline import Pipeline, wait_until
from tests.integration.streams_support import kafka_bootstrap_or_skip, redis_url_or_skip

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(2400)]
NS = "ns-promo"
STARTUP_S = 300
LEARN_S = 900  # a loaded machine learns slowly; the services answer in time regardless


@pytest.fixture
def pipe(tmp_path: Path) -> Iterator[Pipeline]:
    """The conftest's pipeline, with a simulator given longer to start (this test learns on a loaded machine)."""
    p = Pipeline(kafka_bootstrap_or_skip(), redis_url_or_skip(), tmp_path)
    p.start_sim(STARTUP_S)
    try:
        yield p
    finally:
        p.close()


def served(pipe: Pipeline, agent_id: str | None = None) -> int | None:
    with PromptClient(pipe.redis_url, NS, key_prefix=pipe.prefix, max_age_s=0, agent_id=agent_id) as client:
        try:
            return client.get().version
        except PromptUnavailable:
            return None


def test_manual_promote_and_reject_then_a_canary_serves_only_its_arm(pipe: Pipeline) -> None:
    pipe.create_topics()
    pipe.start_worker(COMBEE_PROMOTION_POLICY="manual", COMBEE_ROLLBACK_ON_OUTCOMES="false")
    first, _ = pipe.traces(20, 8, NS)
    pipe.publish_traces(first)
    pipe.wait_learned({NS: 20}, timeout_s=LEARN_S)
    head = pipe.current_version(NS)
    assert head >= 1
    assert served(pipe) is None and served(pipe, "agent-1") is None  # nothing promoted: nothing served

    out = pipe.cli("prompt", "promote", NS, str(head), "--actor", "ana").stdout
    assert f"promote v{head} by operator:ana under manual" in out
    assert served(pipe) == head and served(pipe, "agent-1") == head

    more, _ = pipe.traces(10, 9, NS)
    pipe.publish_traces(more)
    pipe.wait_learned({NS: 30}, timeout_s=LEARN_S)
    candidate = pipe.current_version(NS)
    assert candidate > head
    assert {served(pipe, f"agent-{i}") for i in range(20)} == {head}  # the candidate reaches no agent
    history = pipe.cli("prompt", "history", NS).stdout
    assert f"policy manual: live v{head}, candidate v{candidate} pending" in history

    out = pipe.cli("prompt", "reject", NS, str(candidate), "--actor", "ana").stdout
    assert f"reject v{candidate} by operator:ana" in out
    wait_until(lambda: pipe.current_version(NS) == candidate + 1, 60, "the head returned to the live playbook")
    assert pipe.published_playbook(NS).bullets == pipe.published_playbook(NS, head).bullets
    state = parse_serving(pipe.redis().hmget(pipe.keys.serving(NS), SERVING_FIELDS))
    assert (state.live, state.rejected_through) == (head, candidate)
    restore = pipe.deltas(NS)[-1]
    assert restore.window_id == f"{NS}/reject/v{candidate}" and restore.rollback_to == head

    pipe.cli("prompt", "policy", NS, "canary", "--fraction", "0.3")
    restored = candidate + 1  # a candidate again (the live content under a new number): the canary serves it
    agents = [f"agent-{i}" for i in range(300)]
    got = {a: served(pipe, a) for a in agents}
    arm = {a for a in agents if in_canary_arm(NS, a, 0.3)}
    assert all(got[a] == restored for a in arm)
    assert all(got[a] == head for a in agents if a not in arm)  # outside the arm: never the candidate
    assert abs(len(arm) / len(agents) - 0.3) < 0.1
    decisions = pipe.cli("prompt", "history", NS).stdout
    assert "policy canary (fraction 0.3)" in decisions
