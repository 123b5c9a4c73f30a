"""Reconnects on any broker: the worker's connection is force-closed through the management API.

Restarting the node needs the project's local node; closing one connection works on every
broker the tests get (README "Tests": ``AMQP_URL``, testcontainers or the local node), and
only the connections of the test's own vhost are touched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from amqpjobs import JobContext, Worker, WorkerOptions
from amqpjobs.runtime.metrics import MetricsServer, WorkerMetrics
from amqpjobs.wire.consume import MISSING_FIX
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth
from tests.integration.worker_env import Recorder, make_app

pytestmark = pytest.mark.broker  # on every broker version: reconnects are what 4.3 changed most (consumer tags)


def fast_reconnect(broker: BrokerSettings) -> BrokerSettings:
    """The same vhost with aio-pika's reconnect interval at 0.3 s (default 5 s): the tests wait less."""
    return BrokerSettings(
        broker.url + "?reconnect_interval=0.3", broker.management_url, broker.username, broker.password, broker.vhost
    )


def connections(broker: BrokerSettings, name: str) -> list[dict[str, Any]]:
    """Connections of the test's vhost whose client-provided name is ``name``."""
    with ManagementClient(broker) as mgmt:
        found = mgmt.request("GET", f"/vhosts/{quote(broker.vhost, safe='')}/connections") or []
    return [c for c in found if (c.get("client_properties") or {}).get("connection_name") == name]


async def force_close(broker: BrokerSettings, name: str) -> int:
    """Close the connections named ``name`` on the test's vhost (waits until the broker lists one)."""
    deadline = time.monotonic() + 15
    while not (found := await asyncio.to_thread(connections, broker, name)):
        assert time.monotonic() < deadline, f"no connection named {name!r} on vhost {broker.vhost!r}"
        await asyncio.sleep(0.1)
    with ManagementClient(broker) as mgmt:
        for c in found:
            mgmt.request("DELETE", f"/connections/{quote(c['name'], safe='')}", allow_404=True)
    return len(found)


@asynccontextmanager
async def cut_off(broker: BrokerSettings, *names: str) -> AsyncIterator[None]:
    """Close the connections named ``names`` and keep them from coming back until the block ends.

    aio-pika reconnects within milliseconds; with the test vhost's connection limit at 0,
    every attempt is refused, so "reconnecting" lasts as long as the block (the management
    API and connections already open keep working).
    """
    path = f"/vhost-limits/{quote(broker.vhost, safe='')}/max-connections"
    with ManagementClient(broker) as mgmt:
        mgmt.request("PUT", path, json={"value": 0})
    try:
        for name in names:
            await force_close(broker, name)
        yield
    finally:
        with ManagementClient(broker) as mgmt:
            mgmt.request("DELETE", path, allow_404=True)


