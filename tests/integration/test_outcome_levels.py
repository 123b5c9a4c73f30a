"""``--log-outcomes`` and ``--outcome-events``: which outcomes get a log line and an event (real broker)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from amqpjobs import JobContext, Reject
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.events import OutcomeEvent
from amqpjobs.runtime.app import App
from amqpjobs.runtime.worker import Worker, WorkerOptions
from amqpjobs.wire.connection import connect
from amqpjobs.wire.events import subscribe_outcomes
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import cli, until
from tests.integration.test_operator_events import decoded
from tests.integration.test_quarantine import fill_quarantine
from tests.integration.worker_env import Recorder, make_app

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


@asynccontextmanager
async def worker_at(app: App, broker: BrokerSettings, **levels: str) -> AsyncIterator[Recorder]:
    recorder = Recorder()
    worker = Worker(app, broker, WorkerOptions(queues=("work",), grace=10, **levels), recorder)  # type: ignore[arg-type]
    await worker.start()
    try:
        yield recorder
    finally:
        await worker.shutdown()


@asynccontextmanager
async def listening(broker: BrokerSettings) -> AsyncIterator[list[OutcomeEvent]]:
    events: list[OutcomeEvent] = []
    connection = await connect(broker, name="listener")
    try:
        await subscribe_outcomes(connection, lambda body: events.extend(decoded(body)), ["work.*"])
        yield events
    finally:
        await connection.close()


def outcome_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return sorted(r.getMessage() for r in caplog.records if "outcome=" in r.getMessage())


async def test_at_failures_only_failures_are_logged_and_published(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="amqpjobs")
    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        if payload["n"] == 1:
            raise Reject("spam")

    async with listening(broker) as events, worker_at(app, broker, log_outcomes="failures",
                                                      outcome_events="failures") as rec:  # fmt: skip
        for n in range(3):
            await app.enqueue("mail", {"n": n}, job_id=f"f-{n}")
        await rec.wait_for(lambda o: len(o) == 3)
        await until(lambda: len(events) >= 1)
        await asyncio.sleep(0.5)  # a succeeded job's event would be here by now
    await app.close()
    assert sorted(o.kind for o in rec.outcomes) == ["quarantined", "succeeded", "succeeded"]  # all counted
    assert [(e.id, e.outcome, e.reason) for e in events] == [("f-1", "quarantined", "rejected")]
    lines = outcome_lines(caplog)
    assert len(lines) == 1
    assert lines[0].startswith("job=mail id=f-1 attempt=1 duration=")
    assert lines[0].endswith('outcome=quarantined reason=rejected error="amqpjobs.jobs.outcome.Reject: spam"')


async def test_at_none_nothing_is_logged_or_published_but_a_replay_canary_still_hears_its_jobs(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="amqpjobs")
    app = await make_app(broker, tmp_path)

    @app.job("mail", queue="work")
    async def mail(payload: dict[str, Any], ctx: JobContext) -> None:
        return None

    await fill_quarantine(broker, 4)
    async with listening(broker) as events, worker_at(app, broker, log_outcomes="none",
                                                      outcome_events="none") as rec:  # fmt: skip
        await app.enqueue("mail", {"n": 9}, job_id="plain")
        await rec.wait_for(lambda o: len(o) == 1)
        result = await asyncio.to_thread(cli, broker, "replay", "work", "--canary", "2", "--rate", "200")
        await rec.wait_for(lambda o: len(o) == 5)
        await until(lambda: len(events) >= 4)
    await app.close()
    assert result.exit_code == 0, result.output
    assert "canary passed: 2 of 2 succeeded" in result.stdout
    assert sorted((e.id, e.outcome) for e in events) == [(f"q-{i}", "succeeded") for i in range(4)]
    assert all(e.replay_id for e in events)  # replayed jobs only: "plain" sent none
    assert outcome_lines(caplog) == []


def test_an_unknown_level_is_refused_with_the_levels() -> None:
    with pytest.raises(ConfigurationError, match=r"log_outcomes='some': use one of all, failures, none"):
        WorkerOptions(log_outcomes="some")
    with pytest.raises(ConfigurationError, match=r"outcome_events='off': use one of all, failures, none"):
        WorkerOptions(outcome_events="off")
