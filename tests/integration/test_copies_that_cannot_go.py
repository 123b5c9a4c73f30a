"""Copies a worker cannot publish, and counts it did not write (README "Poison jobs", "Bad messages").

A delivery whose copy (suspect, hand-back, retry, quarantine) can never be published must
end in a bounded way, never in a requeue loop; ``enqueue`` leaves room in ``frame_max``
for the worker's own headers, so a job it accepts always gets its copies out; and the
``amqpjobs-runs`` / ``amqpjobs-starts`` counts of a foreign publisher are not believed.
Each test counts deliveries on the real broker.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from amqpjobs import JobContext, MessageTooLargeError, RetryPolicy
from amqpjobs.jobs import crash, envelope, evidence
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, drain, raw_channel
from tests.integration.worker_env import make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.chaos]

FRAME_MAX = 131_072  # the broker's default (3.10 through 4.3)
HEADROOM = 20_480  # what enqueue leaves of it for the worker's headers (README "Bad messages")


async def publish_redelivered(broker: BrokerSettings, job_id: str, headers: dict[str, Any], job: str = "note") -> None:
    """Publish a job raw to work queue ``work`` and take it without an ack: it is back, ``redelivered``."""
    async with raw_channel(broker) as channel:
        message = aio_pika.Message(b'{"i": 1}', message_id=job_id, type=job, headers=headers,
                                   content_type="application/json")  # fmt: skip
        await channel.default_exchange.publish(message, routing_key="work")
        queue = await channel.get_queue("work", ensure=False)
        taken = await queue.get(no_ack=False, timeout=5)
        assert taken is not None
        assert not taken.redelivered  # the connection closes unacked: it goes back


async def test_a_redelivery_whose_suspect_copy_cannot_fit_a_frame_is_quarantined_once(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """H1: headers that fit, but not with the suspect's registration: rejected into quarantine, not requeued."""
    app = await make_app(broker, tmp_path)
    ran: list[int] = []

    @app.job("note", queue="work")
    async def note(payload: dict[str, int], ctx: JobContext) -> None:
        ran.append(payload["i"])

    pad = "z" * 130_900  # the message fits a frame; with amqpjobs-starts & co it does not
    await publish_redelivered(broker, "big", {"big": pad})
    async with running_worker(app, broker) as (worker, rec):
        await app.enqueue("note", {"i": 2}, job_id="canary")
        await rec.wait_for(lambda o: any(x.job_id == "canary" for x in o), timeout=15)
        await asyncio.sleep(2.0)  # a requeue loop turns hundreds of times meanwhile
        assert worker.readiness()[0]
    await app.close()
    # rejected once into quarantine, never acked: reported quarantined (README "Workers")
    assert [(o.kind, o.acked) for o in rec.outcomes if o.job_id == "big"] == [("quarantined", False)]
    (big,) = [o for o in rec.outcomes if o.job_id == "big"]
    assert big.error.startswith("MessageTooLargeError: the message's headers and properties take "), big.error
    assert ran == [2]
    (dead,) = await drain(broker, "work.quarantine")
    assert (dead.message_id, dead.headers["big"]) == ("big", pad)
    deaths = dead.headers["x-death"]
    assert isinstance(deaths, list), deaths
    assert len(deaths) == 1, deaths
    death = deaths[0]
    assert isinstance(death, dict)
    assert (death["reason"], death["count"], death["queue"]) == ("rejected", 1, "work")
    assert (await depth(broker, "work"), await depth(broker, "work.suspects")) == (0, 0)


