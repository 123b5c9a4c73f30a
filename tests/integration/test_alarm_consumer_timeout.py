"""A resource alarm longer than the broker's consumer timeout, on a worker whose failed job's copy it holds.

The node is a dedicated 3.10 node (:mod:`tests.integration.own_node`) with ``consumer_timeout = 5000``
(3.10 takes it only from the node config): the alarm is node-wide and the timeout too.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqpjobs import JobContext, Worker, WorkerOptions
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.integration.helpers import depth, wait_until
from tests.integration.own_node import own_node
from tests.integration.test_backpressure import AlarmNode, make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


@pytest.fixture(scope="module")
def timeout_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AlarmNode]:
    conf = "consumer_timeout = 5000\ncollect_statistics_interval = 500\n"
    with own_node(tmp_path_factory.mktemp("ctimeout"), "ctimeout", conf) as node:
        yield AlarmNode(node, broker_settings(f"amqp://guest:guest@127.0.0.1:{node.port}/"))


@pytest.fixture
def on_timeout_node(timeout_node: AlarmNode, request: pytest.FixtureRequest) -> Iterator[BrokerSettings]:
    vhost = f"t-{request.node.name[:40]}-{uuid.uuid4().hex[:6]}"
    with ManagementClient(timeout_node.settings) as mgmt:
        mgmt.create_vhost(vhost)
        try:
            yield timeout_node.settings.with_vhost(vhost)
        finally:
            timeout_node.memory_alarm(False)
            mgmt.delete_vhost(vhost)


@pytest.mark.serial  # alarms the dedicated node; waits out the consumer timeout
@pytest.mark.timeout(240)
async def test_an_alarm_longer_than_the_consumer_timeout_gives_a_failed_job_a_second_life_and_the_worker_says_so(
    timeout_node: AlarmNode, on_timeout_node: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The window README "When a job crashes, hangs or stalls its worker" states, as measured (helper-181):
    the retry copy of a failed attempt is held by the alarm; the consumer timeout (5 s, checked on 3.10's 60 s
    channel tick) closes the channel; the job is redelivered and, once the alarm clears, runs again from
    attempt 1 while the held copy is stored too: attempts 1 (during), then 1, 2, 2. The worker says so."""
    app = await make_app(on_timeout_node, tmp_path)
    runs: list[tuple[int, float]] = []

    @app.job("fails-first", queue="work")
    async def fails_first(payload: dict[str, object], ctx: JobContext) -> None:
        runs.append((ctx.attempt, time.monotonic()))
        if ctx.attempt == 1:
            raise RuntimeError("the first attempt fails: its retry copy is published during the alarm")

    await app.enqueue("fails-first", {}, job_id="once")
    await app.close()
    timeout_node.memory_alarm(True)
    worker = Worker(app, on_timeout_node, WorkerOptions(queues=("work",), concurrency=1))
    await worker.start()
    try:
        await wait_until(lambda: len(runs) >= 1, 20, "the first run")
        await asyncio.sleep(75)  # 3.10 checks the timeout on its channel tick, every 60 s (channel_tick_interval)
        during = [a for a, _ in runs]
        timeout_node.memory_alarm(False)
        await wait_until(lambda: len(runs) >= 4, 60, "the redelivery and both retries after the alarm")
        await asyncio.sleep(4)  # a third copy would come back from the 1 s tier meanwhile
    finally:
        timeout_node.memory_alarm(False)
        await worker.shutdown()
    queues = {q: await depth(on_timeout_node, q) for q in ("work", "work.suspects", "work.retry.1s", "work.quarantine")}
    assert during == [1]  # the redelivery's start (registered first) waits for the alarm too
    assert [a for a, _ in runs] == [1, 1, 2, 2]  # two lives: the redelivery's, and the held retry copy's
    assert queues == {"work": 0, "work.suspects": 0, "work.retry.1s": 0, "work.quarantine": 0}  # nothing lost
    said = [r.getMessage() for r in caplog.records if "holds its RetryLater copy unread" in r.getMessage()]
    assert said == [
        "job once: its channel closed (the broker's consumer_timeout?) while a resource alarm (memory) holds its "
        "RetryLater copy unread: the broker redelivers the job now and stores the copy once the alarm clears, so the "
        "job runs again from this attempt and from the copy (two lives: an alarm longer than consumer_timeout; "
        'README "When a job crashes")'
    ], said
