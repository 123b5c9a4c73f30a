"""A pause that comes while a consumer is still starting to consume holds (README "When a job crashes").

A worker's suspects turn pauses every consumer, settles their acks and runs the suspect with
nothing else held. A consumer still between its start's ``_paused`` check and its
``basic.consume`` (five round trips) took the pause as "not consuming yet: nothing to cancel",
then consumed anyway: the deliveries it got were handed back while the suspect ran, and a
suspect that crashed the worker then left their originals unacked beside confirmed copies.
Each ran twice (found by an outsider with two job queues and ``--processes 2``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import pytest

from amqpjobs import App, JobContext, Worker, WorkerOptions
from amqpjobs.jobs import crash, envelope
from amqpjobs.runtime import carrying_out, fallback
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.ledger import Claim, SqliteLedger
from amqpjobs.topology.loader import load_topology
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.wire.connection import connect
from amqpjobs.wire.consume import WorkQueueConsumer
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.lane import Lane
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, raw_channel, until
from tests.integration.tcp_proxy import TcpProxy
from tests.integration.worker_env import APPLIED_TOPOLOGY, Recorder, make_app, running_worker

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


async def fill(broker: BrokerSettings, queue: str, n: int) -> None:
    async with raw_channel(broker) as ch:
        await ch.declare_queue(queue, durable=True)
        for i in range(n):
            await ch.default_exchange.publish(aio_pika.Message(b"{}", message_id=f"m-{i}"), routing_key=queue)


def slowed(consumer: WorkQueueConsumer, entered: asyncio.Event) -> None:
    """Make ``consumer``'s consume take 0.2 s longer before its first round trip, and say when it began."""
    consume = consumer._consume

    async def slow() -> None:
        entered.set()
        await asyncio.sleep(0.2)
        await consume()

    consumer._consume = slow  # type: ignore[method-assign]


@pytest.mark.parametrize("way", ["start", "consuming again after the broker cancelled it"])
async def test_a_pause_while_the_consume_is_under_way_holds_once_it_returns(broker: BrokerSettings, way: str) -> None:
    """Deliveries the broker sent before the cancel went to the handler before pause() returned; none come after."""
    got: list[Delivery] = []

    async def handler(delivery: Delivery) -> None:
        got.append(delivery)
        await delivery.ack()

    connection = await connect(broker)
    consumer = WorkQueueConsumer(connection, "racing", 2, handler)
    entered = asyncio.Event()
    try:
        if way == "start":
            await fill(broker, "racing", 3)
            slowed(consumer, entered)
            consuming: asyncio.Task[Any] | None = asyncio.create_task(consumer.start())
        else:  # the queue deleted: the broker cancels the consumer, which tries to consume again every second
            await fill(broker, "racing", 0)
            await consumer.start()
            async with raw_channel(broker) as ch:
                await ch.queue_delete("racing")
            await until(lambda: consumer._retry is not None)
            slowed(consumer, entered)
            await fill(broker, "racing", 3)  # back, with work: the next try consumes
            consuming = None
        await asyncio.wait_for(entered.wait(), 10)
        await consumer.pause()
        taken = len(got)
        if consuming is not None:
            await consuming
        await asyncio.sleep(0.6)
        assert len(got) == taken  # nothing delivered once pause() returned
        assert not consumer.consuming
        assert await depth(broker, "racing") == 3 - taken
        await consumer.resume()  # and the rest are taken after the pause
        await until(lambda: len(got) == 3)
        assert sorted(str(d.message_id) for d in got) == ["m-0", "m-1", "m-2"]
    finally:
        await consumer.close()
        await connection.close()


TWO_QUEUES = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "alpha"
exchange = "jobs"

