"""The scheduler's tick transaction (:func:`amqpjobs.wire.ticks.publish_in_transaction`) against the real broker.

A transaction whose job goes to a missing exchange fails on its own channel only: the
connection, which carries the scheduler's election and every other schedule, stays open
(was, on RabbitMQ 4.3: a frame sent behind the failing publish sometimes reached the broker
after it had dropped the channel, which then closed the whole connection with
``504 CHANNEL_ERROR - expected 'channel.open'``).
"""

from __future__ import annotations

import pytest

from amqpjobs.errors import BrokerError
from amqpjobs.jobs.envelope import OutgoingMessage
from amqpjobs.wire import ticks
from amqpjobs.wire.connection import connect
from amqpjobs.wire.settings import BrokerSettings
from tests.integration.helpers import raw_channel

pytestmark = pytest.mark.broker

#: Transactions into the missing exchange. Before the fix, 4.3.6 dropped the connection in 2 of 12 runs of this test
#: (200-300 tries), and the reason was missing from every run on 3.10 and 4.3 (none of one run on 4.0)
TRIES = 300


async def test_transactions_into_a_missing_exchange_fail_alone_with_the_reason_and_the_connection_stays(
    broker: BrokerSettings,
):
    """300 tick transactions (a job to a missing exchange, then the tick record) on one connection:
    each fails with the broker's reason, nothing reaches the record's queue, and the connection
    stays open (was on 4.3: now and then CHANNEL_ERROR "expected 'channel.open'", the connection
    lost; and on 3.10 and 4.3 many failures said "Channel closed by RPC timeout", not the reason)."""
    async with raw_channel(broker) as channel:
        await channel.declare_queue("store", durable=True)
    connection = await connect(broker, name="tick-transactions")
    try:
        transport = connection.transport
        assert transport is not None
        amqp = transport.connection  # the connection under aio-pika's robust one: a reconnect replaces it
        job, record = OutgoingMessage(body=b"job"), OutgoingMessage(body=b"record")
        errors: list[str] = []
        for _ in range(TRIES):
            with pytest.raises(BrokerError) as caught:
                await ticks.publish_in_transaction(
                    connection, [("gone", "k", job, True), ("", "store", record, False)], lambda: True, "tick", "late"
                )
            errors.append(str(caught.value))
            assert not amqp.is_closed, (len(errors), errors)  # a reconnect would have closed it too
        reason = f"tick: NOT_FOUND - no exchange 'gone' in vhost '{broker.vhost}'"
        assert [e for e in errors if e != reason] == []
        async with raw_channel(broker) as channel:
            store = await channel.declare_queue("store", passive=True)
            assert store.declaration_result.message_count == 0
    finally:
        await connection.close()
