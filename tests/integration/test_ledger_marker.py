"""The app's ledger marker (``amqpjobs.ledger.<app>``) on the real broker: a queue like our others.

It never has a consumer, so a policy's ``expires`` deletes it: the app then forgets it had
a ledger, and a ledger lost later starts as a first one. And the app's name goes into it,
so a name the AMQP client can't send (over 255 bytes, letters it refuses) must be said in
our words, not as pamqp's bare ``ValueError``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import App, ConfigurationError, JobContext, Scheduler
from amqpjobs.runtime.ledger import SqliteLedger
from amqpjobs.runtime.worker import Worker, WorkerOptions
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli
from tests.integration.test_policy_effects import policy_shown, set_policy
from tests.integration.worker_env import Recorder, make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.timeout(90)]


def ledger_app(base: App, broker: BrokerSettings, name: str, path: Path) -> App:
    app = App(name, topology=base.topology(), url=broker.url, ledger=SqliteLedger(path))

    @app.job("charge", queue="work", idempotent=True, lease=60)
    def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        pass

    return app


async def test_a_policy_that_expires_the_ledger_marker_is_a_problem(broker: BrokerSettings, tmp_path: Path) -> None:
    """Before: ``status`` named nothing, and ``status --queues amqpjobs.ledger.shop`` took it for a job queue."""
    base = await make_app(broker, tmp_path)
    app = ledger_app(base, broker, "shop", tmp_path / "ledger.db")
    async with running_worker(app, broker):
        pass
    await app.close()
    set_policy(broker, "tidy", r"^amqpjobs\.", {"expires": 3600000})
    await policy_shown(broker, "amqpjobs.ledger.shop", "expires")
    result = await asyncio.to_thread(cli, broker, "status", str(tmp_path / "applied.toml"), "--json")
    problems = [p for jq in json.loads(result.stdout)["job_queues"] for p in jq["problems"]]
    (found,) = [p for p in problems if p.startswith("policy 'tidy' on amqpjobs.ledger.shop:")]
    assert "expires 1h: the broker deletes the queue" in found, found
    assert "the app's mark that it had a ledger goes with it" in found, found
    assert result.exit_code == 1


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("x" * 250, "is 266 bytes of UTF-8; AMQP allows at most 255"),
        ("caf\u00e9", "has characters the AMQP client refuses"),
    ],
    ids=["250 bytes", "unicode"],
)
async def test_an_app_name_that_cant_be_a_queue_name_is_said_at_the_ledger_check(
    broker: BrokerSettings, tmp_path: Path, name: str, words: str
) -> None:
    """Before: the worker's start raised pamqp's ``ValueError: Max length exceeded for queue`` (or ``Invalid ...``)."""
    base = await make_app(broker, tmp_path)
    app = ledger_app(base, broker, name, tmp_path / "ledger.db")
    worker = Worker(app, broker, WorkerOptions(queues=("work",), grace=5), Recorder())
    try:
        with pytest.raises(ConfigurationError) as refused:
            await worker.start()
    finally:
        await worker.shutdown()
        await app.close()
    said = str(refused.value)
    assert "goes into the name of its ledger marker" in said, said
    assert words in said, said


async def test_an_app_name_that_cant_be_in_the_schedulers_queue_names_is_said_at_its_start(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """The same rule for the scheduler's queues (``amqpjobs.scheduler.<app>.leader``, ``.ticks.<schedule>``).

    Before: ``ValueError: Max length exceeded for queue`` from pamqp at the leader queue's declare.
    """
    base = await make_app(broker, tmp_path)
    app = App("y" * 240, topology=base.topology(), url=broker.url)

    @app.cron("* * * * *", name="nightly")
    @app.job("report", queue="work")
    def report(payload: dict[str, Any], ctx: JobContext) -> None:
        pass

    scheduler = Scheduler(app, broker)
    try:
        with pytest.raises(ConfigurationError) as refused:
            await scheduler.start()
    finally:
        await scheduler.shutdown()
        await app.close()
    said = str(refused.value)
    assert "goes into the name of its scheduler's queues" in said, said
    assert "is 266 bytes of UTF-8; AMQP allows at most 255" in said, said
