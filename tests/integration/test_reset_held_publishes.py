"""What ``wire/reset.py`` rests on, on every broker version: a blocked connection reset drops what it held unread.

Replay and park end their publishing connection with a TCP reset when a resource alarm holds
their copies unread (:func:`amqpjobs.wire.reset.reset`): the broker must then store none of
them, or a job would be in two places. Measured on 3.10 only when written; the same held on
4.0.5 and 4.3.6 (helper-187). The alarm is the suite's node's own, raised with
``set_vm_memory_high_watermark`` and cleared after (serial: it blocks every publisher).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import contextmanager

import aio_pika
import pytest

from amqpjobs.wire.connection import connect
from amqpjobs.wire.reset import reset
from amqpjobs.wire.settings import BrokerSettings
from tests.conftest import BrokerRoot
from tests.integration.helpers import depth, raw_channel, wait_until

pytestmark = pytest.mark.broker  # version-dependent: the broker's handling of a reset, on each version


@contextmanager
def memory_alarm(broker_root: BrokerRoot) -> Iterator[None]:
    """The node's memory alarm raised (a watermark no node stays under), and its own watermark back whatever happened.

    The watermark it had is restored (3.10's default is 0.4, 4.x's 0.6; ``{absolute, N}`` too).
    """
    was = broker_root.ctl("eval", "vm_memory_monitor:get_vm_memory_high_watermark().").stdout.strip()
    absolute = re.fullmatch(r"\{absolute,\s*(\d+)\}", was)
    restore = ("absolute", absolute[1]) if absolute else (str(float(was)),)
    broker_root.ctl("set_vm_memory_high_watermark", "0.0000001")
    try:
        yield
    finally:
        broker_root.ctl("set_vm_memory_high_watermark", *restore)


@pytest.mark.serial  # raises the node's memory alarm
@pytest.mark.timeout(90)
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
async def test_publishes_held_by_an_alarm_are_dropped_when_their_connection_is_reset(
    broker_root: BrokerRoot, broker: BrokerSettings, queue_type: str
) -> None:
    async with raw_channel(broker) as ch:
        await ch.declare_queue("held", durable=True, arguments={"x-queue-type": queue_type})
    connection = await connect(broker, wait=10, name="held")
    channel = await connection.channel(publisher_confirms=False)
    with memory_alarm(broker_root):
        await wait_until(lambda: "memory" in broker_root.ctl("eval", "rabbit_alarm:get_alarms().").stdout, 20,
                         "the memory alarm")  # fmt: skip
        await asyncio.sleep(1.0)  # the connection is blocked once it publishes
        for i in range(3):
            await channel.default_exchange.publish(aio_pika.Message(f"m{i}".encode(), delivery_mode=2), "held")
        await asyncio.sleep(1.0)
        assert await reset(connection) is True
    await asyncio.sleep(3.0)  # what the broker would read of it, it has read by now
    assert await depth(broker, "held") == 0
