"""``shard_routing = "modulus-hash"``: its declarations, publish target and refusals (no broker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from amqpjobs.errors import ConfigurationError, TopologyValidationError
from amqpjobs.runtime.broker_rules import check_layouts
from amqpjobs.topology.loader import load_topology

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "tenants"
exchange = "jobs"
shards = 4
shard_routing = "modulus-hash"
retry_tiers = ["1s"]
"""


def write(tmp_path: Path, text: str = TOPOLOGY) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(text)
    return path


def test_declares_an_x_modulus_hash_exchange_bound_to_every_shard(tmp_path: Path) -> None:
    topology = load_topology(write(tmp_path), broker_version=(4, 3, 6)).topology
    decl = topology.declarations()
    assert [(e.name, e.type) for e in decl.exchanges if e.name == "tenants.shards"] == [
        ("tenants.shards", "x-modulus-hash")
    ]
    assert sorted((b.destination, b.routing_key) for b in decl.bindings if b.source == "tenants.shards") == [
        (f"tenants.shard-{i}", "") for i in range(4)
    ]
    # the shards keep their own routing keys on the job exchange (retries, replays and crc32 publishers)
    assert sorted(b.routing_key for b in decl.bindings if b.source == "jobs") == [
        f"tenants.shard-{i}" for i in range(4)
    ]
    layout = topology.layout("tenants")
    assert layout.publish_target("acme") == ("tenants.shards", "acme")
    check_layouts([layout], (4, 3, 6))


def test_crc32_stays_the_default(tmp_path: Path) -> None:
    layout = load_topology(write(tmp_path, TOPOLOGY.replace('shard_routing = "modulus-hash"\n', ""))).topology.layout(
        "tenants"
    )
    assert layout.shards_exchange is None
    assert layout.publish_target("acme") == ("jobs", layout.routing_key_for("acme"))


@pytest.mark.parametrize("version", [(3, 10, 8), (4, 0, 5), (4, 2, 1)])
def test_refused_before_4_3_with_the_fix(tmp_path: Path, version: tuple[int, ...]) -> None:
    with pytest.raises(TopologyValidationError) as info:
        load_topology(write(tmp_path), broker_version=version)
    message = str(info.value)
    assert "job_queue[0].shard_routing" in message
    assert "needs the x-modulus-hash exchange of RabbitMQ 4.3+ (connected: " + ".".join(map(str, version)) in message
    assert "upgrade the broker to RabbitMQ 4.3+, or remove shard_routing" in message
    layout = load_topology(write(tmp_path)).topology.layout("tenants")  # no version: loads, with a warning
    with pytest.raises(ConfigurationError, match=r"job queue\(s\) tenants: shard_routing modulus-hash needs"):
        check_layouts([layout], version)


def test_without_shards_it_is_a_problem(tmp_path: Path) -> None:
    with pytest.raises(TopologyValidationError, match="shard_routing applies to sharded job queues only"):
        load_topology(write(tmp_path, TOPOLOGY.replace("shards = 4", "shards = 1")), broker_version=(4, 3, 6))


@pytest.mark.parametrize("bound", ["max_depth = 100", 'max_age = "30s"'])
def test_enqueue_bounds_are_refused_with_modulus_hash(tmp_path: Path, bound: str) -> None:
    # enqueue checks the work queue a job lands in; with modulus-hash the broker picks it after the publish
    text = TOPOLOGY.replace('retry_tiers = ["1s"]', f'retry_tiers = ["1s"]\n{bound}')
    with pytest.raises(TopologyValidationError) as info:
        load_topology(write(tmp_path, text), broker_version=(4, 3, 6))
    message = str(info.value)
    assert "max_depth/max_age can't be checked with modulus-hash" in message
    assert "use shard_routing crc32, or bound the shards with max_length" in message
