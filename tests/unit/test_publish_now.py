"""A publish queued in one step: the bytes aiormq would queue, its bookkeeping, and when it declines."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import aiormq
import pytest
from aiormq.abc import ChannelFrame
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from amqpjobs.wire.copies import ExactProperties
from amqpjobs.wire.publish_now import queue_publish, same_id_in_flight


@dataclass
class Channel:
    """The attributes of ``aiormq.Channel`` that ``basic_publish`` and :func:`queue_publish` use."""

    frame_max: int = 4096
    room: int = 0
    number: int = 3
    publisher_confirms: bool = True
    delivery_tag: int = 0
    confirmations: dict[int, asyncio.Future[Any]] = field(default_factory=dict)
    message_id_delivery_tag: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.is_closed = False
        self._Channel__lock = asyncio.Lock()  # aiormq's private lock (Channel.lock is a context manager around it)
        queue: asyncio.Queue[ChannelFrame] = asyncio.Queue(self.room)
        self.connection = SimpleNamespace(write_queue=queue, connection_tune=SimpleNamespace(frame_max=self.frame_max))

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()


def queued(channel: Channel, *args: Any) -> asyncio.Future[Any] | None:
    return queue_publish(cast(aiormq.Channel, channel), *args)


def aiormqs_bytes(channel: Channel, exchange: str, routing_key: str, body: bytes, props: ExactProperties) -> bytes:
    """What ``aiormq.Channel.basic_publish(..., mandatory=True)`` puts on the write queue for the same publish."""
    size = channel.frame_max - 8  # aiormq's max_content_size
    bodies = [ContentBody(body[at : at + size]) for at in range(0, len(body), size)]
    frames: list[Any] = [spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True),
              ContentHeader(properties=props, body_size=len(body)), *bodies]  # fmt: skip
    return ChannelFrame.marshall(channel_number=channel.number, frames=frames).payload


PROPS = ExactProperties(spec.Basic.Properties(message_id="job-1", delivery_mode=2, headers={"n": 7}).marshal(), "job-1")


@pytest.mark.parametrize("size", [0, 1, 4088, 4089, 10_240])
async def test_the_queued_frames_are_the_bytes_aiormq_would_queue(size: int):
    channel = Channel()
    body = bytes(range(256)) * (size // 256 + 1)
    body = body[:size]
    confirmation = queued(channel, "jobs", "rk", body, PROPS)
    assert confirmation is not None
    frame = channel.connection.write_queue.get_nowait()
    assert frame.payload == aiormqs_bytes(channel, "jobs", "rk", body, PROPS)
    assert (frame.should_close, frame.drain_future) == (False, None)
    confirmation.cancel()


async def test_it_takes_the_next_delivery_tag_and_maps_the_message_id_until_the_confirm():
    channel = Channel(delivery_tag=41)
    first = queued(channel, "jobs", "rk", b"{}", PROPS)
    other = ExactProperties(spec.Basic.Properties(message_id="job-2").marshal(), "job-2")
    second = queued(channel, "jobs", "rk", b"{}", other)
    assert first is not None
    assert second is not None
    assert channel.delivery_tag == 43
    assert channel.confirmations == {42: first, 43: second}
    assert channel.message_id_delivery_tag == {"job-1": 42, "job-2": 43}
    first.set_result(spec.Basic.Ack(delivery_tag=42))
    await asyncio.sleep(0)  # done callbacks run in the next step
    assert channel.message_id_delivery_tag == {"job-2": 43}
    assert channel.connection.write_queue.qsize() == 2


async def test_a_message_id_published_again_is_left_mapped_to_the_newer_publish():
    channel = Channel()
    first = queued(channel, "jobs", "rk", b"{}", PROPS)
    second = queued(channel, "jobs", "rk", b"{}", PROPS)
    assert first is not None
    assert second is not None
    first.cancel()
    await asyncio.sleep(0)
    assert channel.message_id_delivery_tag == {"job-1": 2}


@pytest.mark.parametrize(
    ("case", "change"),
    [
        ("properties pamqp encodes", lambda ch: {"properties": spec.Basic.Properties(message_id="x")}),
        ("no message id (aiormq would invent one)", lambda ch: {"properties": ExactProperties(b"\x00\x00", "")}),
        ("a channel without confirms", lambda ch: setattr(ch, "publisher_confirms", False)),
        ("a closed channel (aiormq raises ChannelInvalidStateError)", lambda ch: setattr(ch, "is_closed", True)),
        ("a routing key over 255 bytes", lambda ch: {"routing_key": "k" * 256}),
        ("an exchange name pamqp refuses", lambda ch: {"exchange": "bad name!"}),
    ],
)
async def test_it_declines_what_aiormq_must_decide(case: str, change: Any):
    channel = Channel(delivery_tag=5)
    args = {"exchange": "jobs", "routing_key": "rk", "body": b"{}", "properties": PROPS}
    args.update(change(channel) or {})
    assert queued(channel, args["exchange"], args["routing_key"], args["body"], args["properties"]) is None, case
    assert (channel.delivery_tag, channel.confirmations, channel.connection.write_queue.qsize()) == (5, {}, 0)


async def test_it_declines_while_the_channel_lock_is_held_or_the_write_queue_is_full():
    channel = Channel(room=1)
    async with channel._Channel__lock:
        assert queued(channel, "jobs", "rk", b"{}", PROPS) is None
    channel.connection.write_queue.put_nowait(ChannelFrame(payload=b"x", should_close=False))
    assert queued(channel, "jobs", "rk", b"{}", PROPS) is None
    assert channel.delivery_tag == 0


async def test_a_publish_of_the_same_message_id_in_flight_is_found_until_it_is_answered():
    channel = Channel()
    underlay = cast(aiormq.Channel, channel)
    assert same_id_in_flight(underlay, "job-1") is None
    first = queued(channel, "jobs", "rk", b"{}", PROPS)
    assert first is not None
    assert same_id_in_flight(underlay, "job-1") is first
    assert same_id_in_flight(underlay, "job-2") is None
    assert same_id_in_flight(underlay, "") is None
    assert same_id_in_flight(underlay, None) is None
    first.set_result(spec.Basic.Ack(delivery_tag=1))
    assert same_id_in_flight(underlay, "job-1") is None  # answered: its entry may linger a step, not waited for
    await asyncio.sleep(0)
    assert channel.message_id_delivery_tag == {}
