"""Server properties read as text by the one bytes-to-text rule (``amqpjobs.text.as_text``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from amqpjobs.wire.connection import broker_info


@pytest.mark.parametrize(
    ("properties", "expected"),
    [
        ({"product": "RabbitMQ", "version": "4.0.5"}, ("RabbitMQ", (4, 0, 5), "4.0.5")),
        ({"product": b"RabbitMQ", "version": b"3.10.8"}, ("RabbitMQ", (3, 10, 8), "3.10.8")),
        ({"product": b"Rabbit\xff", "version": "4.3.6"}, ("Rabbit\ufffd", (4, 3, 6), "4.3.6")),
        ({}, ("", (0,), "0")),
    ],
)
def test_broker_info_reads_server_properties_as_text(
    properties: dict[str, Any], expected: tuple[str, tuple[int, ...], str]
) -> None:
    amqp = SimpleNamespace(server_properties=properties)
    connection: Any = SimpleNamespace(transport=SimpleNamespace(connection=amqp))
    info = broker_info(connection)
    assert (info.product, info.version, info.version_text) == expected
