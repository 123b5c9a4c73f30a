"""The worker's consumers against the real broker: prefetch per slot, and a consumer the broker cancels."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aio_pika
import aiormq
import pytest

from amqpjobs.jobs.registry import JobContext
from amqpjobs.runtime.app import App
from amqpjobs.runtime.deploy import apply_topology
from amqpjobs.runtime.dispatch import ShardDispatcher
from amqpjobs.runtime.worker import Outcome, Worker, WorkerOptions
from amqpjobs.topology.loader import load_topology
from amqpjobs.wire.connection import connect
from amqpjobs.wire.consume import WorkQueueConsumer
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.settings import BrokerSettings
from tests.amqp_frames import FrameTap, Settle
from tests.integration.helpers import depth, drain, raw_channel
from tests.integration.worker_env import make_app, running_worker

pytestmark = pytest.mark.broker


async def test_n_slots_hold_exactly_n_unacked_deliveries(broker: BrokerSettings, tmp_path: Path):
    app = await make_app(broker, tmp_path)
    running: set[int] = set()
    most = 0
    release = asyncio.Event()

    @app.job("hold", queue="work")
    async def hold(payload: dict[str, int], ctx: JobContext) -> None:
        nonlocal most
        running.add(payload["i"])
        most = max(most, len(running))
        await release.wait()
        running.discard(payload["i"])

    async with running_worker(app, broker, concurrency=3) as (_, rec):
        for i in range(10):
            await app.enqueue("hold", {"i": i})
        deadline = time.monotonic() + 10
        while len(running) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # time for a fourth delivery, if the broker were to send one
        assert len(running) == 3
        assert await depth(broker, "work") == 7  # the broker holds back the rest: prefetch 3, not more
        release.set()
        await rec.wait_for(lambda o: len(o) == 10)
    await app.close()
    assert most == 3
    assert [o.kind for o in rec.outcomes] == ["succeeded"] * 10


async def test_a_consumer_the_broker_cancels_consumes_again_once_the_queue_is_back(
    broker: BrokerSettings, tmp_path: Path
):
    app = await make_app(broker, tmp_path)
    done: list[int] = []

    @app.job("note", queue="work")
    async def note(payload: dict[str, int], ctx: JobContext) -> None:
        done.append(payload["i"])

    async with running_worker(app, broker, concurrency=2) as (worker, rec):
        assert worker.readiness()[0]
        async with raw_channel(broker) as ch:
            await ch.queue_delete("work")  # the broker sends basic.cancel to its consumers
        deadline = time.monotonic() + 10  # cancelled at once ("not consuming"), then found missing (404)
        while "missing" not in worker.readiness()[1] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        ready, reason = worker.readiness()
        assert not ready
        assert reason.startswith("work queue(s) work missing: declare it again (amqpjobs topology apply)"), reason
        await apply_topology(tmp_path / "applied.toml", broker)  # the queue is back (empty)
        deadline = time.monotonic() + 15
        while not worker.readiness()[0] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert worker.readiness()[0], worker.readiness()[1]
        for i in range(5):
            await app.enqueue("note", {"i": i})
        await rec.wait_for(lambda o: len(o) == 5, timeout=15)
    await app.close()
    assert sorted(done) == [0, 1, 2, 3, 4]


async def test_the_broker_takes_batched_acks_around_rejected_deliveries(broker: BrokerSettings, tmp_path: Path):
    """A multiple ack covering a rejected delivery, and one stopping before it, as the broker receives them."""
    await make_app(broker, tmp_path)
    async with raw_channel(broker) as ch:
        for i in range(6):
            await ch.default_exchange.publish(aio_pika.Message(str(i).encode(), message_id=f"m-{i}"), "work")
    async with FrameTap(broker) as tap:
        connection = await connect(tap.settings)
        got: list[Delivery] = []
        arrived = asyncio.Event()

        async def hold(delivery: Delivery) -> None:
            got.append(delivery)
            if len(got) == 6:
                arrived.set()

        consumer = WorkQueueConsumer(connection, "work", 6, hold)
        try:
            await consumer.start()
            await asyncio.wait_for(arrived.wait(), 10)
            d = {x.message_id: x for x in got}
            assert [d[f"m-{i}"].delivery_tag for i in range(6)] == [1, 2, 3, 4, 5, 6]
            await d["m-1"].reject()  # tag 2 settled by a reject; 1 and 3 acked in one turn -> one ack(3, multiple)
            await d["m-0"].ack()
            await d["m-2"].ack()
            await consumer.settle()
            await d["m-4"].reject()  # the run of settled tags 4, 5 ends on a reject: the ack must name 4, not 5
            await d["m-3"].ack()
            await consumer.settle()
            await d["m-5"].ack()
            await consumer.settle()  # a round trip: the broker has read every frame before it
            assert consumer.consuming  # no PRECONDITION_FAILED closed the channel
        finally:
            await consumer.close()
            await connection.close()
    (channel,) = {s.channel for s in tap.settles}
    assert tap.settles == [
        Settle("reject", channel, 2, False), Settle("ack", channel, 3, True),
        Settle("reject", channel, 5, False), Settle("ack", channel, 4, True),
        Settle("ack", channel, 6, True),
    ]  # fmt: skip
    assert await depth(broker, "work") == 0  # nothing requeued by the close: every delivery was settled
    dead = await drain(broker, "work.quarantine")
    assert sorted(m.message_id or "" for m in dead) == ["m-1", "m-4"]


@pytest.mark.version_independent
async def test_jobs_finishing_in_one_turn_are_acked_by_one_multiple_ack(broker: BrokerSettings, tmp_path: Path):
    """The worker's acks as the broker receives them: four jobs released together, one basic.ack frame."""
    app = await make_app(broker, tmp_path)
    running: list[int] = []
    release = asyncio.Event()

    @app.job("gate", queue="work")
    async def gate(payload: dict[str, int], ctx: JobContext) -> None:
        running.append(payload["i"])
        await release.wait()

    async with FrameTap(broker) as tap, running_worker(app, tap.settings, concurrency=4) as (_, rec):
        for i in range(8):
            await app.enqueue("gate", {"i": i})
        deadline = time.monotonic() + 10
        while len(running) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert len(running) == 4
        assert tap.acks() == []  # nothing settled while they run
        release.set()  # the four finish in the same turn of the loop
        await rec.wait_for(lambda o: len(o) == 8)
    await app.close()
    assert [o.kind for o in rec.outcomes] == ["succeeded"] * 8
    acks = tap.acks()
    (channel,) = {a.channel for a in acks}
    assert acks[0] == Settle("ack", channel, 4, True), acks  # deliveries 1-4, one frame
    assert len(acks) < 8, acks  # fewer ack frames than jobs
    assert all(a.multiple for a in acks), acks  # each covers every delivery before it: none left behind
    assert [a.tag for a in acks] == sorted({a.tag for a in acks})
    assert acks[-1].tag == 8
    assert [s for s in tap.settles if s.method != "ack"] == []
    assert await depth(broker, "work") == 0