[[job_queue]]
name = "beta"
exchange = "jobs"
"""


@pytest.mark.parametrize("slowed_step", ["consume", "start"])
async def test_a_suspect_runs_with_nothing_handed_back_beside_it_while_another_consumer_still_starts(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slowed_step: str
) -> None:
    """Job queue alpha's suspects turn begins while beta's consumer is still starting (its consume slowed), or
    before it began (its start slowed: the turn's pause did not find it): beta takes nothing while the suspect
    runs, and each of its jobs runs once (the outsider's case)."""
    path = tmp_path / "two.toml"
    path.write_text(TWO_QUEUES)
    await apply_topology(path, broker)
    app = App("race", topology=load_topology(path).topology, url=broker.url)
    runs: list[str] = []
    handed_back_while_alone: list[int] = []
    recorder = Recorder()

    def handed_back() -> int:
        return sum(1 for o in recorder.outcomes if o.kind == "handed_back")

    @app.job("suspect", queue="alpha")
    async def suspect(payload: dict[str, Any], ctx: JobContext) -> None:
        before = handed_back()
        await asyncio.sleep(1.0)  # beta's slowed consume ends meanwhile on the old code
        handed_back_while_alone.append(handed_back() - before)

    @app.job("ordinary", queue="beta")
    async def ordinary(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append(ctx.job_id)

    async with raw_channel(broker) as ch:
        headers: dict[str, Any] = {envelope.JOB: "suspect", crash.STARTS: 2, crash.WORK_QUEUE: "alpha"}
        message = aio_pika.Message(b"{}", message_id="the-suspect", headers=headers, content_type="application/json")
        await ch.default_exchange.publish(message, "alpha.suspects")
    for i in range(3):
        await app.enqueue("ordinary", {}, job_id=f"b{i}")
    if slowed_step == "consume":
        consume = WorkQueueConsumer._consume

        async def slow_consume(self: WorkQueueConsumer) -> None:
            if self.queue == "beta":
                await asyncio.sleep(1.5)  # the first look at alpha's suspects comes after 1 s
            await consume(self)

        monkeypatch.setattr(WorkQueueConsumer, "_consume", slow_consume)
    else:
        start_consumer = Worker._start_consumer

        async def slow_start(self: Worker, layout: JobQueueLayout, work_queue: str) -> None:
            if layout.name == "beta":
                await asyncio.sleep(1.5)
            await start_consumer(self, layout, work_queue)

        monkeypatch.setattr(Worker, "_start_consumer", slow_start)
    worker = Worker(app, broker, WorkerOptions(queues=("alpha", "beta"), concurrency=2), recorder)
    await worker.start()
    try:
        await recorder.wait_for(lambda o: sum(1 for x in o if x.kind == "succeeded") >= 4, timeout=30)
        await asyncio.sleep(0.5)
    finally:
        await worker.shutdown()
        await app.close()
    assert handed_back_while_alone == [0]
    assert sorted(runs) == ["b0", "b1", "b2"]  # once each


SHARDED_BETA = TWO_QUEUES.replace(
    'name = "beta"\nexchange = "jobs"\n', 'name = "beta"\nexchange = "jobs"\nshards = 2\n'
)


@pytest.mark.parametrize("slowed_step", ["lease", "get", "start"])
async def test_a_suspect_runs_with_nothing_taken_beside_it_while_a_shard_dispatcher_still_takes(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slowed_step: str
) -> None:
    """As above with beta sharded: its dispatcher's lease (basic.consume), get or start is still under way when
    alpha's suspects turn begins. Beta starts no job while the suspect runs, and each of its jobs runs once."""
    assert "shards = 2" in SHARDED_BETA
    path = tmp_path / "two.toml"
    path.write_text(SHARDED_BETA)
    await apply_topology(path, broker)
    app = App("race", topology=load_topology(path).topology, url=broker.url)
    runs: list[tuple[str, float, float]] = []
    alone: list[tuple[float, float]] = []

    recorder = Recorder()
    handed_back_while_alone: list[int] = []

    def handed_back() -> int:
        return sum(1 for o in recorder.outcomes if o.kind == "handed_back")

    @app.job("suspect", queue="alpha")
    async def suspect(payload: dict[str, Any], ctx: JobContext) -> None:
        began, before = time.monotonic(), handed_back()
        await asyncio.sleep(1.0)  # beta's slowed step ends meanwhile
        alone.append((began, time.monotonic()))
        handed_back_while_alone.append(handed_back() - before)

    @app.job("ordinary", queue="beta")
    async def ordinary(payload: dict[str, Any], ctx: JobContext) -> None:
        started = time.monotonic()
        await asyncio.sleep(0.2)  # a backlog is still there when the slowed step ends
        runs.append((ctx.job_id, started, time.monotonic()))

    async with raw_channel(broker) as ch:
        headers: dict[str, Any] = {envelope.JOB: "suspect", crash.STARTS: 2, crash.WORK_QUEUE: "alpha"}
        message = aio_pika.Message(b"{}", message_id="the-suspect", headers=headers, content_type="application/json")
        await ch.default_exchange.publish(message, "alpha.suspects")
    for i in range(16):
        await app.enqueue("ordinary", {}, job_id=f"b{i}", tenant=f"tenant-{i}")
    if slowed_step in ("lease", "get"):
        original = getattr(Lane, slowed_step)

        async def slow(self: Lane, queue: str, *args: Any, **kw: Any) -> Any:
            if queue.startswith("beta"):
                await asyncio.sleep(1.5)  # the first look at alpha's suspects comes after 1 s
            return await original(self, queue, *args, **kw)

        monkeypatch.setattr(Lane, slowed_step, slow)
    else:
        start_dispatcher = Worker._start_dispatcher

        async def slow_start(self: Worker, layout: JobQueueLayout) -> None:
            if layout.name == "beta":
                await asyncio.sleep(1.5)
            await start_dispatcher(self, layout)

        monkeypatch.setattr(Worker, "_start_dispatcher", slow_start)
    worker = Worker(app, broker, WorkerOptions(queues=("alpha", "beta"), concurrency=2), recorder)
    await worker.start()
    try:
        await recorder.wait_for(lambda o: sum(1 for x in o if x.kind == "succeeded") >= 17, timeout=30)
        await asyncio.sleep(0.5)
    finally:
        await worker.shutdown()
        await app.close()
    assert len(alone) == 1
    assert handed_back_while_alone == [0]  # nothing taken, so nothing to hand back
    began, ended = alone[0]
    assert [job_id for job_id, start, end in runs if start < ended and end > began] == []  # none ran beside it
    assert sorted(job_id for job_id, _, _ in runs) == sorted(f"b{i}" for i in range(16))  # once each


async def test_a_job_received_after_a_redelivery_starts_once_its_registration_is_acked(
    broker: BrokerSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted worker gets the crashed one's redeliveries and fresh jobs at once. A fresh job that kills the
    process while a redelivery's registration (copy to the suspects queue, then the ack) is under way gave
    that job a second life (seen in 3 of 11 crash-loop runs); a job received after it waits for it (a few ms)."""
    app = await make_app(broker, tmp_path)
    events: list[tuple[str, float]] = []

    @app.job("registered", queue="work")
    async def registered(payload: dict[str, Any], ctx: JobContext) -> None:
        pass

    @app.job("fresh", queue="work")
    async def fresh(payload: dict[str, Any], ctx: JobContext) -> None:
        events.append(("fresh started", time.monotonic()))

    async def noted_ack(delivery: Any, job_id: str, copied: bool = True) -> bool:
        acked = await fallback.ack(delivery, job_id, copied)
        events.append((f"{job_id} acked", time.monotonic()))
        return acked

    monkeypatch.setattr(carrying_out, "ack", noted_ack)  # the name the worker calls
    await app.enqueue("registered", {}, job_id="r1")
    async with raw_channel(broker) as ch:  # a worker that took it and died: the broker requeues it redelivered
        queue = await ch.get_queue("work", ensure=False)
        assert await queue.get(no_ack=False, timeout=5) is not None
    await app.enqueue("fresh", {}, job_id="f1")
    async with running_worker(app, broker, concurrency=2) as (_, recorder):
        await recorder.wait_for(lambda o: {x.job_id for x in o} >= {"r1", "f1"}, timeout=20)
    await app.close()
    assert [what for what, _ in sorted(events, key=lambda e: e[1])][:2] == ["r1 acked", "fresh started"]
    assert await depth(broker, "work.suspects") == 1  # r1, registered once


async def test_pause_and_cancel_do_not_wait_for_a_broker_outage(broker: BrokerSettings) -> None:
    """A consume tried again during an outage must not hold the switch until the broker is back: a worker's stop
    (cancel) would wait for the whole outage before its drain began (found by a review of the switch)."""
    await fill(broker, "outage", 0)
    node = urlsplit(broker.url)
    proxy = TcpProxy((node.hostname or "127.0.0.1", node.port or 5672))
    via = urlunsplit(node._replace(netloc=f"{node.username}:{node.password}@127.0.0.1:{await proxy.start()}"))
    connection = await connect(replace(broker, url=via))

    async def handler(delivery: Delivery) -> None:
        await delivery.ack()

    consumer = WorkQueueConsumer(connection, "outage", 2, handler)
    try:
        await consumer.start()
        async with raw_channel(broker) as ch:  # the broker cancels the consumer: it tries again every second
            await ch.queue_delete("outage")
        await until(lambda: consumer._retry is not None)
        await proxy.stop()  # the broker is away (connections cut, new ones refused)
        await asyncio.sleep(2.5)  # a try or two meet the outage
        await asyncio.wait_for(consumer.pause(), 2)
        await asyncio.wait_for(consumer.cancel(), 2)
    finally:
        await consumer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(connection.close(), 2)
        await proxy.stop()


async def test_a_suspect_waiting_for_a_dead_workers_claim_keeps_its_start_count(
    broker: BrokerSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An idempotent suspect meets the claim its dead worker left (a live lease): it waits in a retry tier and
    comes back registered for the same start, run alone; from the work queue its count began again at 2 each
    time, so an idempotent job killing its workers never reached ``crashed`` (an outsider's report)."""
    caplog.set_level(logging.INFO, logger="amqpjobs")
    path = tmp_path / "app.toml"
    path.write_text(APPLIED_TOPOLOGY)
    await apply_topology(path, broker)
    ledger = SqliteLedger(str(tmp_path / "ledger.db"))
    app = App("claims", topology=load_topology(path).topology, url=broker.url, ledger=ledger)
    ran: list[tuple[Any, bool]] = []

    @app.job("charge", queue="work", idempotent=True, lease="30s")
    async def charge(payload: dict[str, Any], ctx: JobContext) -> None:
        ran.append((ctx.headers.get(crash.STARTS), ctx.redelivered))

    assert await ledger.claim("j1", "the-dead-worker", 30.0) is Claim.CLAIMED
    async with raw_channel(broker) as ch:
        headers: dict[str, Any] = {envelope.JOB: "charge", crash.STARTS: 3, crash.WORK_QUEUE: "work"}
        message = aio_pika.Message(b"{}", message_id="j1", headers=headers, content_type="application/json")
        await ch.default_exchange.publish(message, "work.suspects")
    seen: list[Recorder] = []

    def kinds() -> list[str]:
        return [o.kind for o in seen[0].outcomes if o.job_id == "j1"]

    async with running_worker(app, broker, concurrency=2) as (_, recorder):
        seen.append(recorder)
        await until(lambda: kinds().count("deferred") >= 2, 20, "two waits for the claim")
        await ledger.release("j1", "the-dead-worker")
        await until(lambda: "succeeded" in kinds(), 20, "the run once the claim is free")
    await app.close()
    assert kinds()[:3] == ["deferred", "redelivered", "deferred"]  # waited, registered again, still busy
    assert ran == [(3, True)]  # once, alone, as start 3
    alone = [r.getMessage() for r in caplog.records if "running it alone" in r.getMessage()]
    assert alone, caplog.text
    assert all("start 3 of at most 6" in line for line in alone), alone
