"""A resume that meets its channel closed, while aio-pika reopens it, says no WARNING: the reopen consumes.

A worker resumes its consumers after a pause (an operator's ``resume``, the pause flags read
again after a reconnect). When that resume came while the channel was closed and being
reopened (after a reconnect, or a channel error), it logged ``consuming work again failed (the
channel consuming 'work' is closed (it is opened again)); retrying every second`` beside the
reopen's own ``consuming work again after a reconnect``: a WARNING for a consume that was
never at risk (seen in 1 of 4 runs of ``test_down_node_lines`` on 3.10.8, the management API
closed too).
"""

from __future__ import annotations

import contextlib
import logging

import aio_pika
import aiormq
import pytest

from amqpjobs.wire.connection import connect
from amqpjobs.wire.consume import WorkQueueConsumer
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import depth, raw_channel, until

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]

QUEUE = "reopening"


async def fill(broker: BrokerSettings, n: int) -> None:
    async with raw_channel(broker) as ch:
        await ch.declare_queue(QUEUE, durable=True)
        for i in range(n):
            await ch.default_exchange.publish(aio_pika.Message(b"{}", message_id=f"m-{i}"), routing_key=QUEUE)


async def test_a_resume_on_a_channel_being_reopened_leaves_the_consume_to_the_reopen(
    broker: BrokerSettings, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[str] = []

    async def handler(delivery: Delivery) -> None:
        got.append(str(delivery.message_id))
        await delivery.ack()

    await fill(broker, 0)
    connection = await connect(broker)
    consumer = WorkQueueConsumer(connection, QUEUE, 2, handler)
    try:
        await consumer.start()
        await consumer.pause()
        assert consumer.channel is not None
        underlay = await consumer.channel.get_underlay_channel()
        with contextlib.suppress(aiormq.exceptions.ChannelNotFoundEntity):  # 404 closes the channel
            await underlay.queue_declare("no-such-queue-here", passive=True)
        assert underlay.is_closed  # aio-pika reopens it (a robust channel)
        with caplog.at_level(logging.INFO, logger="amqpjobs.wire"):
            await consumer.resume()  # before the reopen: its consume meets the closed channel
            await fill(broker, 3)
            await until(lambda: len(got) == 3)
        assert sorted(got) == ["m-0", "m-1", "m-2"]  # each once
        assert await depth(broker, QUEUE) == 0
        said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "amqpjobs.wire"]
        warnings = [m for level, m in said if level == "WARNING"]
        assert len(warnings) == 1, said  # the channel error we caused, said once
        assert warnings[0].startswith(f"the channel consuming {QUEUE} was closed (NOT_FOUND"), said
        assert [m for _, m in said if m.startswith(f"consuming {QUEUE} again")] == [
            f"consuming {QUEUE} again after a reconnect"
        ], said
    finally:
        await consumer.close()
        await connection.close()
        async with raw_channel(broker) as ch:
            await ch.queue_delete(QUEUE)
