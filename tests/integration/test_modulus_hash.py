"""``shard_routing = "modulus-hash"`` on a real broker: the broker picks the shard on 4.3, refused with the fix before.

RabbitMQ 4.3.0 release notes and docs "Modulus Hash Exchange": x-modulus-hash is in core; it
routes by a hash of the routing key mod the number of bound queues, the same key always to
the same queue while the bindings stay. Figures against our crc32 routing: bench/RESULTS.md.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from urllib.parse import quote

import pytest

from amqpjobs import App, Worker, WorkerOptions
from amqpjobs.errors import PublishError
from amqpjobs.printable import shell_quote
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.conftest import BrokerRoot
from tests.integration.helpers import cli_subprocess, depth, raw_channel
from tests.integration.worker_env import Recorder

pytestmark = pytest.mark.broker

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


async def test_the_broker_picks_each_tenants_shard_on_43_refused_with_the_fix_before(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    if broker_root.version < (4, 3):
        result = cli_subprocess(broker, "topology", "apply", str(path))
        assert result.returncode == 2, result.stderr
        assert "shard_routing modulus-hash needs the x-modulus-hash exchange of RabbitMQ 4.3+" in result.stderr
        assert "upgrade the broker to RabbitMQ 4.3+, or remove shard_routing" in result.stderr
        with ManagementClient(broker) as mgmt:
            assert [q["name"] for q in mgmt.queues(broker.vhost)] == []  # nothing declared
        return
    await apply_topology(path, broker)
    with ManagementClient(broker) as mgmt:
        (exchange,) = [e for e in mgmt.exchanges(broker.vhost) if e["name"] == "tenants.shards"]
    assert exchange["type"] == "x-modulus-hash"
    app = App("mh", topology=load_topology(path).topology, url=broker.url)
    app.job("sync", queue="tenants")(lambda p, c: None)
    tenants = [f"tenant-{i}" for i in range(12)]
    shards_of: dict[str, set[int]] = defaultdict(set)
    before = [0] * 4
    for tenant in tenants:  # one tenant at a time: the shard(s) whose depth grew took its 3 jobs
        for round_ in range(3):
            await app.enqueue("sync", {}, tenant=tenant, job_id=f"{tenant}-{round_}")
        after = [await depth(broker, f"tenants.shard-{shard}") for shard in range(4)]
        shards_of[tenant] = {shard for shard in range(4) if after[shard] != before[shard]}
        assert sum(after) - sum(before) == 3
        before = after
    assert sorted(shards_of) == sorted(tenants)
    assert all(len(shards) == 1 for shards in shards_of.values()), shards_of  # stable: one shard per tenant
    assert len(set().union(*shards_of.values())) >= 2, shards_of  # spread: 12 tenants never all on one of 4
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=("tenants",), concurrency=2), recorder)
    await worker.start()
    try:
        await recorder.wait_for(lambda o: len(o) >= 36)
    finally:
        await worker.shutdown()
        await app.close()
    assert sorted(o.job_id for o in recorder.outcomes) == sorted(f"{t}-{r}" for t in tenants for r in range(3))


async def test_lowering_shards_unbinds_the_orphaned_shards_from_the_exchange_and_plan_says_so(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    if broker_root.version < (4, 3):
        pytest.skip("x-modulus-hash is in core from RabbitMQ 4.3")
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, broker)
    path.write_text(TOPOLOGY.replace("shards = 4", "shards = 2"))
    plan = cli_subprocess(broker, "topology", "plan", str(path))
    assert plan.returncode == 0, plan.stdout + plan.stderr  # no messages stranded yet: a change, not a problem
    for shard in (2, 3):
        assert f"remove    binding  tenants.shards -> tenants.shard-{shard} []" in plan.stdout, plan.stdout
        assert (
            f"ORPHAN    queue    tenants.shard-{shard} (0 message(s)): no longer in the topology and no worker "
            "consumes it; it is empty: delete it" in plan.stdout
        ), plan.stdout
    assert "0 to create, 2 binding(s) to remove, " in plan.stdout, plan.stdout
    applied = cli_subprocess(broker, "topology", "apply", str(path))
    assert applied.returncode == 0, applied.stderr
    assert "removed   binding  tenants.shards -> tenants.shard-3 []" in applied.stdout, applied.stdout
    assert ": 0 created, 2 binding(s) removed, " in applied.stdout, applied.stdout
    with ManagementClient(broker) as mgmt:
        bound = sorted(b["destination"] for b in mgmt.bindings(broker.vhost) if b["source"] == "tenants.shards")
    assert bound == ["tenants.shard-0", "tenants.shard-1"]
    app = App("mh", topology=load_topology(path).topology, url=broker.url)
    app.job("sync", queue="tenants")(lambda p, c: None)
    try:
        for i in range(8):
            await app.enqueue("sync", {}, tenant=f"tenant-{i}", job_id=f"j{i}")
    finally:
        await app.close()
    live = [await depth(broker, f"tenants.shard-{shard}") for shard in range(4)]
    assert live[2:] == [0, 0], live  # every job where a worker reads
    assert sum(live) == 8, live
    again = cli_subprocess(broker, "topology", "plan", str(path))
    assert "remove    binding" not in again.stdout, again.stdout


async def test_switching_shard_routing_warns_about_moved_tenants_and_lists_the_left_shards_exchange(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    if broker_root.version < (4, 3):
        pytest.skip("x-modulus-hash is in core from RabbitMQ 4.3")
    modulus = tmp_path / "modulus.toml"
    modulus.write_text(TOPOLOGY)
    crc32 = tmp_path / "crc32.toml"
    crc32.write_text(TOPOLOGY.replace('shard_routing = "modulus-hash"\n', ""))
    await apply_topology(crc32, broker)
    to_modulus = cli_subprocess(broker, "topology", "plan", str(modulus))
    assert to_modulus.returncode == 0, to_modulus.stderr
    assert "warning: tenants: shard_routing changes from crc32 to modulus-hash" in to_modulus.stderr
    assert "most tenants move to another shard" in to_modulus.stderr
    await apply_topology(modulus, broker)
    again = cli_subprocess(broker, "topology", "plan", str(modulus))
    assert "shard_routing changes" not in again.stderr, again.stderr  # applied: nothing to warn about
    to_crc32 = cli_subprocess(broker, "topology", "plan", str(crc32))
    assert "ORPHAN    exchange tenants.shards (4 binding(s)): shard_routing is no longer modulus-hash" in (
        to_crc32.stdout
    ), to_crc32.stdout
    # the printed command works as printed (the vhost url-encoded; USER is the operator's)
    url = f"{broker.management_url}/api/exchanges/{quote(broker.vhost, safe='')}/tenants.shards"
    command = f"curl -u USER -X DELETE {shell_quote(url)}"
    assert f"then delete it: {command}" in to_crc32.stdout, to_crc32.stdout
    with ManagementClient(broker) as mgmt:
        mgmt.request("DELETE", f"/exchanges/{quote(broker.vhost, safe='')}/tenants.shards")
        assert "tenants.shards" not in {e["name"] for e in mgmt.exchanges(broker.vhost)}


SCRIPT = """
import asyncio, sys
from amqpjobs import App
from amqpjobs.errors import PublishError
from amqpjobs.topology.loader import load_topology

