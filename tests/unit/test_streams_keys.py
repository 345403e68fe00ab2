"""Redis key names: exact spelling, one hash tag per namespace, and what the publish script assumes of them."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from combee.errors import InvalidNamespace
from streams.keys import RedisKeys
from streams.redis_store import RedisPromptStore


def test_key_names_are_spelled_as_documented() -> None:
    keys = RedisKeys()
    assert keys.current("support") == "combee:{support}:current"
    assert keys.version("support", 42) == "combee:{support}:v:42"
    assert keys.history("support") == "combee:{support}:history"
    assert keys.updates("support") == "combee:{support}:updates"
    assert keys.status("support") == "combee:{support}:status"
    assert keys.namespaces == "combee:namespaces"
    assert keys.seen == "combee:seen"
    assert keys.health == "combee:health"


def test_prefix_is_applied_everywhere() -> None:
    keys = RedisKeys(prefix="t-1234")
    names = [keys.current("a"), keys.version("a", 1), keys.history("a"), keys.updates("a"), keys.status("a")]
    assert all(n.startswith("t-1234:{a}:") for n in names)
    assert keys.namespaces == "t-1234:namespaces"
    assert (keys.seen, keys.health) == ("t-1234:seen", "t-1234:health")


@pytest.mark.parametrize("namespace", ["a", "support.v2", "team_x-1", "A" * 64])
def test_every_key_of_a_namespace_shares_one_cluster_slot(namespace: str) -> None:
    # The publish script touches current, the per-version hash, history (and derives old per-version keys):
    # on Redis Cluster they must all hash to one slot, which the {namespace} hash tag guarantees.
    keys = RedisKeys()
    slots = {
        key_slot(k.encode())
        for k in (
            keys.current(namespace),
            keys.version(namespace, 0),
            keys.version(namespace, 10**15),
            keys.history(namespace),
            keys.updates(namespace),
            keys.status(namespace),
        )
    }
    assert slots == {key_slot(namespace.encode())}


def test_different_namespaces_do_not_share_keys() -> None:
    keys = RedisKeys()
    assert keys.current("a") != keys.current("b")
    assert not keys.current("ab").startswith(keys.current("a").rsplit(":", 1)[0] + ":")


@pytest.mark.parametrize("bad", ["", "a:b", "a b", "{a}", "a*", "a/b", "-a", "x" * 65, "é"])
def test_unsafe_namespaces_are_refused_before_building_a_key(bad: str) -> None:
    keys = RedisKeys()
    with pytest.raises(InvalidNamespace):
        keys.current(bad)
    with pytest.raises(InvalidNamespace):
        keys.version(bad, 1)


def test_per_version_keys_end_in_the_number_as_the_publish_script_assumes() -> None:
    # The script deletes trimmed versions' hashes as <prefix> .. N; the store derives <prefix> from key 0.
    keys = RedisKeys(prefix="p")
    store = RedisPromptStore(object(), keys)  # type: ignore[arg-type]  # no Redis call is made
    prefix = store._version_key_prefix("ns")
    assert [prefix + str(n) for n in (0, 7, 123456789)] == [keys.version("ns", n) for n in (0, 7, 123456789)]


def test_store_refuses_history_limit_below_one() -> None:
    with pytest.raises(ValueError, match="history_limit"):
        RedisPromptStore(object(), RedisKeys(), history_limit=0)  # type: ignore[arg-type]
