"""Deliveries taken straight off aiormq's reader (:mod:`amqpjobs.wire.delivery_tap`) against the real broker.

A body larger than ``frame_max`` comes in several body frames, an empty one in none; the
consumer and the lease must see each whole, in order, with the broker's delivery tags, and
the broker must take their acks. On the lease's channel, ``basic.get`` and a passive
declare (frames the tap leaves to aiormq) keep working between deliveries.
"""

from __future__ import annotations

import asyncio

import aio_pika
import pytest

from amqpjobs.wire import delivery_tap
from amqpjobs.wire.acks import DeliveryChannelClosed
from amqpjobs.wire.connection import connect
from amqpjobs.wire.consume import WorkQueueConsumer
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.delivery_tap import DeliveryTap
from amqpjobs.wire.lane import Lane
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, raw_channel, until

pytestmark = pytest.mark.broker

#: Bodies: empty (no body frame), over three frames at the default frame_max of 131,072 bytes, and small.
BODIES = [b"", bytes(range(256)) * 1200, b'{"i": 3}']


async def fill(broker: BrokerSettings, queue: str, bodies: list[bytes]) -> None:
    async with raw_channel(broker) as ch:
        await ch.declare_queue(queue, durable=True)
        for i, body in enumerate(bodies):
            message = aio_pika.Message(body, message_id=f"m-{i}", headers={"i": i, "size": len(body)})
            await ch.default_exchange.publish(message, routing_key=queue)


@pytest.mark.parametrize("tapped", [True, False], ids=["tapped", "through-aiormq"])
async def test_a_consumer_gets_every_body_whole_in_order_and_its_acks_settle(
    broker: BrokerSettings, tapped: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same on both paths: the tap, and aiormq's own (an aiormq the tap was not audited against)."""
    if not tapped:
        monkeypatch.setattr(delivery_tap, "_audited", False)
    await fill(broker, "tapped", BODIES)
    got: list[Delivery] = []

    async def handler(delivery: Delivery) -> None:
        got.append(delivery)
        await delivery.ack()

    connection = await connect(broker)
    consumer = WorkQueueConsumer(connection, "tapped", 2, handler)
    try:
        await consumer.start()
        assert consumer._consuming_on is not None
        assert isinstance(consumer._consuming_on.frames, DeliveryTap) is tapped
        await until(lambda: len(got) == 3)
        await consumer.settle()
        assert [d.body for d in got] == BODIES
        assert [d.delivery_tag for d in got] == [1, 2, 3]
        assert [(d.message_id, d.headers) for d in got] == [(f"m-{i}", {"i": i, "size": len(b)}) for i, b in
                                                            enumerate(BODIES)]  # fmt: skip
        assert [d.queue for d in got] == ["tapped"] * 3
        assert await depth(broker, "tapped") == 0
        await consumer.close()
        await fill(broker, "tapped", [b"after"])
        await asyncio.sleep(0.3)
        assert len(got) == 3  # cancelled: nothing more arrives
        assert await depth(broker, "tapped") == 1
    finally:
        await consumer.close()
        await connection.close()


async def test_a_lease_and_gets_share_a_channel(broker: BrokerSettings) -> None:
    await fill(broker, "leased", BODIES)
    await fill(broker, "got", [b"x" * 200_000])
    got: list[Delivery] = []
    hold = asyncio.Event()

    async def handler(delivery: Delivery) -> None:
        got.append(delivery)
        await hold.wait()
        await delivery.ack()

    connection = await connect(broker)
    lane = Lane(connection, "leases")
    try:
        await lane.open(["leased", "got"])
        tag = await lane.lease("leased", 2, handler, lambda: None)
        await until(lambda: len(got) == 2)  # prefetch 2: the third waits in the queue
        taken = await lane.get("got")  # a get-ok and its content between deliveries of the lease
        assert taken is not None
        assert taken.delivery.body == b"x" * 200_000
        assert taken.remaining == 0
        assert await lane.exists("leased")  # a passive declare: its declare-ok goes to aiormq
        await taken.delivery.ack()
        hold.set()
        await until(lambda: len(got) == 3)
        await lane.end_lease(tag)
        await lane.settle()
        assert [d.body for d in got] == BODIES
        assert await depth(broker, "leased") == 0
        assert await depth(broker, "got") == 0
    finally:
        hold.set()
        await lane.close()
        await connection.close()


async def test_a_lease_handler_outlives_its_channel_closing_and_the_broker_redelivers(broker: BrokerSettings) -> None:
    """A lease's handler runs in a task of ours: the channel closing under it does not cancel it.

    aiormq cancels the tasks it started when their channel closes; a run cut off so has no
    outcome. Here the run goes on to its end, its ack is refused (the channel is gone), and
    the broker has the message back, marked redelivered.
    """
    await fill(broker, "closing", [b'{"i": 0}'])
    started, release = asyncio.Event(), asyncio.Event()
    ends: list[str] = []

    async def handler(delivery: Delivery) -> None:
        started.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            ends.append("cancelled")
            raise
        try:
            await delivery.ack()
        except DeliveryChannelClosed:
            ends.append("ack refused")

    connection = await connect(broker)
    lane = Lane(connection, "leases")
    try:
        await lane.open(["closing"])
        await lane.lease("closing", 1, handler, lambda: None)
        await asyncio.wait_for(started.wait(), 10)
        assert lane.channel is not None
        underlay = await lane.channel.get_underlay_channel()
        await underlay.close()  # the channel closes under the running handler
        await asyncio.sleep(0.2)
        release.set()
        await until(lambda: len(ends) == 1)
        assert ends == ["ack refused"]
        assert await depth(broker, "closing") == 1  # back in the queue: nothing was acked
        async with raw_channel(broker) as ch:
            queue = await ch.get_queue("closing", ensure=False)
            back = await queue.get(fail=False)
            assert back is not None
            assert back.redelivered
            assert back.body == b'{"i": 0}'
            await back.ack()
    finally:
        release.set()
        await lane.close()
        await connection.close()