async def main() -> None:
    app = App("mh", topology=load_topology(sys.argv[1]).topology, url=sys.argv[2])
    app.job("sync", queue="tenants")(lambda p, c: None)
    try:
        await app.enqueue("sync", {}, tenant="t1")
    except PublishError as exc:
        print(f"PublishError: {exc}")  # the app is not closed: what a short script often does

asyncio.run(main())
"""


@pytest.mark.version_independent
def test_enqueue_to_modulus_hash_before_43_names_the_43_requirement_without_shutdown_noise(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    if broker_root.version >= (4, 3):
        pytest.skip("before RabbitMQ 4.3 only: there the exchange type does not exist")
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    script = tmp_path / "enqueue.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(path), broker.url], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "exchange 'tenants.shards' does not exist" in done.stdout, done.stdout
    assert "shard_routing modulus-hash needs the x-modulus-hash exchange of RabbitMQ 4.3+" in done.stdout
    assert "upgrade the broker to RabbitMQ 4.3+, or remove shard_routing" in done.stdout
    assert "apply the topology" not in done.stdout  # apply refuses modulus-hash before 4.3: no dead end
    assert "unhandled exception" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.version_independent
async def test_a_missing_exchange_merely_named_like_shards_is_told_to_apply_not_to_upgrade(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    if broker_root.version >= (4, 3):
        pytest.skip("before RabbitMQ 4.3 only: there the upgrade advice would be given")
    path = tmp_path / "t.toml"
    path.write_text(
        '[[exchange]]\nname = "orders.shards"\n\n[[job_queue]]\nname = "orders"\nexchange = "orders.shards"\n'
    )
    app = App("plain", topology=load_topology(path).topology, url=broker.url)
    app.job("sync", queue="orders")(lambda p, c: None)
    try:
        with pytest.raises(PublishError) as raised:  # not applied: a user's exchange, no modulus-hash anywhere
            await app.enqueue("sync", {})
    finally:
        await app.close()
    assert str(raised.value) == "exchange 'orders.shards' does not exist: apply the topology (amqpjobs topology apply)"


async def test_switching_to_modulus_hash_warns_also_when_a_left_shards_exchange_routes_nothing(
    broker: BrokerSettings, broker_root: BrokerRoot, tmp_path: Path
):
    if broker_root.version < (4, 3):
        pytest.skip("x-modulus-hash is in core from RabbitMQ 4.3")
    modulus = tmp_path / "modulus.toml"
    modulus.write_text(TOPOLOGY)
    crc32 = tmp_path / "crc32.toml"
    crc32.write_text(TOPOLOGY.replace('shard_routing = "modulus-hash"\n', ""))
    await apply_topology(crc32, broker)
    async with raw_channel(broker) as ch:  # left from an earlier modulus-hash time, its bindings gone
        await ch.declare_exchange("tenants.shards", "x-modulus-hash", durable=True)
    plan = cli_subprocess(broker, "topology", "plan", str(modulus))
    assert plan.returncode == 0, plan.stderr
    assert "create    binding  tenants.shards -> tenants.shard-0" in plan.stdout, plan.stdout
    assert "warning: tenants: shard_routing changes from crc32 to modulus-hash" in plan.stderr, plan.stderr
    await apply_topology(modulus, broker)
    again = cli_subprocess(broker, "topology", "plan", str(modulus))
    assert "shard_routing changes" not in again.stderr, again.stderr  # routing by it now: nothing to warn about
