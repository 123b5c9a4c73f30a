"""No management API request blocks an event loop: async entry points make them in a thread.

The management client is synchronous (httpx). Called on an event loop's thread it stops
everything else on that loop for the request's round trip: a scheduler's look, a worker's
deliveries and heartbeats, the console's other pages. Was: ``apply_topology`` and
``plan_topology`` (its ``require_majority``, version, live state and bindings), ``collect``
(``amqpjobs status`` and every console page) and a worker's dropped-shards check at start.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import JobContext, Worker, WorkerOptions
from amqpjobs.runtime.deploy import apply_topology, plan_topology
from amqpjobs.runtime.status import collect, warn_dropped_shards
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import wait_until
from tests.integration.worker_env import APPLIED_TOPOLOGY, make_app

pytestmark = pytest.mark.version_independent


@pytest.fixture
def on_a_loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The management API requests made on a thread running an event loop: method, path and caller."""
    offenders: list[str] = []
    made: list[str] = []
    real = ManagementClient._send

    def send(self: ManagementClient, method: str, url: str, json: Any) -> Any:
        made.append(url)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # a thread without a loop: fine
        else:
            ours = [f"{f.filename.rsplit('/amqpjobs/', 1)[-1]}:{f.lineno} {f.name}" for f in traceback.extract_stack()
                    if "/amqpjobs/" in f.filename and "/wire/management.py" not in f.filename]  # fmt: skip
            offenders.append(f"{method} {url.rsplit('/', 1)[0]} on the event loop, from {' < '.join(reversed(ours))}")
        return real(self, method, url, json)

    monkeypatch.setattr(ManagementClient, "_send", send)
    yield offenders
    assert made, "no management API request was made: the test checked nothing"


async def test_topology_plan_and_apply_make_their_requests_off_the_loop(
    broker: BrokerSettings, tmp_path: Path, on_a_loop: list[str]
) -> None:
    path = tmp_path / "t.toml"
    path.write_text(APPLIED_TOPOLOGY)
    created = await apply_topology(path, broker)
    assert {i.desired.name for i in created.plan.creates} >= {"work", "work.quarantine"}  # it declared
    again = await plan_topology(path, broker)
    assert again.plan.creates == ()
    assert on_a_loop == []


async def test_status_and_a_worker_start_make_their_requests_off_the_loop(
    broker: BrokerSettings, tmp_path: Path, on_a_loop: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    app = await make_app(broker, tmp_path)
    on_a_loop.clear()  # make_app's apply is the other test's
    statuses = await collect(broker, list(load_topology(tmp_path / "applied.toml").topology.layouts()))
    assert [q.name for q in statuses[0].work] == ["work"]
    await warn_dropped_shards(broker, app.topology().layouts(), logging.getLogger("test"))
    ran: list[str] = []

    @app.job("noted", queue="work")
    async def noted(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    worker = Worker(app, broker, WorkerOptions(queues=("work",), concurrency=2, grace=5))
    await worker.start()
    try:
        job_id = await app.enqueue("noted", {})
        await wait_until(lambda: ran == [job_id], 15, "the job")
    finally:
        await worker.shutdown()
        await app.close()
    assert on_a_loop == []
