"""The app's ledger marker on the project's 3-node 3.10 cluster (scripts/cluster.sh) with a node down.

On 3.10 a classic queue whose node is down reads as missing (``NOT_FOUND - home node
'amqpjobs-c2@localhost' of durable queue ... is down or inaccessible``): before, a worker that
found its ledger new then took the lost ledger for the app's first one, and ran the done job again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs import App, ConfigurationError, JobContext
from amqpjobs.errors import BrokerError
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.runtime.worker import Worker, WorkerOptions
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.integration.test_chaos import QUORUM, cluster  # noqa: F401  (the cluster fixture)
from tests.integration.test_failover import start_node, stop_node, vhost_on  # noqa: F401
from tests.integration.worker_env import Recorder

pytestmark = [
    pytest.mark.broker,
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.version_independent,
    pytest.mark.xdist_group("cluster"),
    pytest.mark.timeout(300),
]


@pytest.fixture
def on_node1(vhost_on: BrokerSettings) -> BrokerSettings:  # noqa: F811
    """The test vhost through node 1 only (node 2 is the one stopped)."""
    return broker_settings(vhost_on.nodes[0].split("?")[0])


async def applied(broker: BrokerSettings, tmp_path: Path) -> Path:
    path = tmp_path / "q.toml"
    path.write_text(QUORUM)
    await apply_topology(path, broker)
    return path


def app_of(broker: BrokerSettings, path: Path, runs: list[str]) -> App:
    topology = load_topology(path.with_name("q.toml")).topology
    app = App("idem", topology=topology, url=broker.url, ledger=SqliteLedger(path))

    @app.job("charge", queue="money", idempotent=True, lease=60)
    def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)

    return app


async def refused_start(broker: BrokerSettings, path: Path) -> BaseException:
    app = app_of(broker, path, [])
    worker = Worker(app, broker, WorkerOptions(queues=("money",), grace=5), Recorder())
    try:
        with pytest.raises((ConfigurationError, BrokerError)) as refused:
            await worker.start()
    finally:
        await worker.shutdown()
        await app.close()
    return refused.value


async def test_a_lost_ledger_found_while_the_markers_node_is_down_is_refused(
    vhost_on: BrokerSettings,  # noqa: F811
    on_node1: BrokerSettings,
    tmp_path: Path,
) -> None:
    """A marker of an earlier amqpjobs (classic) on node 2, node 2 down: the start can't tell, so it is refused.

    Before: the worker started (``created a new SQLite ledger ...``), the ledger confirmed for good.
    """
    await applied(on_node1, tmp_path)
    node2 = vhost_on.nodes[1].split("?")[0]
    connection = await aio_pika.connect(node2)
    channel = await connection.channel()
    await channel.declare_queue("amqpjobs.ledger.idem", durable=True,
                                arguments={"x-queue-type": "classic", "x-max-length": 0})  # fmt: skip
    await connection.close()
    await stop_node(2)
    try:
        said = str(await refused_start(on_node1, tmp_path / "ledger.db"))
    finally:
        await start_node(2)
    assert "amqpjobs.ledger.idem" in said, said
    assert "is down or inaccessible" in said, said
    assert "Start again once the broker answers for queue amqpjobs.ledger.idem" in said, said


async def test_a_marker_declared_now_survives_its_nodes_loss(
    vhost_on: BrokerSettings,  # noqa: F811
    on_node1: BrokerSettings,
    tmp_path: Path,
) -> None:
    """The app's first worker on node 2 declares the marker; node 2 down, a lost ledger is still refused."""
    await applied(on_node1, tmp_path)
    node2 = broker_settings(vhost_on.nodes[1].split("?")[0])
    first = app_of(node2, tmp_path / "first.db", [])
    worker = Worker(first, node2, WorkerOptions(queues=("money",), grace=5), Recorder())
    await worker.start()
    await worker.shutdown()
    await first.close()
    await stop_node(2)
    try:
        said = str(await asyncio.wait_for(refused_start(on_node1, tmp_path / "lost.db"), 60))
    finally:
        await start_node(2)
    assert "app 'idem' had a ledger before" in said, said


CLASSIC = """
[[exchange]]
name = "jobs"
type = "direct"

[[job_queue]]
name = "work"
exchange = "jobs"
retry_tiers = ["1s"]
"""


async def test_an_apps_first_start_without_a_majority_marks_it_classic(
    vhost_on: BrokerSettings,  # noqa: F811
    on_node1: BrokerSettings,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nodes 2 and 3 down: a new quorum queue can't be made (3.10 waits 15 s, then closes the connection, 541
    ``cluster_not_formed``). A classic job queue still works, and so must the app's first start.

    Before (the marker quorum, declared on the worker's connection): the worker never became ready.
    """
    import logging

    caplog.set_level(logging.INFO)
    path = tmp_path / "c.toml"
    path.write_text(CLASSIC)
    await apply_topology(path, on_node1)
    app = App("idem", topology=load_topology(path).topology, url=on_node1.url, ledger=SqliteLedger(tmp_path / "l.db"))
    runs: list[str] = []

    @app.job("charge", queue="work", idempotent=True, lease=60)
    def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)

    await stop_node(3)
    await stop_node(2)
    worker = Worker(app, on_node1, WorkerOptions(queues=("work",), grace=5), Recorder())
    try:
        await asyncio.wait_for(worker.start(), 60)
        await app.enqueue("charge", {}, job_id="charge:1")
        for _ in range(100):
            if runs:
                break
            await asyncio.sleep(0.1)
    finally:
        await worker.shutdown()
        await app.close()
        await start_node(2)
        await start_node(3)
    assert runs == ["charge:1"]
    said = [r.getMessage() for r in caplog.records if "declared queue amqpjobs.ledger.idem classic" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "cluster_not_formed" in said[0], said[0]
