"""Read (or take) the message at the head of a queue through the management API, not over AMQP.

The management API's "Get messages" (``POST /api/queues/<vhost>/<queue>/get``, RabbitMQ
"Management HTTP API") reads inside the broker, so it reaches a message that no AMQP 0-9-1
delivery can carry (a short string over 255 bytes: :mod:`amqpjobs.jobs.undeliverable`).
Ack mode ``reject_requeue_true`` puts the message back where it was (a peek; on a quorum
queue that counts as a return, like any requeue); ``ack_requeue_false`` removes it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from amqpjobs.errors import ManagementApiError
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings


@dataclass(frozen=True)
class HeadMessage:
    """A message read through the management API.

    Attributes:
        properties: Its basic properties in the API's names (``headers`` a JSON object).
        body: The body's bytes, whole.
        exchange: The exchange it was published to (``""``: the default exchange).
        routing_key: Its routing key.
        redelivered: Whether the broker had delivered it before.

    """

    properties: dict[str, Any]
    body: bytes
    exchange: str
    routing_key: str
    redelivered: bool


def _head(settings: BrokerSettings, queue: str, ackmode: str, position: int = 0) -> HeadMessage | None:
    with ManagementClient(settings) as mgmt:
        path = f"/queues/{quote(settings.vhost, safe='')}/{quote(queue, safe='')}/get"
        got = mgmt.request("POST", path, json={"count": position + 1, "ackmode": ackmode, "encoding": "base64"})
    if not isinstance(got, list) or len(got) <= position:
        return None
    first = got[position]
    try:
        body = (
            base64.b64decode(first["payload"], validate=True)
            if first.get("payload_encoding") == "base64"
            else (str(first["payload"]).encode("utf-8", "surrogatepass"))
        )
        props = first.get("properties") or {}
        return HeadMessage(dict(props) if isinstance(props, dict) else {}, body, str(first.get("exchange", "")),
                           str(first.get("routing_key", "")), bool(first.get("redelivered")))  # fmt: skip
    except (KeyError, TypeError, binascii.Error) as exc:
        raise ManagementApiError(f"the management API's read of {queue!r} answered what we can't read: {exc}") from exc


async def peek_head(settings: BrokerSettings, queue: str) -> HeadMessage | None:
    """The message at the head of ``queue``, left there (None: the queue is empty).

    Raises:
        ManagementApiError, BrokerUnavailableError: the management API refused or can't be reached.

    """
    return await asyncio.to_thread(_head, settings, queue, "reject_requeue_true")


def _first_properties(settings: BrokerSettings, queue: str, count: int) -> list[dict[str, Any]]:
    with ManagementClient(settings) as mgmt:
        path = f"/queues/{quote(settings.vhost, safe='')}/{quote(queue, safe='')}/get"
        got = mgmt.request("POST", path, json={"count": count, "ackmode": "reject_requeue_true", "encoding": "auto",
                                               "truncate": 64})  # fmt: skip
    if not isinstance(got, list):
        raise ManagementApiError(f"the management API's read of {queue!r} answered what we can't read: {got!r}")
    return [dict(m.get("properties") or {}) if isinstance(m, dict) else {} for m in got]


async def peek_properties(settings: BrokerSettings, queue: str, count: int) -> list[dict[str, Any]]:
    """The properties of the first ``count`` messages of ``queue`` in queue order, each left in its place.

    Reads inside the broker, so it reaches past a message no AMQP 0-9-1 delivery can carry (bodies are
    not read: at most 64 bytes of each travel). Each read message counts as redelivered after.

    Raises:
        ManagementApiError, BrokerUnavailableError: the management API refused or can't be reached.

    """
    return await asyncio.to_thread(_first_properties, settings, queue, count)


async def peek_at(settings: BrokerSettings, queue: str, position: int) -> HeadMessage | None:
    """The message at ``position`` (0: the head) of ``queue``, it and those ahead of it left there (None: fewer).

    Raises:
        ManagementApiError, BrokerUnavailableError: the management API refused or can't be reached.

    """
    return await asyncio.to_thread(_head, settings, queue, "reject_requeue_true", position)


async def take_head(settings: BrokerSettings, queue: str) -> HeadMessage | None:
    """Remove the message at the head of ``queue`` and return it (None: the queue was empty).

    Raises:
        ManagementApiError, BrokerUnavailableError: the management API refused or can't be
            reached (then whether it was removed is unknown: read the queue again).

    """
    return await asyncio.to_thread(_head, settings, queue, "ack_requeue_false")
