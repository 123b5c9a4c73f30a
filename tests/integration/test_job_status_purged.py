"""A purged job reads ``purged`` in its results store (SQLite and PostgreSQL), against the real broker.

Before, a purge recorded nothing: ``job show`` of a parked job purged from the parked queue read
``parked`` for ever, while saying it was in neither the quarantine nor the parked queue.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import JobContext, Reject
from amqpjobs.jobs.quarantine import Selection
from amqpjobs.runtime.parking import park, purge_matching
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, depth
from tests.integration.test_job_status import app_module, states, store_for, store_url  # noqa: F401 (fixture)
from tests.integration.worker_env import make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


async def test_a_purged_job_reads_purged_and_where_it_was_purged_from(
    broker: BrokerSettings,
    tmp_path: Path,
    store_url: str,  # noqa: F811 (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
):
    app = await make_app(broker, tmp_path)
    app.results = store_for(store_url)
    ref = app_module(tmp_path, store_url, monkeypatch)

    @app.job("mail", queue="work")
    def mail(payload: dict[str, Any], ctx: JobContext) -> str:
        raise Reject("no address")

    for job_id in ("m-1", "m-2", "m-3"):
        await app.enqueue("mail", {}, job_id=job_id)
    async with running_worker(app, broker) as (_, recorder):
        await recorder.wait_for(lambda o: len(o) == 3, 20)
    assert (await park(broker, "work.quarantine", results=app.results)).taken == 3
    # the CLI's purge with --app (an app with a results store and no payload store), every message
    got = await asyncio.to_thread(cli, broker, "quarantine", "purge", "work.parked", "--job", "mail", "--yes",
                                  "--app", ref)  # fmt: skip
    assert got.exit_code == 0, got.output
    assert "purged 3 message(s) from work.parked; 0 left" in got.stdout, got.output
    status = await app.job_status("m-1")
    assert [s for s, _ in states(status.history)] == ["queued", "running", "quarantined", "parked", "purged"]
    assert (status.state, status.terminal, status.current and status.current.where) == ("purged", True, "work.parked")
    assert status.current is not None
    assert (status.current.detail, status.current.error) == ("rejected", "amqpjobs.jobs.outcome.Reject: no address")
    shown = await asyncio.to_thread(cli, broker, "job", "show", "m-1", "--app", ref)
    assert shown.exit_code == 0, shown.output
    assert "job m-1: purged" in shown.stdout, shown.stdout
    assert "now: nowhere: deleted by a purge of work.parked at " in shown.stdout, shown.stdout
    assert await depth(broker, "work.parked") == 0
    await app.close()


async def test_a_filtered_purge_records_only_what_it_deleted(
    broker: BrokerSettings,
    tmp_path: Path,
    store_url: str,  # noqa: F811 (the fixture imported above)
):
    app = await make_app(broker, tmp_path)
    app.results = store_for(store_url)

    @app.job("mail", queue="work")
    def mail(payload: dict[str, Any], ctx: JobContext) -> str:
        raise Reject("no address")

    @app.job("sms", queue="work")
    def sms(payload: dict[str, Any], ctx: JobContext) -> str:
        raise Reject("no number")

    await app.enqueue("mail", {}, job_id="r-1")
    await app.enqueue("sms", {}, job_id="v-1")
    async with running_worker(app, broker) as (_, recorder):
        await recorder.wait_for(lambda o: len(o) == 2, 30)
    report = await purge_matching(broker, "work.quarantine", Selection(job="mail"), results=app.results)
    assert report.taken == 1
    assert (await app.job_status("r-1")).state == "purged"
    assert (await app.job_status("v-1")).state == "quarantined"  # left in place, its record too
    assert await depth(broker, "work.quarantine") == 1
    await app.close()
