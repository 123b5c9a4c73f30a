"""Frames read by :func:`amqpjobs.wire.frame_reading.get_frame` are aiormq's own reader's, frame for frame.

Both readers get the same bytes in a ``StreamReader`` (whole, cut at every byte, with a
protocol header first, with a broken frame end, failing with a socket error) and must give the
same frames (compared by their marshalled bytes and type) and then the same exception, its
type and message.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pamqp.frame
import pytest
from aiormq.connection import FrameReceiver
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat

from amqpjobs.wire import frame_reading

ORIGINAL = frame_reading._original
#: The comparisons below are with the aiormq reader ours replaces; another aiormq keeps its own (last test).
audited = pytest.mark.skipif(
    frame_reading.source_digest(ORIGINAL) not in frame_reading.AUDITED,
    reason="this aiormq's FrameReceiver.get_frame is not the audited one: ours is not installed over it",
)


def stream() -> bytes:
    """A delivery (method, header, body), a heartbeat, and a delivery on another channel with an empty body."""
    properties = commands.Basic.Properties(content_type="application/json", message_id="m-1", headers={"a": 1})
    parts = [
        pamqp.frame.marshal(commands.Basic.Deliver("ctag", 7, False, "jobs", "mail"), 1),
        pamqp.frame.marshal(ContentHeader(0, 13, properties), 1),
        pamqp.frame.marshal(ContentBody(b'{"to":"a@b"}\n'), 1),
        pamqp.frame.marshal(Heartbeat(), 0),
        pamqp.frame.marshal(commands.Basic.Deliver("c2", 2**63 - 1, True, "", "r\u00e9"), 65535),
        pamqp.frame.marshal(ContentHeader(0, 0, commands.Basic.Properties()), 65535),
    ]
    return b"".join(parts)


async def read_all(get_frame: Any, data: bytes, error: Exception | None = None) -> list[Any]:
    """Each frame ``get_frame`` reads from ``data`` (then ``error``, else EOF), and how it ended."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if error is None:
        reader.feed_eof()
    else:
        reader.set_exception(error)
    receiver = FrameReceiver(reader)
    got: list[Any] = []
    while True:
        try:
            channel, frame = (await get_frame(receiver))[1:]
        except BaseException as exc:  # the kind and message are compared
            got.append(("ended", type(exc).__name__, str(exc), type(exc.__cause__).__name__))
            return got
        got.append((type(frame).__name__, channel, pamqp.frame.marshal(frame, channel)))


def both(data: bytes, error: Exception | None = None) -> tuple[list[Any], list[Any]]:
    return asyncio.run(read_all(ORIGINAL, data, error)), asyncio.run(read_all(frame_reading.get_frame, data, error))


@audited
def test_a_whole_stream_gives_the_same_frames_then_the_same_end() -> None:
    old, new = both(stream())
    assert new == old
    assert [kind for kind, *_ in new] == ["Deliver", "ContentHeader", "ContentBody", "Heartbeat", "Deliver",
                                          "ContentHeader", "ended"]  # fmt: skip
    assert new[-1] == ("ended", "StopAsyncIteration", "", "NoneType")


@audited
def test_a_stream_cut_at_every_byte_ends_the_same_way() -> None:
    data = stream()
    for cut in range(len(data)):
        old, new = both(data[:cut])
        assert new == old, cut
    old, new = both(data[:3])
    assert new[-1] == ("ended", "AMQPConnectionError", "Server connection unexpectedly closed. Read 2 bytes but "
                       "6 bytes expected", "IncompleteReadError")  # fmt: skip


@audited
def test_a_protocol_header_first_is_refused_the_same_way() -> None:
    old, new = both(b"AMQP\x00\x00\x09\x01" + stream())
    assert new == old
    assert new == [("ended", "ProtocolSyntaxError", "Unexpected AMQP protocol header", "NoneType")]


@audited
@pytest.mark.parametrize("damage", ["frame end", "frame type"])
def test_a_broken_frame_fails_the_same_way(damage: str) -> None:
    data = bytearray(stream())
    first = 7 + int.from_bytes(data[3:7], "big")  # the first frame's end octet
    if damage == "frame end":
        data[first] = 0
    else:
        data[first + 1] = 9  # the second frame's type
    old, new = both(bytes(data))
    assert new == old
    assert new[-1][:2] == ("ended", "InvalidFrameError")


@audited
@pytest.mark.parametrize("error", [ConnectionResetError(104, "reset"), ConnectionRefusedError(111, "refused"),
                                   BrokenPipeError(32, "pipe"), TimeoutError("slow")])  # fmt: skip
