"""The app's ledger marker (``amqpjobs.ledger.<app>``) on the real broker: a queue like our others.

It never has a consumer, so a policy's ``expires`` deletes it: the app then forgets it had
a ledger, and a ledger lost later starts as a first one. And the app's name goes into it,
so a name the AMQP client can't send (over 255 bytes, letters it refuses) must be said in
our words, not as pamqp's bare ``ValueError``.
"""

from __future__ import annotations

import asyncio
import contextlib
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
        ("caf\u00e9", "has characters the AMQP client refuses"),
    ],
    ids=["unicode"],  # a name its marker's 255 bytes can't take is refused by App() already (test_app_name)
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
    app = App("y" * 230, topology=base.topology(), url=broker.url)  # App() takes 233 bytes: its connections

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
    assert "is 256 bytes of UTF-8; AMQP allows at most 255" in said, said  # amqpjobs.scheduler.<230>.leader


def marker_shape(broker: BrokerSettings, name: str) -> tuple[str, dict[str, Any]] | None:
    """The marker's queue type and arguments as the management API says them (None: no such queue)."""
    from amqpjobs.wire.management import ManagementClient

    with ManagementClient(broker) as mgmt:
        found = mgmt.queue(broker.vhost, name)
    return None if found is None else (str(found["type"]), dict(found["arguments"]))


async def test_the_marker_is_a_quorum_queue(broker: BrokerSettings, tmp_path: Path) -> None:
    """A classic marker lives on one node; on 3.10 it reads as missing while that node is down.

    Before: ``('classic', {'x-max-length': 0, 'x-queue-type': 'classic'})``.
    """
    base = await make_app(broker, tmp_path)
    app = ledger_app(base, broker, "shop", tmp_path / "ledger.db")
    async with running_worker(app, broker):
        pass
    await app.close()
    assert marker_shape(broker, "amqpjobs.ledger.shop") == ("quorum", {"x-max-length": 0, "x-queue-type": "quorum"})


async def test_a_classic_marker_an_earlier_amqpjobs_declared_is_kept_and_still_marks(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On upgrade the classic marker stays (its type can't change in place): starts go on, a lost ledger is refused.

    The start says what the classic marker lacks and how to make it quorum (INFO), as the plan
    says it of a classic quarantine of a quorum job queue.
    """
    import logging

    from tests.integration.helpers import raw_channel

    caplog.set_level(logging.INFO)
    base = await make_app(broker, tmp_path)
    async with raw_channel(broker) as channel:  # what amqpjobs declared before
        await channel.declare_queue("amqpjobs.ledger.shop", durable=True,
                                    arguments={"x-queue-type": "classic", "x-max-length": 0})  # fmt: skip
    path = tmp_path / "ledger.db"
    path.touch()  # a ledger made before the origin rule: established
    import sqlite3

    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE amqpjobs_ledger (key TEXT PRIMARY KEY, state TEXT NOT NULL, owner TEXT NOT NULL, "
                   "expires_at REAL NOT NULL, updated_at REAL NOT NULL)")  # fmt: skip
    db.close()
    app = ledger_app(base, broker, "shop", path)
    async with running_worker(app, broker):
        pass
    await app.close()
    assert marker_shape(broker, "amqpjobs.ledger.shop") == ("classic", {"x-max-length": 0, "x-queue-type": "classic"})
    notes = [r for r in caplog.records if "amqpjobs.ledger.shop is classic" in r.getMessage()]
    assert [r.levelname for r in notes] == ["INFO"], caplog.text
    assert "delete_queue amqpjobs.ledger.shop" in notes[0].getMessage(), notes[0].getMessage()
    # the classic marker still marks: a lost ledger is refused
    path.unlink()
    again = ledger_app(base, broker, "shop", path)
    worker = Worker(again, broker, WorkerOptions(queues=("work",), grace=5), Recorder())
    try:
        with pytest.raises(ConfigurationError, match="app 'shop' had a ledger before"):
            await worker.start()
    finally:
        await worker.shutdown()
        await again.close()


async def test_a_worker_warns_at_start_of_a_policy_that_expires_its_ledger_marker(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As it warns of a policy that can lose its job queues' jobs. Before: nothing said (only ``status`` told)."""
    import logging

    from tests.integration.helpers import wait_until

    caplog.set_level(logging.INFO)
    base = await make_app(broker, tmp_path)
    first = ledger_app(base, broker, "shop", tmp_path / "ledger.db")
    async with running_worker(first, broker):  # the app's first start declares the marker
        pass
    await first.close()
    set_policy(broker, "tidy", r"^amqpjobs\.ledger\.", {"expires": 3600000})
    await policy_shown(broker, "amqpjobs.ledger.shop", "expires")  # (the management API shows it a moment later)
    app = ledger_app(base, broker, "shop", tmp_path / "ledger.db")
    async with running_worker(app, broker):

        def said() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.getMessage().startswith("policy 'tidy' on amqpjobs.ledger.shop:")]

        with contextlib.suppress(TimeoutError):  # the assertions below say what was found
            await wait_until(lambda: bool(said()), 10, "the warning")
    await app.close()
    found = said()
    assert [r.levelname for r in found] == ["WARNING"], caplog.text
    assert "expires 1h: the broker deletes the queue" in found[0].getMessage(), found[0].getMessage()
    assert "the app's mark that it had a ledger goes with it" in found[0].getMessage(), found[0].getMessage()