class RawBytes(str):
    """A str whose UTF-8 encoding is given bytes: puts a non-UTF-8 short string on the wire through pamqp."""

    raw: bytes

    def __new__(cls, raw: bytes) -> RawBytes:
        obj = super().__new__(cls, raw.decode("latin-1"))
        obj.raw = raw
        return obj

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


async def publish_raw(
    broker: BrokerSettings, body: bytes, properties: aiormq.spec.Basic.Properties, routing_key: str = "work"
) -> None:
    connection = await connect(broker)
    try:
        channel = await connection.channel()
        underlay = await channel.get_underlay_channel()
        await underlay.basic_publish(body, exchange="", routing_key=routing_key, properties=properties)
    finally:
        await connection.close()


async def raw_then_canary(broker: BrokerSettings, tmp_path: Path, props: aiormq.spec.Basic.Properties) -> list[Outcome]:
    """Publish one raw message to ``work``, then a good job behind it; both must be handled and the worker stay up.

    Returns the two outcomes (in the order they were recorded).
    """
    app = await make_app(broker, tmp_path)
    done: list[int] = []

    @app.job("note", queue="work")
    async def note(payload: dict[str, int], ctx: JobContext) -> None:
        done.append(payload["i"])

    async with running_worker(app, broker, concurrency=2) as (worker, rec):
        await publish_raw(broker, b'{"i": 1}', props)
        await app.enqueue("note", {"i": 2})  # behind it: must still run
        await rec.wait_for(lambda o: len(o) == 2, timeout=15)
        assert worker.readiness()[0]  # the connection lived
    await app.close()
    assert done == [2]
    return rec.outcomes


async def test_a_type_and_message_id_that_are_not_utf8_are_quarantined_not_a_stall(
    broker: BrokerSettings, tmp_path: Path
):
    props = aiormq.spec.Basic.Properties(
        content_type="application/json", message_type=RawBytes(b"sl\xffow"), message_id=RawBytes(b"\xff\xfe-id")
    )
    outcomes = await raw_then_canary(broker, tmp_path, props)
    (bad,) = [o for o in outcomes if o.kind == "quarantined"]
    assert bad.job_id == "\ufffd\ufffd-id"
    (copy,) = await drain(broker, "work.quarantine")
    assert copy.message_id == "\ufffd\ufffd-id"
    assert copy.type == "sl\ufffdow"
    assert copy.headers["amqpjobs-reason"] == "unknown-job"


