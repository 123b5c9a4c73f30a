"""The blocking publisher's own frame writing and confirm reading, checked against pamqp's encoding."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from pamqp import commands as spec
from pamqp import frame as frames
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from amqpjobs.errors import PublishError
from amqpjobs.message import OutgoingMessage
from amqpjobs.wire.blocking import BlockingPublisher
from amqpjobs.wire.frame_socket import Closed, FrameSocket
from amqpjobs.wire.settings import broker_settings


def publisher(frame_max: int = 4096) -> BlockingPublisher:
    one = BlockingPublisher(broker_settings("amqp://guest:guest@127.0.0.1:1/"), "t")
    one._frame_max = frame_max
    return one


@pytest.fixture
def wired() -> Iterator[tuple[BlockingPublisher, socket.socket]]:
    """A publisher whose connection is one end of a socket pair; the other end plays the broker."""
    ours, broker = socket.socketpair()
    one = publisher()
    one._io = FrameSocket(ours, 1.0)
    yield one, broker
    ours.close()
    broker.close()


def unmarshal_all(data: bytes) -> list[tuple[int, object]]:
    out: list[tuple[int, object]] = []
    while data:
        used, channel, frame = frames.unmarshal(data)
        out.append((channel, frame))
        data = data[used:]
    return out


def test_a_publish_is_pamqps_method_header_and_body_frames_split_at_frame_max():
    properties = spec.Basic.Properties(content_type="application/json", delivery_mode=2, message_id="m-1",
                                       headers={"amqpjobs-job": "a", "n": 7})  # fmt: skip
    body = bytes(range(256)) * 40  # 10,240 bytes: three body frames of at most 4,088
    got = unmarshal_all(publisher()._payload("jobs", "rk", body, properties.marshal()))
    assert [channel for channel, _ in got] == [1, 1, 1, 1, 1]
    method, header, *bodies = (frame for _, frame in got)
    assert isinstance(method, spec.Basic.Publish)
    assert (method.exchange, method.routing_key, method.mandatory) == ("jobs", "rk", True)
    assert isinstance(header, ContentHeader)
    assert header.body_size == 10_240
    assert header.properties.message_id == "m-1"
    assert header.properties.headers == {"amqpjobs-job": "a", "n": 7}
    assert all(isinstance(b, ContentBody) for b in bodies)
    assert [len(b.value) for b in bodies] == [4088, 4088, 2064]  # type: ignore[attr-defined]
    assert b"".join(b.value for b in bodies) == body  # type: ignore[attr-defined]


def test_an_empty_body_has_no_body_frame():
    got = unmarshal_all(publisher()._payload("", "q", b"", spec.Basic.Properties(message_id="x").marshal()))
    assert [type(frame).__name__ for _, frame in got] == ["Publish", "ContentHeader"]


def test_confirms_are_read_by_hand_and_by_pamqp_alike(wired: tuple[BlockingPublisher, socket.socket]):
    one, broker = wired
    one._tag = 3
    broker.sendall(frames.marshal(spec.Basic.Ack(delivery_tag=1), 1))  # the hand-read form
    broker.sendall(frames.marshal(spec.Basic.Nack(delivery_tag=2), 1))  # through pamqp
    broker.sendall(frames.marshal(spec.Basic.Ack(delivery_tag=3, multiple=True), 1)[:9])  # in two reads
    broker.sendall(frames.marshal(spec.Basic.Ack(delivery_tag=3, multiple=True), 1)[9:])
    one._confirm(3, deadline=time.monotonic() + 5)
    assert one._confirmed == 3
    assert one._nacked == {2}
    assert one._io is not None
    assert one._io.buffer == bytearray()


def test_a_nack_with_multiple_names_every_tag_up_to_it(wired: tuple[BlockingPublisher, socket.socket]):
    one, broker = wired
    one._tag = 4
    one._confirmed = 1
    broker.sendall(frames.marshal(spec.Basic.Nack(delivery_tag=4, multiple=True), 1))
    one._confirm(4, deadline=time.monotonic() + 5)
    assert (one._confirmed, one._nacked) == (4, {2, 3, 4})


def test_bytes_that_are_no_frame_close_the_connection_and_a_silent_one_times_out(
    wired: tuple[BlockingPublisher, socket.socket],
):
    one, broker = wired
    one._tag = 1
    broker.sendall(bytes.fromhex("09000100000001") + b"x\xce")  # frame type 9: no such type
    with pytest.raises(Closed, match="no AMQP frame"):
        one._confirm(1, deadline=time.monotonic() + 5)
    ours, theirs = socket.socketpair()
    quiet = FrameSocket(ours, 1.0)
    with pytest.raises(TimeoutError):
        quiet.read(deadline=0.0)
    theirs.close()
    with pytest.raises(Closed, match="closed the connection"):
        quiet.read(deadline=time.monotonic() + 5)
    ours.close()


def test_a_close_under_the_publish_is_worded_as_the_async_path_words_it(
    wired: tuple[BlockingPublisher, socket.socket],
):
    """A forced close reads as aiormq's ConnectionClosed does ("[Errno 320] ..."), a channel close as its reply text."""
    one, broker = wired
    forced = "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
    broker.sendall(frames.marshal(spec.Connection.Close(reply_code=320, reply_text=forced, class_id=0, method_id=0), 0))
    with pytest.raises(PublishError) as raised:
        one.publish("jobs", "work", OutgoingMessage(body=b"{}", message_id="m-1"))
    assert f"the channel or connection closed under the publish to 'jobs' / 'work' ([Errno 320] {forced})" in str(
        raised.value
    )
    assert one._io is None  # dropped: the next publish opens a new connection
    ours, theirs = socket.socketpair()
    one._io = FrameSocket(ours, 1.0)
    denied = "ACCESS_REFUSED - write access to exchange 'jobs' in vhost '/' refused for user 'u'"
    theirs.sendall(frames.marshal(spec.Channel.Close(reply_code=403, reply_text=denied, class_id=60, method_id=40), 1))
    with pytest.raises(PublishError) as raised:
        one.publish("jobs", "work", OutgoingMessage(body=b"{}", message_id="m-2"))
    assert f"under the publish to 'jobs' / 'work' ({denied})" in str(raised.value)
    assert theirs.recv(4096).endswith(frames.marshal(spec.Channel.CloseOk(), 1))  # the close answered
    ours.close()
    theirs.close()
