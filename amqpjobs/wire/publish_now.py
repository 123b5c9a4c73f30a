"""Queueing a confirmed publish's frames on aiormq's connection in one step, without its per-publish objects.

aiormq's ``Channel.basic_publish`` builds a ``Basic.Publish``, a ``ContentHeader`` and body
frames, marshals them through pamqp one by one, and enters three context managers (the
channel's close watcher, a timeout, the channel's lock) and a ``Queue.put`` coroutine around
one write: about a third of the publishing thread's samples in a py-spy profile of ``enqueue``
one at a time; queued here, an enqueue took 257 instead of 277 µs of client CPU (bench/RESULTS.md,
2026-12-03 evening). :func:`queue_publish` does the same bookkeeping as that method, on the same channel
attributes (``delivery_tag``, ``confirmations``, ``message_id_delivery_tag``, a confirmation
future from the channel's future store), and puts the frames
(:func:`~amqpjobs.wire.publish_frames.publish_payload`, the bytes pamqp writes, tested
against it) on the connection's write queue as one ``ChannelFrame``, behind whatever is
queued before it. So aiormq's reader settles it as its own: an ack sets the future, a nack
fails it with ``DeliveryError``, a ``basic.return`` with ``PublishError``, a closed channel
with the close's reason.

It declines (returns None, nothing done) whenever aiormq's own path must decide: properties
not pre-encoded or without a message id (aiormq would invent one), a channel without
confirms, closed, or with its lock held (an operation of its own under way), a write queue with no
room, or a method frame pamqp refuses to encode.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiormq
from aiormq.abc import ChannelFrame

from amqpjobs.wire.copies import ExactProperties
from amqpjobs.wire.publish_frames import publish_payload

#: aiormq's channel lock (``Channel.lock`` holds it, after checking the channel is open).
_LOCK = "_Channel__lock"


def queue_publish(
    underlay: aiormq.Channel, exchange: str, routing_key: str, body: bytes, properties: object
) -> asyncio.Future[Any] | None:
    """Queue a ``mandatory`` publish of ``body`` on ``underlay``; the future of its confirm, or None (not queued).

    Call it with no ``await`` between the caller's checks of the channel and this call (the
    publish goes out behind the frames already queued, or not at all). Await the future (with
    a timeout): it ends as aiormq's ``basic_publish`` would (see the module docstring).

    Args:
        underlay: aiormq's channel, in publisher-confirm mode.
        exchange: The exchange ("" the default one).
        routing_key: The routing key.
        body: The body.
        properties: The message's basic properties: only :class:`~amqpjobs.wire.copies.ExactProperties`
            with a message id is taken here.

    Returns:
        The confirm's future (registered in the channel's ``confirmations``), or None: nothing
        was queued, publish through ``basic_publish``.
    """
    if not isinstance(properties, ExactProperties) or not properties.message_id or not underlay.publisher_confirms:
        return None
    queue = underlay.connection.write_queue
    lock = getattr(underlay, _LOCK, None)  # held by basic_publish and rpc (another aiormq: never taken as free)
    if underlay.is_closed or not isinstance(lock, asyncio.Lock) or lock.locked() or queue.full():
        return None
    try:
        payload = publish_payload(
            underlay.number, exchange, routing_key, body, properties.encoded,
            underlay.connection.connection_tune.frame_max,
        )  # fmt: skip
    except (ValueError, TypeError, OverflowError):  # e.g. a routing key over 255 bytes: aiormq's path says so
        return None
    underlay.delivery_tag += 1
    tag = underlay.delivery_tag
    message_id = properties.message_id
    confirmation = underlay.create_future()
    underlay.confirmations[tag] = confirmation
    ids = underlay.message_id_delivery_tag
    ids[message_id] = tag

    def forget(_: asyncio.Future[Any]) -> None:
        if ids.get(message_id) == tag:
            del ids[message_id]

    confirmation.add_done_callback(forget)
    queue.put_nowait(ChannelFrame(payload=payload, should_close=False))
    return confirmation


def same_id_in_flight(underlay: aiormq.Channel, message_id: str | None) -> asyncio.Future[Any] | None:
    """The confirm's future of a publish of ``message_id`` in flight on ``underlay``, or None.

    A ``basic.return`` carries no delivery tag: the broker sends it before the ``basic.ack`` of
    the same publish (RabbitMQ "Consumer Acknowledgements and Publisher Confirms", "When Will
    Published Messages Be Confirmed by the Broker?"), and aiormq (``Channel._on_return_frame``)
    matches it to its publish by the returned message's ``message_id``, keeping one delivery tag
    per id (the latest). With two publishes of one id in flight, a return would fail the wrong
    one and leave the returned one to be confirmed as if stored, so a publish of that id waits
    for this future first (any outcome). Raises nothing.

    Args:
        underlay: aiormq's channel.
        message_id: The publish's message id (None or "": aiormq invents one; never in flight twice).
    """
    if not message_id:
        return None
    tag = underlay.message_id_delivery_tag.get(message_id)
    earlier = None if tag is None else underlay.confirmations.get(tag)
    return earlier if earlier is not None and not earlier.done() else None
