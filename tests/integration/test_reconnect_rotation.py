"""A lost connection tries each node of its URL list in turn, also while one of them is unreachable.

Before (measured on 3.10, URLs ``node A, 127.0.0.1:9`` where nothing listens): a connection to node A,
closed (a node restart, ``rabbitmqctl close_connection``), tried 127.0.0.1:9 at every 5 s attempt and never
A again, also once A was back: each failed attempt moved on twice (the close of the attempt's transport,
then its failure), so with two nodes it stayed on the dead one, and its line named the other ("could not
reach amqp://...A ([Errno 111] Connect call failed ('127.0.0.1', 9))").
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit, urlunsplit

import pytest

from amqpjobs.wire.cluster import ClusterConnection
from amqpjobs.wire.connection import connect
from amqpjobs.wire.settings import BrokerSettings, broker_settings
from tests.integration.helpers import close_connections

pytestmark = [pytest.mark.broker, pytest.mark.version_independent]


async def test_a_lost_connection_comes_back_to_its_node_past_an_unreachable_one(broker: BrokerSettings):
    parts = urlsplit(broker.url)
    dead = urlunsplit(parts._replace(netloc=f"{parts.username}:{parts.password}@127.0.0.1:9"))
    settings = broker_settings(f"{broker.url},{dead}", broker.management_url)
    connection = await connect(settings, name="rotation-test")
    assert isinstance(connection, ClusterConnection)
    try:
        listed = time.monotonic() + 15
        while not await asyncio.to_thread(close_connections, broker, "rotation-test"):  # listed within a stats interval
            assert time.monotonic() < listed
            await asyncio.sleep(0.3)
        lost_at = time.monotonic()
        while connection.connected.is_set() and time.monotonic() - lost_at < 5:
            await asyncio.sleep(0.05)
        while not connection.connected.is_set():  # before: never (every attempt went to 127.0.0.1:9)
            assert time.monotonic() - lost_at < 20, connection.node.safe_url
            await asyncio.sleep(0.2)
        assert connection.node.address != "127.0.0.1:9"
    finally:
        await connection.close()