async def test_enqueue_leaves_room_for_the_worker_headers_and_such_a_job_is_quarantined_with_evidence(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """M1: headers that fit a frame but leave no room for the worker's are refused; the largest taken
    fails every attempt and its retry copies and quarantine copy (evidence at its budget) all go."""
    app = await make_app(broker, tmp_path)

    @app.job("fails", queue="work")
    async def fails(payload: dict[str, int], ctx: JobContext) -> None:
        raise ValueError("no " * 50_000)  # evidence trimmed to its budget

    room = FRAME_MAX - HEADROOM
    with pytest.raises(MessageTooLargeError, match=f"{HEADROOM} bytes of it for the worker's"):
        await app.enqueue("fails", {"i": 1}, job_id="too-big", headers={"big": "z" * 130_500})
    assert await depth(broker, "work") == 0
    refused = 0
    for size in range(room, room - 1000, -1):  # the largest header the rule lets through
        try:
            await app.enqueue("fails", {"i": 1}, job_id="largest", headers={"big": "z" * size})
        except MessageTooLargeError:
            refused += 1
            continue
        break
    assert 0 < refused < 1000
    async with running_worker(app, broker) as (_, rec):
        await rec.wait_for(lambda o: len(o) == 4, timeout=20)
        await asyncio.sleep(0.3)
    await app.close()
    assert [o.kind for o in rec.outcomes] == ["retried", "retried", "retried", "quarantined"]
    (copy,) = await drain(broker, "work.quarantine")
    headers = copy.headers
    assert (headers[evidence.REASON], headers[evidence.ATTEMPTS]) == ("exhausted", 4)
    assert headers["big"] == "z" * size
    assert "x-death" not in headers  # our copy, not a broker dead-letter
    assert str(headers[evidence.ERROR_MESSAGE]).startswith("no no ")


async def test_a_foreign_runs_header_is_not_believed(broker: BrokerSettings, tmp_path: Path) -> None:
    """L1: ``amqpjobs-runs: 99`` from a publisher: three runs are three runs."""
    app = await make_app(broker, tmp_path)

    @app.job("fails", queue="work")
    async def fails(payload: dict[str, int], ctx: JobContext) -> None:
        raise ValueError("always")

    async with running_worker(app, broker) as (_, rec), raw_channel(broker) as channel:
        message = aio_pika.Message(b'{"i": 1}', message_id="forged", type="fails", content_type="application/json",
                                   headers={envelope.RUNS: 99, envelope.ATTEMPT: 2})  # fmt: skip
        await channel.default_exchange.publish(message, routing_key="work")
        await rec.wait_for(lambda o: len(o) == 3, timeout=20)
    await app.close()
    assert [o.kind for o in rec.outcomes] == ["retried", "retried", "quarantined"]
    (copy,) = await drain(broker, "work.quarantine")
    assert (copy.headers[evidence.REASON], copy.headers[evidence.ATTEMPTS]) == ("exhausted", 4)  # 1 claimed + 3 run


async def test_a_forged_start_count_on_a_work_queue_delivery_does_not_count(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """L2: ``amqpjobs-starts: 2**40`` on a redelivery of the work queue is not a crash count: start 2, run alone."""
    app = await make_app(broker, tmp_path)
    ran: list[str] = []

    @app.job("note", queue="work")
    async def note(payload: dict[str, int], ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    await publish_redelivered(broker, "forged", {crash.STARTS: 2**40, crash.WORK_QUEUE: "work"})
    async with running_worker(app, broker) as (_, rec):
        await rec.wait_for(lambda o: len(o) == 2, timeout=20)
        await asyncio.sleep(0.3)
    await app.close()
    assert [o.kind for o in rec.outcomes] == ["redelivered", "succeeded"]
    assert ran == ["forged"]
    assert await depth(broker, "work.quarantine") == 0


async def test_a_quarantine_copy_over_the_frame_gets_its_evidence_trimmed_to_the_room_left(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """Another publisher's headers (125000 bytes) leave room for the retry copies but not for 16 KiB
    of evidence: the quarantine copy carries the evidence trimmed to fit, not a bare x-death."""
    app = await make_app(broker, tmp_path)

    @app.job("fails", queue="work")
    async def fails(payload: dict[str, int], ctx: JobContext) -> None:
        raise ValueError("no " * 50_000)

    pad = "z" * 125_000
    async with running_worker(app, broker) as (_, rec), raw_channel(broker) as channel:
        message = aio_pika.Message(b'{"i": 1}', message_id="near", type="fails", content_type="application/json",
                                   headers={"big": pad})  # fmt: skip
        await channel.default_exchange.publish(message, routing_key="work")
        await rec.wait_for(lambda o: len(o) == 4, timeout=20)
        await asyncio.sleep(0.3)
    await app.close()
    assert [o.kind for o in rec.outcomes] == ["retried", "retried", "retried", "quarantined"]
    (copy,) = await drain(broker, "work.quarantine")
    headers = copy.headers
    assert "x-death" not in headers
    assert (headers[evidence.REASON], headers[evidence.ATTEMPTS], headers["big"]) == ("exhausted", 4, pad)
    assert str(headers[evidence.ERROR_MESSAGE]).startswith("no no ")
    text = len(str(headers[evidence.ERROR_MESSAGE])) + len(str(headers[evidence.TRACEBACK]))
    assert 0 < text < evidence.DEFAULT_BUDGET - 6_000  # trimmed to the room left, far under the budget


async def test_a_forged_start_count_on_a_fresh_delivery_runs_it_as_a_first_start(
    broker: BrokerSettings, tmp_path: Path
) -> None:
    """L2: ``amqpjobs-starts: 5`` on a work queue delivery: an ordinary first run, ``ctx.redelivered`` false."""
    app = await make_app(broker, tmp_path)
    seen: list[bool] = []

    @app.job("note", queue="work")
    async def note(payload: dict[str, int], ctx: JobContext) -> None:
        seen.append(ctx.redelivered)

    async with running_worker(app, broker) as (_, rec), raw_channel(broker) as channel:
        message = aio_pika.Message(b'{"i": 1}', message_id="forged", type="note", content_type="application/json",
                                   headers={crash.STARTS: 5, crash.WORK_QUEUE: "work"})  # fmt: skip
        await channel.default_exchange.publish(message, routing_key="work")
        await rec.wait_for(lambda o: len(o) == 1, timeout=20)
    await app.close()
    assert [o.kind for o in rec.outcomes] == ["succeeded"]
    assert seen == [False]


async def test_a_long_tenant_leaves_the_quarantine_evidence_its_budget(broker: BrokerSettings, tmp_path: Path) -> None:
    """M2: a 110,300-character tenant (enqueue counts it in the frame) is not counted again against the
    16 KiB evidence budget: the quarantine copy keeps a long error message and traceback, as with a custom
    header of that size."""
    app = await make_app(broker, tmp_path)

    @app.job("hugeerr", queue="work", retry=RetryPolicy(max_attempts=1))
    async def hugeerr(payload: dict[str, int], ctx: JobContext) -> None:
        raise ValueError("no " * 50_000)

    tenant = "t" * 110_300
    await app.enqueue("hugeerr", {}, job_id="he-ten", tenant=tenant)
    async with running_worker(app, broker) as (_, rec):
        await rec.wait_for(lambda o: len(o) == 1, timeout=20)
    await app.close()
    assert [o.kind for o in rec.outcomes] == ["quarantined"]
    (copy,) = await drain(broker, "work.quarantine")
    headers = copy.headers
    assert (headers[evidence.REASON], headers[evidence.TENANT]) == ("exhausted", tenant)
    assert "x-death" not in headers  # our copy with its evidence
    message, traceback = str(headers[evidence.ERROR_MESSAGE]), str(headers[evidence.TRACEBACK])
    assert message.startswith("no no ")
    assert len(message) > 3_000, len(message)
    assert len(traceback) > 10_000, len(traceback)