def test_a_socket_error_mid_frame_is_told_the_same_way(error: Exception) -> None:
    data = stream()
    old, new = both(data[:10], error)
    assert new == old
    assert new[-1][1] == "AMQPConnectionError"
    assert repr(error) in new[-1][2]


def test_it_is_installed_only_over_the_audited_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FrameReceiver, "get_frame", ORIGINAL)
    monkeypatch.setattr(frame_reading, "AUDITED", frozenset({"another aiormq"}))
    assert frame_reading.install_fast_frame_reading() is False
    assert FrameReceiver.get_frame is ORIGINAL
    monkeypatch.undo()
    monkeypatch.setattr(FrameReceiver, "get_frame", ORIGINAL)
    assert frame_reading.install_fast_frame_reading() is True
    assert FrameReceiver.get_frame is frame_reading.get_frame
    assert frame_reading.install_fast_frame_reading() is True


async def read_fed(get_frame: Any, data: bytes, piece: int) -> list[Any]:
    """The frames ``get_frame`` reads while ``data`` arrives ``piece`` bytes at a time, then EOF."""
    reader = asyncio.StreamReader()
    receiver = FrameReceiver(reader)

    async def feed() -> None:
        for at in range(0, len(data), piece):
            reader.feed_data(data[at : at + piece])
            await asyncio.sleep(0)
        reader.feed_eof()

    feeding = asyncio.create_task(feed())
    got: list[Any] = []
    while True:
        try:
            channel, frame = (await get_frame(receiver))[1:]
        except BaseException as exc:
            got.append(("ended", type(exc).__name__, str(exc)))
            break
        got.append((type(frame).__name__, channel, pamqp.frame.marshal(frame, channel)))
    await feeding
    return got


@audited
@pytest.mark.parametrize("piece", [1, 2, 5, 7, 13, 100, 10_000])
def test_frames_arriving_in_pieces_are_the_same_frames(piece: int) -> None:
    data = stream() + pamqp.frame.marshal(ContentBody(b"x" * 70_000), 3)  # one frame over READ_SIZE
    old = asyncio.run(read_fed(ORIGINAL, data, piece))
    new = asyncio.run(read_fed(frame_reading.get_frame, data, piece))
    assert new == old
    assert [kind for kind, *_ in new] == ["Deliver", "ContentHeader", "ContentBody", "Heartbeat", "Deliver",
                                          "ContentHeader", "ContentBody", "ended"]  # fmt: skip


async def read_then_fail(get_frame: Any, data: bytes, error: Exception) -> list[Any]:
    """One frame of ``data`` (all received), then ``error`` set on the stream, then the next read."""
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    receiver = FrameReceiver(reader)
    first = (await get_frame(receiver))[2]
    reader.set_exception(error)
    try:
        await get_frame(receiver)
    except BaseException as exc:
        return [type(first).__name__, type(exc).__name__, str(exc)]
    return [type(first).__name__, "no error"]


@audited
def test_a_socket_error_after_whole_frames_were_received_ends_at_once_as_aiormqs() -> None:
    """aiormq raises the stream's exception before the bytes received ahead of it: frames read ahead are not given."""
    error = ConnectionResetError(104, "reset")
    old = asyncio.run(read_then_fail(ORIGINAL, stream(), error))
    new = asyncio.run(read_then_fail(frame_reading.get_frame, stream(), error))
    assert new == old
    assert new == ["Deliver", "AMQPConnectionError", f"Server connection reset: {error!r}"]


class CountingLock(asyncio.Lock):
    """An ``asyncio.Lock`` that counts how often it was taken."""

    taken = 0

    async def acquire(self) -> Literal[True]:
        self.taken += 1
        return await super().acquire()


@audited
def test_frames_already_read_are_cut_out_without_the_lock_unless_another_reader_holds_it() -> None:
    async def run() -> tuple[list[str], int, bool]:
        reader = asyncio.StreamReader()
        reader.feed_data(stream())
        receiver = FrameReceiver(reader)
        receiver.lock = lock = CountingLock()
        kinds = [type((await frame_reading.get_frame(receiver))[2]).__name__ for _ in range(3)]
        taken = lock.taken  # the first frame read the stream (under the lock); the next two were in its bytes
        async with lock:  # another reader holds it: a frame already read still waits its turn
            waiting = asyncio.ensure_future(frame_reading.get_frame(receiver))
            for _ in range(5):
                await asyncio.sleep(0)
            waited = not waiting.done()
        kinds.append(type((await waiting)[2]).__name__)
        return kinds, taken, waited

    kinds, taken, waited = asyncio.run(run())
    assert kinds == ["Deliver", "ContentHeader", "ContentBody", "Heartbeat"]
    assert taken == 1
    assert waited
