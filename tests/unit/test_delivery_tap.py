"""What :class:`amqpjobs.wire.delivery_tap.DeliveryTap` takes out of a channel's frames, and what it leaves in order.

The tap sits where aiormq's connection reader puts a channel's frames; the frames here are
pamqp's, as the reader decodes them. The channel is a stand-in with aiormq's two attributes
the tap reads (``frames``, ``is_closed``); the broker's side is tested in
tests/integration/test_delivery_tap.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import aiormq
import pytest
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from amqpjobs.wire import delivery_tap
from amqpjobs.wire.delivery import run_handler
from amqpjobs.wire.delivery_tap import DeliveryTap, tap, untap

Deliver = commands.Basic.Deliver


@dataclass
class Channel:
    frames: Any = field(default_factory=asyncio.Queue)
    is_closed: bool = False
    number: int = 7


def deliver(tag: str, n: int) -> Deliver:
    return Deliver(tag, n, False, "jobs", "mail")


def header(size: int) -> ContentHeader:
    return ContentHeader(0, size, commands.Basic.Properties(message_id=f"m-{size}"))


class Seen:
    def __init__(self) -> None:
        self.got: list[tuple[str | None, int | None, int, bytes]] = []

    def __call__(self, frame: Deliver, head: ContentHeader, body: bytes, channel: Any) -> None:
        self.got.append((frame.consumer_tag, frame.delivery_tag, head.body_size, body))


async def feed(t: DeliveryTap, frames: list[Any]) -> None:
    for frame in frames:
        await t.put((0, frame))


def left(channel: Channel) -> list[Any]:
    """The frames that went on to the channel's own queue, in order."""
    queue = channel.frames._inner
    out = []
    while not queue.empty():
        out.append(queue.get_nowait()[1])
    return out


@pytest.fixture
def channel() -> Channel:
    return Channel()


def tapped(channel: Channel) -> DeliveryTap:
    t = tap(cast(aiormq.Channel, channel))
    assert t is not None
    in_place = channel.frames is t
    assert in_place
    return t


async def test_a_delivery_in_several_body_frames_is_one_body_and_nothing_reaches_the_queue(channel: Channel) -> None:
    t, seen = tapped(channel), Seen()
    t.consume("a", seen)
    await feed(t, [deliver("a", 1), header(10), ContentBody(b"0123"), ContentBody(b"4567"), ContentBody(b"89")])
    await feed(t, [deliver("a", 2), header(0)])  # an empty body: no body frame follows
    assert seen.got == [("a", 1, 10, b"0123456789"), ("a", 2, 0, b"")]
    assert left(channel) == []


async def test_other_frames_keep_their_order_for_the_channel_reader(channel: Channel) -> None:
    t, seen = tapped(channel), Seen()
    t.consume("a", seen)
    qos_ok, consume_ok = commands.Basic.QosOk(), commands.Basic.ConsumeOk("a")
    get_ok = commands.Basic.GetOk(5, False, "jobs", "mail", 3)
    frames = [qos_ok, consume_ok, deliver("a", 1), header(2), ContentBody(b"hi"), get_ok, header(3),
              ContentBody(b"abc"), deliver("other", 6), header(1), ContentBody(b"x")]  # fmt: skip
    await feed(t, frames)
    assert seen.got == [("a", 1, 2, b"hi")]
    assert left(channel) == [qos_ok, consume_ok, get_ok, frames[6], frames[7], frames[8], frames[9], frames[10]]


async def test_a_cancel_or_cancel_ok_ends_the_tag_so_later_deliveries_go_to_aiormq(channel: Channel) -> None:
    t, seen = tapped(channel), Seen()
    t.consume("a", seen)
    t.consume("b", seen)
    cancel_ok, cancel = commands.Basic.CancelOk("a"), commands.Basic.Cancel("b")
    late = [deliver("a", 3), header(1), ContentBody(b"a"), deliver("b", 4), header(1), ContentBody(b"b")]
    await feed(t, [deliver("a", 1), header(1), ContentBody(b"1"), cancel_ok, cancel, *late])
    assert seen.got == [("a", 1, 1, b"1")]
    assert left(channel) == [cancel_ok, cancel, *late]