@pytest.mark.parametrize("pad", ["x" * 130_900, "\u20ac" * 43_600], ids=["ascii", "three-byte-characters"])
async def test_a_copy_too_big_for_a_frame_is_rejected_to_quarantine_and_the_connection_lives(
    broker: BrokerSettings, tmp_path: Path, pad: str
):
    """The evidence would push the headers over frame_max: dead-lettered by the broker instead."""
    props = aiormq.spec.Basic.Properties(
        content_type="application/json", message_type="nope", message_id="huge", headers={"pad": pad}
    )
    outcomes = await raw_then_canary(broker, tmp_path, props)
    assert sorted(o.kind for o in outcomes) == ["quarantined", "succeeded"]  # rejected into quarantine, so reported
    (dead,) = await drain(broker, "work.quarantine")
    assert dead.message_id == "huge"
    assert dead.headers["pad"] == pad
    death = dead.headers["x-death"][0]  # type: ignore[index]
    assert death["reason"] == "rejected"  # type: ignore[index,call-overload]
    assert await depth(broker, "work") == 0


async def test_header_names_and_values_that_are_not_utf8_keep_the_worker_going(broker: BrokerSettings, tmp_path: Path):
    """A bad header name decodes with U+FFFD; a bad header value (bytes) is copied as a byte array."""
    props = aiormq.spec.Basic.Properties(
        content_type="application/json", message_type="nope", message_id="bad-headers",
        headers={RawBytes(b"k\xff"): 1, "v": RawBytes(b"\xff\xfe")},
    )  # fmt: skip
    await raw_then_canary(broker, tmp_path, props)
    (copy,) = await drain(broker, "work.quarantine")
    assert copy.message_id == "bad-headers"
    assert copy.headers["amqpjobs-reason"] == "unknown-job"  # our evidence, not a broker dead-letter
    assert copy.headers["k\ufffd"] == 1
    assert bytes(copy.headers["v"]) == b"\xff\xfe"  # type: ignore[arg-type]


SHARDED = """
[[exchange]]
name = "jobs"

[[job_queue]]
name = "split"
exchange = "jobs"
shards = 2
"""


async def test_sigterm_starts_no_delivery_waiting_for_a_shared_slot(broker: BrokerSettings, tmp_path: Path):
    """One slot on a sharded job queue: after short jobs the worker holds a look-ahead delivery
    that waits for the slot; SIGTERM then starts it not, and it goes back unmarked."""
    path = tmp_path / "s.toml"
    path.write_text(SHARDED)
    await apply_topology(path, broker)
    app = App("split", topology=load_topology(path).topology, url=broker.url)
    started: list[int] = []
    long_running = asyncio.Event()

    @app.job("slow", queue="split")
    async def slow(payload: dict[str, int], ctx: JobContext) -> None:
        started.append(payload["i"])
        if payload["i"] >= 10:
            long_running.set()
            await asyncio.sleep(2.0)
        else:
            await asyncio.sleep(0.01)  # short jobs: the worker takes one look-ahead delivery

    for i in range(10):
        await app.enqueue("slow", {"i": i}, tenant=f"t{i}")
    worker = Worker(app, broker, WorkerOptions(queues=("split",), concurrency=1, grace=10))
    running = asyncio.create_task(worker.run())
    await asyncio.wait_for(worker.ready.wait(), 10)
    (dispatcher,) = worker._consumers
    assert isinstance(dispatcher, ShardDispatcher)
    while len(started) < 10:
        await asyncio.sleep(0.01)
    for i in range(10, 16):
        await app.enqueue("slow", {"i": i}, tenant=f"t{i}")
    await asyncio.wait_for(long_running.wait(), 10)
    deadline = time.monotonic() + 5
    while dispatcher.waiting == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert dispatcher.waiting == 1  # a delivery held, waiting for the one slot
    worker.request_stop()
    code = await asyncio.wait_for(running, 20)
    await app.close()
    assert code == 0
    assert len(started) == 11, started  # the ten short ones and the long one running at SIGTERM
    assert worker.stats["succeeded"] == 11
    left = await drain(broker, "split.shard-0") + await drain(broker, "split.shard-1")
    assert len(left) == 5, [m.message_id for m in left]  # the waiting one back in its shard, 4 never taken
    assert not [m for m in left if m.redelivered or "amqpjobs-starts" in (m.headers or {})]
