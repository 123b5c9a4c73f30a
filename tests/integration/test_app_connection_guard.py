"""A worker's handlers enqueue on the app's own publishing connection (``<app>-publisher``): one rule with the
worker's other connections (runtime/hard_closes.py). Refused the same way at each reconnect (here a user's
max-channels reached, 530 at its channel.open), it stops the worker (exit 3 words) instead of failing every
handler's enqueue, every 5 s, while the worker goes on taking jobs."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest

from amqpjobs import App, JobContext, Worker, WorkerOptions
from amqpjobs.errors import BrokerError, ConfigurationError
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.integration.helpers import close_connections, limited_user

pytestmark = pytest.mark.broker

TOPOLOGY = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "work"
exchange = "jobs"

[[job_queue]]
name = "next"
exchange = "jobs"
"""


async def test_the_apps_connection_refused_at_each_reconnect_stops_the_worker_as_its_own_do(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """Before: the worker ran on 15 s after the app's connection was cut, its reconnect refused every 5 s
    ('connection chain-publisher lost ... NOT_ALLOWED - number of channels opened for user ...'), never stopped."""
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, broker)
    with limited_user(broker) as (user, url):
        app = App(f"chain-{uuid.uuid4().hex[:6]}", topology=load_topology(path).topology, url=url)

        @app.job("chain", queue="work")
        async def chain(payload: dict[str, object], ctx: JobContext) -> None:
            await app.enqueue("leaf", {}, job_id=f"leaf-{ctx.job_id}")

        app.job("leaf", queue="next")(lambda p, c: None)
        worker = Worker(app, broker_settings(url), WorkerOptions(queues=("work",), concurrency=1))
        running = asyncio.create_task(worker.run())
        try:
            await app.enqueue("chain", {}, job_id="c1")  # the app's connection is open (and watched) from here
            with ManagementClient(broker) as mgmt:
                vhost = quote(broker.vhost, safe="")
                deadline = time.monotonic() + 20
                while len(mgmt.request("GET", f"/vhosts/{vhost}/channels") or []) < 5:  # 3 worker, events, app's 1
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.5)
                channels = len(mgmt.request("GET", f"/vhosts/{vhost}/channels") or [])
                mgmt.request("PUT", f"/user-limits/{user}/max-channels", {"value": channels - 1})
            while not await asyncio.to_thread(close_connections, broker, f"{app.name}-publisher"):
                await asyncio.sleep(0.5)  # its reconnect's channel is one too many: refused at each
            cut = time.monotonic()
            done, _ = await asyncio.wait([running], timeout=15)
            assert done, "the worker still runs 15 s after the app's connection was cut, refused at each reconnect"
            with pytest.raises(BrokerError) as stopped:
                await running
            assert time.monotonic() - cut < 15
            text = str(stopped.value)
            assert text.startswith("the broker closed a connection of this worker for what it sent (NOT_ALLOWED"), text
            assert "so the worker stopped" in text, text
            named = f"({re.escape(user)}|USER)"  # 4.0.5's words name the node, not the user: the fix says USER
            assert re.search(rf"rabbitmqctl set_user_limits {named} ", text), text
        finally:
            if not running.done():
                worker.request_stop()
                await asyncio.wait([running], timeout=30)
            await app.close()


def _connection_names(broker: BrokerSettings) -> list[str]:
    with ManagementClient(broker) as mgmt:
        found = mgmt.request("GET", f"/vhosts/{quote(broker.vhost, safe='')}/connections") or []
    return sorted(c.get("client_properties", {}).get("connection_name", "?") for c in found)


async def test_a_second_start_of_a_worker_opens_and_watches_nothing_more_and_after_a_stop_it_is_refused(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """Before: a second ``start()`` opened a second set of connections and consumers, and registered the
    app's connection watcher again (2 watchers: a refusal of the app's reconnect was counted twice)."""
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, broker)
    app = App(f"twice-{uuid.uuid4().hex[:6]}", topology=load_topology(path).topology, url=broker.url)
    app.job("leaf", queue="next")(lambda p, c: None)
    worker = Worker(app, broker, WorkerOptions(queues=("next",), concurrency=1))
    try:
        await asyncio.gather(worker.start(), worker.start())  # one under way when the other begins
        await app.enqueue("leaf", {}, job_id="l1")  # the app's connection open (and watched)
        deadline = time.monotonic() + 15
        while len(names := await asyncio.to_thread(_connection_names, broker)) < 4:
            assert time.monotonic() < deadline, names
            await asyncio.sleep(0.5)
        await worker.start()  # once ready: returns at once
        await asyncio.sleep(2.0)  # what a start would open is open by now
        assert await asyncio.to_thread(_connection_names, broker) == names
        assert [n.removeprefix(app.name) for n in names] == [
            "-publisher", "-worker", "-worker-events", "-worker-publisher"
        ]  # fmt: skip
        assert len(app._watchers) == 1
    finally:
        await worker.shutdown()
        await app.close()
    with pytest.raises(ConfigurationError, match=r"a Worker starts once; create a new Worker\("):
        await worker.start()
