"""A delivery rejected into quarantine (its copy can never be published) is never dropped (README "Workers").

The broker dead-letters a rejected delivery into the quarantine exchange; if that exchange
is not bound to the quarantine queue, the dead-letter routes nowhere and is dropped. The
worker makes sure of the binding before it rejects. Each test counts messages on the real broker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

import aio_pika
import pytest

from amqpjobs import JobContext
from amqpjobs.jobs.outcome import Quarantine
from amqpjobs.runtime.worker import Worker, WorkerOptions
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, drain, raw_channel, until
from tests.integration.test_outcome_levels import listening, worker_at
from tests.integration.test_pause_faults import _mgmt, _user
from tests.integration.worker_env import Recorder, make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.chaos]

PAD = "z" * 130_900  # fits a frame as published; with the worker's retry headers it does not


def last_death_reason(headers: Mapping[str, object]) -> object:
    """The reason of the most recent ``x-death`` entry of ``headers``."""
    deaths = headers["x-death"]
    assert isinstance(deaths, list), deaths
    latest = deaths[0]
    assert isinstance(latest, dict), latest
    return latest["reason"]


async def test_a_reject_into_an_unbound_quarantine_rebinds_it_first_and_the_job_is_kept(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """H1: quarantine queue unbound from its exchange at run time: the worker binds it again, then rejects;
    the job is in the quarantine queue (x-death rejected), not dropped."""
    app = await make_app(broker, tmp_path)

    @app.job("fails", queue="work")
    async def fails(payload: dict[str, int], ctx: JobContext) -> None:
        raise ValueError("always")

    async with running_worker(app, broker) as (worker, rec), raw_channel(broker) as channel:
        quarantine = await channel.get_queue("work.quarantine", ensure=False)
        await quarantine.unbind("work.quarantine", routing_key="")
        message = aio_pika.Message(b'{"i": 1}', message_id="huge", type="fails", content_type="application/json",
                                   headers={"big": PAD})  # fmt: skip
        await channel.default_exchange.publish(message, routing_key="work")
        await rec.wait_for(lambda o: any(x.job_id == "huge" for x in o), timeout=20)
        assert worker.readiness()[0]
    await app.close()
    assert await depth(broker, "work") == 0
    (dead,) = await drain(broker, "work.quarantine")
    assert (dead.message_id, dead.headers["big"]) == ("huge", PAD)
    deaths = dead.headers["x-death"]
    assert isinstance(deaths, list), deaths
    assert len(deaths) == 1, deaths
    death = deaths[0]
    assert isinstance(death, dict)
    assert (death["reason"], death["count"], death["queue"]) == ("rejected", 1, "work")


async def test_a_delivery_rejected_into_quarantine_is_reported_quarantined_with_an_event(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """M1: rejected into quarantine (its retry copy can't fit a frame): outcome ``quarantined``, reason
    ``x-death:rejected`` in the log line and the event, not ``abandoned`` (*.quarantined subscribers hear of it)."""
    caplog.set_level(logging.INFO, logger="amqpjobs")
    app = await make_app(broker, tmp_path)

    @app.job("fails", queue="work")
    async def fails(payload: dict[str, int], ctx: JobContext) -> None:
        raise ValueError("always")

    async with (
        listening(broker) as events,
        worker_at(app, broker, outcome_events="failures") as rec,
        raw_channel(broker) as channel,
    ):
        message = aio_pika.Message(b'{"i": 1}', message_id="huge", type="fails", content_type="application/json",
                                   headers={"big": PAD})  # fmt: skip
        await channel.default_exchange.publish(message, routing_key="work")
        await rec.wait_for(lambda o: len(o) == 1, timeout=20)
        await until(lambda: len(events) >= 1)
    await app.close()
    (outcome,) = rec.outcomes
    assert (outcome.kind, outcome.decision, outcome.acked) == ("quarantined", Quarantine("x-death:rejected"), False)
    assert outcome.error == "ValueError: always"
    assert [(e.id, e.outcome, e.reason, e.error) for e in events] == [
        ("huge", "quarantined", "x-death:rejected", "ValueError: always")
    ]
    (line,) = [r.getMessage() for r in caplog.records if "outcome=" in r.getMessage()]
    assert "id=huge attempt=1" in line
    assert line.endswith(
        'outcome=quarantined reason=x-death:rejected error="ValueError: always" '
        "(rejected: the broker dead-lettered it into quarantine)"
    ), line
    (dead,) = await drain(broker, "work.quarantine")
    assert (dead.message_id, last_death_reason(dead.headers)) == ("huge", "rejected")


async def test_a_worker_that_cannot_bind_the_quarantine_holds_the_delivery_until_it_can(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """H1: no ``write`` permission on the quarantine queue, so the binding can't be made sure of: the delivery
    is held unacked (not ready, the reason named), never rejected; once permitted, it is rejected into quarantine."""
    app = await make_app(broker, tmp_path)

    @app.job("fails", queue="work")
    async def fails(payload: dict[str, int], ctx: JobContext) -> None:
        raise ValueError("always")

    rec = Recorder()
    async with _user(broker, write=r"^(?!work\.quarantine$).*") as limited:
        worker = Worker(app, limited, WorkerOptions(queues=("work",), grace=10), rec)
        await worker.start()
        try:
            async with raw_channel(broker) as channel:
                message = aio_pika.Message(b'{"i": 1}', message_id="huge", type="fails",
                                           content_type="application/json", headers={"big": PAD})  # fmt: skip
                await channel.default_exchange.publish(message, routing_key="work")
            await until(lambda: not worker.readiness()[0], timeout=15)
            why = worker.readiness()[1]
            assert "work.quarantine can't be bound to work.quarantine, so a reject would be dropped" in why, why
            assert "ACCESS_REFUSED" in why, why
            await asyncio.sleep(0.5)
            assert (rec.outcomes, await depth(broker, "work.quarantine")) == ([], 0)  # held, not rejected
            user = limited.url.split("//")[1].split(":")[0]
            await asyncio.to_thread(_mgmt, broker, "PUT", f"/permissions/{quote(broker.vhost, safe='')}/{user}",
                                    json={"configure": ".*", "write": ".*", "read": ".*"})  # fmt: skip
            await rec.wait_for(lambda o: len(o) == 1, timeout=20)
            assert worker.readiness()[0]
        finally:
            await worker.shutdown()
    await app.close()
    assert [o.kind for o in rec.outcomes] == ["quarantined"]
    assert await depth(broker, "work") == 0
    (dead,) = await drain(broker, "work.quarantine")
    assert (dead.message_id, last_death_reason(dead.headers)) == ("huge", "rejected")