async def test_nothing_is_handed_on_once_the_channel_is_closed(channel: Channel) -> None:
    t, seen = tapped(channel), Seen()
    t.consume("a", seen)
    await feed(t, [deliver("a", 1), header(4), ContentBody(b"ab")])
    channel.is_closed = True  # closed while the body was arriving
    await feed(t, [ContentBody(b"cd")])
    rest = [deliver("a", 2), header(1), ContentBody(b"z")]
    await feed(t, rest)
    assert seen.got == []
    assert left(channel) == rest


async def test_untap_and_a_second_tap_of_the_same_channel(channel: Channel) -> None:
    t, seen = tapped(channel), Seen()
    assert tap(cast(aiormq.Channel, channel)) is t  # one tap per channel
    t.consume("a", seen)
    untap(cast(aiormq.Channel, channel), "a")
    frames = [deliver("a", 1), header(1), ContentBody(b"1")]
    await feed(t, frames)
    assert seen.got == []
    assert left(channel) == frames
    assert t.qsize() == 0  # the rest is the channel's own queue's


async def test_frames_that_break_the_content_order_go_to_the_channel_reader(channel: Channel) -> None:
    t, seen = tapped(channel), Seen()
    t.consume("a", seen)
    stray = commands.Basic.QosOk()
    await feed(t, [deliver("a", 1), stray])  # no content header after a deliver: aiormq's reader refuses it
    await feed(t, [deliver("a", 2), header(3), ContentBody(b"ab"), stray])  # a body cut short
    await feed(t, [deliver("a", 3), header(1), ContentBody(b"c")])  # the next delivery is whole again
    assert seen.got == [("a", 3, 1, b"c")]
    assert left(channel) == [stray, stray]


def test_no_tap_over_an_aiormq_that_is_not_the_audited_one(monkeypatch: pytest.MonkeyPatch, channel: Channel) -> None:
    monkeypatch.setattr(delivery_tap, "_audited", None)
    monkeypatch.setitem(delivery_tap.AUDITED, "Connection.__reader", frozenset({"0" * 64}))
    queue = channel.frames
    assert tap(cast(aiormq.Channel, channel)) is None
    assert channel.frames is queue


def test_this_aiormq_is_the_audited_one() -> None:
    assert delivery_tap.audited(), "aiormq changed: read its reader again and audit the tap (wire/delivery_tap.py)"


async def test_a_consumer_callback_that_raises_is_logged_and_the_frames_after_it_still_pass(
    channel: Channel, caplog: pytest.LogCaptureFixture
) -> None:
    t, seen = tapped(channel), Seen()
    calls = 0

    def broken(frame: Deliver, head: ContentHeader, body: bytes, ch: Any) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("a bug of ours")

    t.consume("a", broken)
    t.consume("b", seen)
    qos_ok = commands.Basic.QosOk()
    await feed(
        t, [deliver("a", 1), header(1), ContentBody(b"1"), qos_ok, deliver("b", 2), header(1), ContentBody(b"2")]
    )
    assert calls == 1
    assert seen.got == [("b", 2, 1, b"2")]
    assert left(channel) == [qos_ok]
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "consumer a could not take delivery 1 on channel 7: it stays unacked until the channel closes"
    ]


async def test_a_handler_that_fails_is_logged_and_forgotten(caplog: pytest.LogCaptureFixture) -> None:
    tasks: set[asyncio.Task[None]] = set()

    async def fails() -> None:
        raise RuntimeError("boom")

    async def works() -> None:
        return None

    run_handler(tasks, fails())
    run_handler(tasks, works())
    assert len(tasks) == 2
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(0)
    assert tasks == set()
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r.getMessage() for r in errors] == ["a delivery's handler failed: RuntimeError('boom')"]
    assert errors[0].exc_info is not None