async def poll(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
    return value


@pytest.mark.serial  # a wall-clock bound (ready < 3 s after the cut): 4.1 s beside 3 other test processes on 4.3
async def test_readyz_503_while_reconnecting_then_consumes_again(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    settings = fast_reconnect(broker)
    app = await make_app(broker, tmp_path)
    ran: list[str] = []

    @app.job("note", queue="work")
    async def note(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    metrics = WorkerMetrics()
    recorder = Recorder()
    worker = Worker(app, settings, WorkerOptions(queues=("work",)), recorder, metrics=metrics)
    server = MetricsServer(metrics, worker.readiness, lambda: worker.heartbeat_at)
    server.start()
    base = f"http://127.0.0.1:{server.port}/readyz"

    async def readyz_becomes(code: int) -> str:
        deadline = time.monotonic() + 20
        while True:
            r = await asyncio.to_thread(httpx.get, base, timeout=5)
            if r.status_code == code:
                return r.text.strip()
            assert time.monotonic() < deadline, f"/readyz stayed {r.status_code} {r.text!r}"
            await asyncio.sleep(0.02)

    await worker.start()
    try:
        await app.enqueue("note", {}, job_id="before")
        await recorder.wait_for(lambda o: len(o) == 1, 10)
        assert await readyz_becomes(200) == "consuming work with 1 slot(s)"
        async with cut_off(broker, "test-worker"):
            assert await readyz_becomes(503) == "not connected to the broker (reconnecting)"
            await asyncio.sleep(1.5)  # aio-pika tries every 0.3 s, refused each time; the suspects look fails too
            r = await asyncio.to_thread(httpx.get, base)
            assert (r.status_code, r.text.strip()) == (503, "not connected to the broker (reconnecting)")
        back = time.monotonic()
        assert await readyz_becomes(200) == "consuming work with 1 slot(s)"
        assert time.monotonic() - back < 3  # ready once reconnected, not after the 5 s look for a missing queue
        ours = [r for r in caplog.records if r.name.startswith("amqpjobs.")]
        errors = [r.getMessage() for r in ours if r.levelno >= logging.ERROR]
        assert errors == []  # a connection loss is not a missing queue
        await app.enqueue("note", {}, job_id="after")  # consumed on the reopened channel
        await recorder.wait_for(lambda o: len(o) == 2, 15)
    finally:
        await worker.shutdown()
        server.stop()
        await app.close()
    assert ran == ["before", "after"]
    assert [(o.job_id, o.kind) for o in recorder.outcomes] == [("before", "succeeded"), ("after", "succeeded")]
    assert await depth(broker, "work") == 0


async def test_a_result_whose_channel_died_is_never_acked_on_the_new_channel(broker: BrokerSettings, tmp_path: Path):
    settings = fast_reconnect(broker)
    app = await make_app(broker, tmp_path)
    release = asyncio.Event()
    runs: list[tuple[str, bool]] = []

    @app.job("hold", queue="work")
    async def hold(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append((ctx.job_id, ctx.redelivered))
        if len(runs) == 1:
            await release.wait()

    recorder = Recorder()
    worker = Worker(app, settings, WorkerOptions(queues=("work",), concurrency=2), recorder)
    await worker.start()
    try:
        await app.enqueue("hold", {}, job_id="cut-off")
        await poll(lambda: runs, 10, "the first run to start")
        async with cut_off(broker, "test-worker"):
            await poll(lambda: not worker.readiness()[0], 10, "the worker to see its connection closed")
        await poll(lambda: worker.readiness()[0], 20, "the worker to consume again on a new channel")
        release.set()  # the run ends now: its delivery came on the old, dead channel
        # the broker redelivers it (it never got an ack): registered for its next start, then run alone
        await recorder.wait_for(lambda o: any(x.kind == "succeeded" for x in o), 30)
        assert worker.readiness() == (True, "consuming work with 2 slot(s)")  # no 406 "unknown delivery tag"
    finally:
        await worker.shutdown()
        await app.close()
    kinds = [(o.job_id, o.kind, o.acked) for o in recorder.outcomes]
    assert sorted(kinds[:2]) == [
        ("cut-off", "ack_uncertain", False),  # succeeded, but its channel is gone: no ack sent anywhere
        ("cut-off", "redelivered", True),  # the broker's redelivery, registered for its next start
    ], kinds
    assert kinds[2:] == [("cut-off", "succeeded", True)], kinds
    assert runs == [("cut-off", False), ("cut-off", True)]
    assert await depth(broker, "work") == 0
    assert await depth(broker, "work.suspects") == 0
    assert await depth(broker, "work.quarantine") == 0


async def test_a_work_queue_gone_during_the_outage_is_consumed_again_once_back(broker: BrokerSettings, tmp_path: Path):
    settings = fast_reconnect(broker)
    app = await make_app(broker, tmp_path)
    ran: list[str] = []

    @app.job("note", queue="work")
    async def note(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    recorder = Recorder()
    worker = Worker(app, settings, WorkerOptions(queues=("work",)), recorder)
    await worker.start()
    try:
        async with cut_off(broker, "test-worker"):
            await poll(lambda: not worker.readiness()[0], 10, "the worker to see its connection closed")
            with ManagementClient(broker) as mgmt:  # deleted while the worker is away
                mgmt.request("DELETE", f"/queues/{quote(broker.vhost, safe='')}/work")
        # reconnected, but there is nothing to consume: not ready, naming it and the fix; it keeps looking every second
        await poll(
            lambda: worker.readiness() == (False, f"work queue(s) work missing: {MISSING_FIX}"),
            20, "the worker to report its consumer down",
        )  # fmt: skip
        await make_app(broker, tmp_path)  # the topology applied again
        await poll(lambda: worker.readiness()[0], 10, "the worker to consume the queue again")
        await app.enqueue("note", {}, job_id="back")
        await recorder.wait_for(lambda o: len(o) == 1, 10)
    finally:
        await worker.shutdown()
        await app.close()
    assert ran == ["back"]
