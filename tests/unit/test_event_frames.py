"""An outcome event's publish frames, packed from cached bytes, are pamqp's byte for byte (no broker)."""

from __future__ import annotations

from pamqp import commands
from pamqp.body import ContentBody
from pamqp.frame import marshal
from pamqp.header import ContentHeader

from amqpjobs.topology.naming import EVENTS_EXCHANGE
from amqpjobs.wire.event_frames import EventFrames
from amqpjobs.wire.events import EVENT_PROPERTIES

FRAME_MAX_LIMIT = 131_072 - 8  # RabbitMQ's default frame_max, less a frame's 8 bytes of head and end


def pamqp_frames(
    number: int, limit: int, publishes: list[tuple[str, bytes]], props: commands.Basic.Properties
) -> bytes:
    """What pamqp marshals for each publish (as aiormq would frame it, bodies split at ``limit``)."""
    out = b""
    for routing_key, body in publishes:
        out += marshal(commands.Basic.Publish(exchange=EVENTS_EXCHANGE, routing_key=routing_key), number)
        out += marshal(ContentHeader(0, len(body), props), number)
        out += b"".join(marshal(ContentBody(body[i : i + limit]), number) for i in range(0, len(body), limit))
    return out


KEYS = ["mail.succeeded", "mail.quarantined", "ünïcode-queue.retried", "q" * 240 + ".abandoned", "a.b.c.handed_back"]
SIZES = [0, 1, 99, 100, 101, 250, 299, 300, 301, 1_000]


def test_each_publish_of_a_batch_is_pamqps_frames_for_every_channel_key_and_body_size() -> None:
    for number in (1, 2, 255, 256, 65_535):
        for limit in (100, 300, FRAME_MAX_LIMIT):
            frames = EventFrames(number, EVENTS_EXCHANGE, EVENT_PROPERTIES)
            publishes = [
                (KEYS[i % len(KEYS)], (b'{"v":1,"x":"' + b"\xc3\xa9" * size)[:size]) for i, size in enumerate(SIZES)
            ]
            for one in publishes:  # each alone, and all in one batch (twice: the cached frames again)
                assert frames.payload([one], limit) == pamqp_frames(number, limit, [one], EVENT_PROPERTIES)
            assert frames.payload(publishes * 2, limit) == pamqp_frames(number, limit, publishes * 2, EVENT_PROPERTIES)


def test_a_body_larger_than_frame_max_is_split_as_pamqp_splits_it() -> None:
    frames = EventFrames(7, EVENTS_EXCHANGE, EVENT_PROPERTIES)
    body = bytes(range(256)) * 1_100  # 281,600 bytes: 3 body frames at the default frame_max
    for size in (FRAME_MAX_LIMIT - 1, FRAME_MAX_LIMIT, FRAME_MAX_LIMIT + 1, 2 * FRAME_MAX_LIMIT, len(body)):
        one = ("mail.retried", body[:size])
        assert frames.payload([one], FRAME_MAX_LIMIT) == pamqp_frames(7, FRAME_MAX_LIMIT, [one], EVENT_PROPERTIES)
    three = frames.payload([("mail.retried", body)], FRAME_MAX_LIMIT)
    assert three.count(b"\xce\x03\x00\x07") == 3  # a header's end then a body frame's head, three times


def test_other_properties_are_marshalled_by_pamqp_too_and_the_key_cache_stays_bounded() -> None:
    props = commands.Basic.Properties(
        content_type="text/plain", delivery_mode=2, headers={"k": "v", "n": 3}, message_id="m-1", priority=5
    )
    frames = EventFrames(3, "other", props)
    publishes = [(f"key-{i}", b"x" * (i % 400)) for i in range(1_200)]  # past the cache's 512 keys: cleared, rebuilt
    expected = b""
    for routing_key, body in publishes:
        expected += marshal(commands.Basic.Publish(exchange="other", routing_key=routing_key), 3)
        expected += marshal(ContentHeader(0, len(body), props), 3)
        expected += marshal(ContentBody(body), 3) if body else b""
    assert frames.payload(publishes, FRAME_MAX_LIMIT) == expected
    assert len(frames._starts) <= 512
