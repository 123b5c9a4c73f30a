"""The dispatcher's lanes against the real broker: a lease holds its prefetch at most, and its cancel is clean."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pytest

from amqpjobs.wire.connection import connect
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.lane import Lane
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import drain, raw_channel, wait_until

pytestmark = pytest.mark.broker


async def fill(broker: BrokerSettings, queue: str, n: int) -> None:
    async with raw_channel(broker) as ch:
        await ch.declare_queue(queue, durable=True)
        for i in range(n):
            await ch.default_exchange.publish(aio_pika.Message(str(i).encode(), message_id=f"m-{i}"), queue)


async def test_a_lease_holds_its_prefetch_and_a_get_says_what_is_left(broker: BrokerSettings):
    await fill(broker, "q", 10)
    connection = await connect(broker)
    lane = Lane(connection, "q")
    got: list[Delivery] = []

    async def hold(delivery: Delivery) -> None:
        got.append(delivery)

    try:
        await lane.open(["q"])
        taken = await lane.get("q")
        assert taken is not None
        assert (taken.delivery.message_id, taken.remaining) == ("m-0", 9)
        await lane.lease("q", 3, hold, lambda: None)
        # the deliveries come in the broker's time (a loaded broker: more than the 0.3 s once slept here)
        await wait_until(lambda: len(got) >= 3, 10, "the lease's 3 deliveries")
        await asyncio.sleep(0.3)  # a fourth, if the prefetch let it through, would be here by now
        assert [d.message_id for d in got] == ["m-1", "m-2", "m-3"]  # the prefetch, no more
        await got[0].ack()
        await taken.delivery.ack()  # a get's tag and a lease's on one channel: acks in any order
        await lane.flush_acks()
        await wait_until(lambda: len(got) >= 4, 10, "the delivery the ack made room for")
        await asyncio.sleep(0.3)  # a fifth would be here by now
        assert [d.message_id for d in got] == ["m-1", "m-2", "m-3", "m-4"]
        for d in got[1:]:
            await d.ack()
        await lane.flush_acks()
    finally:
        await connection.close()
    assert [m.message_id for m in await drain(broker, "q")] == [f"m-{i}" for i in range(5, 10)]


async def test_ending_a_busy_lease_on_a_classic_queue_leaves_nothing_in_flight(broker: BrokerSettings):
    """Deliveries sent before the broker read the cancel arrive before cancel-ok; none come back redelivered."""
    await fill(broker, "busy", 600)
    connection = await connect(broker)
    lane = Lane(connection, "busy")
    got: list[str] = []
    after: list[str] = []
    ended = False

    async def handle(delivery: Delivery) -> None:
        (after if ended else got).append(delivery.message_id or "")
        await delivery.ack()

    try:
        await lane.open(["busy"])
        tag = await lane.lease("busy", 4, handle, lambda: None)
        deadline = time.monotonic() + 10
        while len(got) < 100 and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        await lane.end_lease(tag)  # while deliveries stream
        ended = True
        await lane.flush_acks()
        await asyncio.sleep(0.5)
    finally:
        await connection.close()
    assert after == []
    left = await drain(broker, "busy")
    assert len(got) + len(left) == 600
    assert not [m.message_id for m in left if m.redelivered]


async def test_a_lease_the_broker_cancels_leaves_its_channel_working(broker: BrokerSettings):
    """The broker cancelling a lease (its queue deleted) must not stop the channel's frame reader.

    The lease's cancel callback once removed itself from aiormq's callback set while aiormq
    iterated it: the reader died of "Set changed size during iteration", the channel's close
    waited 10 s for a close-ok nobody read, and aiormq's second ``channel.close`` then made
    the broker drop the whole connection (504 "expected 'channel.open'", CI run 32).
    """
    await fill(broker, "doomed", 1)
    await fill(broker, "kept", 0)
    connection = await connect(broker)
    lane = Lane(connection, "doomed")
    lost: list[str] = []
    kept: list[str] = []

    async def hold(delivery: Delivery) -> None:  # the doomed queue's delivery stays unacked
        pass

    async def take(delivery: Delivery) -> None:
        kept.append(delivery.message_id or "")
        await delivery.ack()

    try:
        await lane.open(["doomed", "kept"])
        await lane.lease("doomed", 1, hold, lambda: lost.append("doomed"))
        async with raw_channel(broker) as ch:
            await ch.queue_delete("doomed")
        await wait_until(lambda: lost == ["doomed"], 10, "the broker's cancel of the lease")
        # the same channel leases again and gets deliveries: its reader still runs
        await asyncio.wait_for(lane.lease("kept", 2, take, lambda: lost.append("kept")), 5)
        await fill(broker, "kept", 3)
        await wait_until(lambda: len(kept) == 3, 10, "the second lease's 3 deliveries")
        assert kept == ["m-0", "m-1", "m-2"]
        await lane.flush_acks()
        assert lane.is_open
        assert connection.is_closed is False
    finally:
        await connection.close()
    assert lost == ["doomed"]
    assert await drain(broker, "kept") == []
