"""A publisher that never sets ``message_id``: the worker says so once per queue (and idempotent job), not per job.

Before: "delivery without message_id on work: assigned job id generated-..." was logged for every
delivery, and "idempotent job ... without message_id: keyed ..." for every idempotent one, so a
foreign publisher that never sets it flooded the log (test_missing_message_id_said: 12 lines
for 12 jobs), where an unreadable header is said once per header and type (68056c1).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from amqpjobs import JobContext
from amqpjobs.runtime.app import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.runtime.results import SqliteResults
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth
from tests.integration.worker_env import running_worker
from tests.topologies import work_topology

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]  # the worker's own logging

TOPOLOGY = work_topology("other")
EACH = 4  # jobs of each kind, none with a message_id


@pytest.mark.timeout(60)
async def test_a_delivery_without_message_id_is_said_once_per_queue_and_idempotent_job(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "app.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, broker)
    app = App("app", topology=path, url=broker.url, ledger=SqliteLedger(str(tmp_path / "ledger.db")))
    ran: list[str] = []

    @app.job("note", queue="work")
    async def note(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    @app.job("charge", queue="work", idempotent=True)
    async def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    @app.job("elsewhere", queue="other")
    async def elsewhere(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    with ManagementClient(broker) as mgmt:  # as from its web UI: nothing fills in a message_id (aio-pika would)
        for job, queue in (("note", "work"), ("charge", "work"), ("elsewhere", "other")):
            for i in range(EACH):
                doc = {  # distinct bodies: an idempotent job without an id is keyed by its body
                    "properties": {"type": job, "content_type": "application/json"},
                    "routing_key": queue, "payload": f'{{"n": {i}}}', "payload_encoding": "string",
                }  # fmt: skip
                answer = mgmt.request("POST", f"/exchanges/{quote(broker.vhost, safe='')}/jobs/publish", json=doc)
                assert answer == {"routed": True}
    caplog.set_level(logging.WARNING, logger="amqpjobs.worker")
    try:
        async with running_worker(app, broker, queues=("work", "other")):
            for _ in range(200):
                if len(ran) == 3 * EACH:
                    break
                await asyncio.sleep(0.05)
    finally:
        await app.close()
    assert len(ran) == 3 * EACH
    assert len(set(ran)) == 3 * EACH  # every job its own id
    assert await depth(broker, "work") == 0
    assert await depth(broker, "other") == 0
    lines = sorted(r.getMessage() for r in caplog.records if "without message_id" in r.getMessage())
    assert len(lines) == 3, (lines, ran)  # work, other, and the idempotent job charge
    plain = [line for line in lines if line.startswith("delivery without message_id (absent, empty or blank) on ")]
    assert [line.split(" on ")[1].split(":")[0] for line in plain] == ["other", "work"], plain
    for line in plain:
        assert "set message_id (the job id) on every publish" in line, line
        assert "said once per queue; first: job id generated-" in line, line
    [keyed] = [line for line in lines if line.startswith("idempotent job ")]
    assert keyed.startswith("idempotent job charge without message_id on work: keyed "), keyed
    assert "said once per job; first: " in keyed, keyed


@pytest.mark.timeout(60)
async def test_a_blank_message_id_is_no_job_id_the_job_gets_one_its_retry_keeps_and_job_status_reads(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A foreign publisher's message_id " " (blank): a job id of its own, kept by its retry copy, said once.

    Before: the job ran as job id " ", which the results store recorded and ``job show``/``app.job_status``
    refuse (``job_id is empty or blank``): its record could never be read.
    """
    path = tmp_path / "app.toml"
    path.write_text(TOPOLOGY)
    await apply_topology(path, broker)
    app = App("app", topology=path, url=broker.url, results=SqliteResults(str(tmp_path / "results.db")))
    ran: list[tuple[str, int]] = []

    @app.job("flaky", queue="work")
    async def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append((ctx.job_id, ctx.attempt))
        if ctx.attempt == 1:
            raise ConnectionError("first run fails")

    with ManagementClient(broker) as mgmt:
        for blank in (" ", "\t \u3000"):
            doc = {"properties": {"type": "flaky", "content_type": "application/json", "message_id": blank},
                   "routing_key": "work", "payload": "{}", "payload_encoding": "string"}  # fmt: skip
            answer = mgmt.request("POST", f"/exchanges/{quote(broker.vhost, safe='')}/jobs/publish", json=doc)
            assert answer == {"routed": True}
    caplog.set_level(logging.WARNING, logger="amqpjobs.worker")
    try:
        async with running_worker(app, broker, queues=("work",)):
            for _ in range(200):
                if len(ran) == 4:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # the records' writer
        ids = sorted({job_id for job_id, _ in ran})
        states = [(await app.job_status(job_id)).state for job_id in ids]
    finally:
        await app.close()
    assert sorted(attempt for _, attempt in ran) == [1, 1, 2, 2], ran
    assert len(ids) == 2, ran  # before: [' ', '\t \u3000']
    assert all(i.startswith("generated-") for i in ids), ran
    assert states == ["succeeded", "succeeded"], states
    assert await depth(broker, "work") == 0
    lines = [r.getMessage() for r in caplog.records if "without message_id" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("delivery without message_id (absent, empty or blank) on work: "), lines
