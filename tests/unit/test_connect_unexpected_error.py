"""A first connect that fails with an error aio-pika does not expect ends the connect; it never waits forever.

aio-pika's robust connection reports only its connection errors (``CONNECTION_EXCEPTIONS``)
to a waiting ``connect()``; anything else (a ``UnicodeError`` from ``getaddrinfo``, a
``TypeError`` from ``ssl``) it logs and retries without end, so ``App.enqueue`` hung. Such a
node can't be given through a URL any more (the host check, ``test_broker_url_hosts.py``):
these make one by hand.
"""

from __future__ import annotations

import asyncio

import pytest

from amqpjobs.errors import BrokerUnavailableError
from amqpjobs.wire.cluster import ClusterConnection, Node
from amqpjobs.wire.connection import connect
from amqpjobs.wire.settings import broker_settings

pytestmark = pytest.mark.asyncio

BAD = Node("amqp://u:S3cretPw@a..b:5795/", None, "amqp://u:***@a..b:5795/", "a..b:5795")


async def test_a_cluster_connections_first_connect_raises_what_stopped_it() -> None:
    connection = ClusterConnection([BAD])
    try:
        async with asyncio.timeout(5):
            with pytest.raises(UnicodeError, match="label empty or too long"):
                await connection.connect(timeout=2)
    finally:
        await connection.close()


async def test_connect_names_the_node_and_the_error_and_never_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = broker_settings("amqp://u:S3cretPw@h1:5795/")
    monkeypatch.setattr("amqpjobs.wire.connection.node", lambda url, position=1: BAD)
    async with asyncio.timeout(10):
        with pytest.raises(BrokerUnavailableError) as err:
            await connect(settings, wait=1)
    assert "label empty or too long" in str(err.value)
    assert "S3cretPw" not in str(err.value)


async def test_an_error_outside_the_connection_errors_is_a_broker_error_too(monkeypatch: pytest.MonkeyPatch) -> None:
    async def odd(*args: object, **kwargs: object) -> None:
        raise TypeError("argument must be encoded string without null bytes, not str")  # as ssl says of a NUL

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", odd)
    async with asyncio.timeout(10):
        with pytest.raises(BrokerUnavailableError) as err:
            await connect(broker_settings("amqp://u:S3cretPw@h1:5795/"), wait=1)
    assert str(err.value) == (
        "broker at amqp://u:***@h1:5795/: the connect to amqp://u:***@h1:5795/ failed: "
        "TypeError: argument must be encoded string without null bytes, not str"
    )
