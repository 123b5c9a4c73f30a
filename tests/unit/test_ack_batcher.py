"""Which acks the batcher sends, and how (our rule; the broker side is in tests/integration/test_consumer.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiormq.abc import ChannelFrame
from pamqp import commands as spec
from pamqp.frame import unmarshal

from amqpjobs.wire.acks import AckBatcher, DeliveryChannelClosed


class RecordingQueue(asyncio.Queue[ChannelFrame]):
    """Stands in for aiormq's write queue of a connection: decodes each frame put into it, in order."""

    def __init__(self) -> None:
        super().__init__(maxsize=10)
        self.writes: list[
            list[tuple[int, int, bool]]
        ] = []  # a list per frame queued (a write): (channel, tag, multiple)
        self.jammed = False

    def full(self) -> bool:
        return self.jammed

    def put_nowait(self, item: ChannelFrame) -> None:
        assert not self.jammed
        data, acks = item.payload, []
        while data:
            used, number, frame = unmarshal(data)
            assert isinstance(frame, spec.Basic.Ack)
            acks.append((number, frame.delivery_tag, frame.multiple))
            data = data[used:]
        self.writes.append(acks)


class RecordingChannel:
    """Stands in for an aiormq channel: records the ack frames it is asked to send, alone or in a connection's write."""

    def __init__(self, queue: RecordingQueue | None = None, number: int = 1) -> None:
        self.number = number
        self.is_closed = False
        self.write_queue = queue or RecordingQueue()
        self.alone: list[tuple[int, bool]] = []

    async def basic_ack(self, delivery_tag: int, multiple: bool = False, wait: bool = True) -> None:
        self.write_queue.writes.append([(self.number, delivery_tag, multiple)])

    @property
    def sent(self) -> list[tuple[int, bool]]:
        """This channel's acks in the order they were queued for the socket."""
        return [(tag, multiple) for write in self.write_queue.writes for n, tag, multiple in write if n == self.number]


def batcher(tags: range, batch: bool = True) -> tuple[AckBatcher, RecordingChannel]:
    channel = RecordingChannel()
    acks = AckBatcher(channel, batch)  # type: ignore[arg-type]
    for tag in tags:
        acks.delivered(tag)
    return acks, channel


async def turn(acks: AckBatcher) -> None:
    await asyncio.sleep(0)
    await acks.flush()


async def test_acks_of_one_turn_go_as_one_multiple_ack() -> None:
    acks, channel = batcher(range(1, 6))
    for tag in (1, 2, 3):
        await acks.ack(tag)
    assert channel.sent == []  # nothing before the loop's next turn
    await turn(acks)
    assert channel.sent == [(3, True)]
    await acks.ack(5)
    await acks.ack(4)
    await turn(acks)
    assert channel.sent == [(3, True), (5, True)]


async def test_acks_behind_a_running_delivery_go_singly_at_once() -> None:
    acks, channel = batcher(range(1, 4))
    await acks.ack(3)
    await acks.ack(2)
    await turn(acks)
    assert channel.sent == [(2, False), (3, False)]
    await acks.ack(1)
    await turn(acks)
    assert channel.sent == [(2, False), (3, False), (1, True)]


async def test_a_multiple_ack_never_names_a_rejected_tag() -> None:
    acks, channel = batcher(range(1, 4))
    await acks.ack(1)
    acks.rejected(2)
    await turn(acks)
    assert channel.sent == [(1, True)]  # not (2, True): tag 2 is no longer unacked on the broker
    await acks.ack(3)
    await turn(acks)
    assert channel.sent == [(1, True), (3, True)]


async def test_rejected_tags_inside_the_run_are_covered_without_being_named() -> None:
    acks, channel = batcher(range(1, 4))
    await acks.ack(1)
    acks.rejected(2)
    await acks.ack(3)
    assert channel.sent == []
    await turn(acks)
    assert channel.sent == [(3, True)]


async def test_without_batching_each_ack_goes_at_once() -> None:
    acks, channel = batcher(range(1, 3), batch=False)
    await acks.ack(1)  # one slot (prefetch 1): the broker sends the next delivery only after this ack
    assert channel.sent == [(1, True)]
    await acks.ack(2)
    assert channel.sent == [(1, True), (2, True)]


async def test_ack_on_a_closed_channel_raises() -> None:
    acks, channel = batcher(range(1, 2))
    channel.is_closed = True
    with pytest.raises(DeliveryChannelClosed):
        await acks.ack(1)


async def test_flush_sends_what_is_still_batched() -> None:
    acks, channel = batcher(range(1, 3))
    await acks.ack(1)
    await acks.ack(2)
    await acks.flush()  # without waiting for the loop's turn
    assert channel.sent == [(2, True)]
    sent: list[Any] = list(channel.sent)
    await acks.flush()
    assert channel.sent == sent


async def test_a_tag_not_noted_yet_stops_the_run() -> None:
    """A get-ok (tag 2) still on its way while a later consumer delivery (tag 3) finished: 2 is never covered."""
    acks, channel = batcher(range(1, 2))
    acks.delivered(3)
    await acks.ack(1)
    await acks.ack(3)
    await turn(acks)
    assert channel.sent == [(1, True), (3, False)]
    acks.delivered(2)
    acks.delivered(4)
    await acks.ack(2)
    await acks.ack(4)
    await turn(acks)
    assert channel.sent == [(1, True), (3, False), (4, True)]  # 2, 3, 4 settled in a row: one ack covers them


async def test_an_ack_at_once_goes_before_the_loop_turns_with_those_batched_before_it() -> None:
    """The ack of a delivery whose copy is confirmed (README "When a job crashes"): no wait for the loop's turn."""
    acks, channel = batcher(range(1, 5))
    await acks.ack(1)
    await acks.ack(3, at_once=True)
    assert channel.sent == [(1, True), (3, False)]  # 1 batched before it goes along; 3 behind a running 2: singly
    await turn(acks)
    assert channel.sent == [(1, True), (3, False)]  # nothing left for the turn
    await acks.ack(2, at_once=True)
    assert channel.sent == [(1, True), (3, False), (2, True)]  # covers 2 only: 3 was acked already
    await acks.ack(4)
    await turn(acks)
    assert channel.sent == [(1, True), (3, False), (2, True), (4, True)]


async def test_an_ack_at_once_never_overtakes_acks_still_on_their_way() -> None:
    """Acks 2 and 4 (behind a running 1) wait for room in the connection's frame queue; 1, 3, 5 settle meanwhile.

    A multiple ack up to 5 sent before the single acks of 2 and 4 would make them acks of
    unknown tags (the broker closes the channel): the sends keep their order.
    """
    acks, channel = batcher(range(1, 6))
    room = asyncio.Event()
    record = channel.basic_ack

    async def full_queue(delivery_tag: int, multiple: bool = False, wait: bool = True) -> None:
        if not channel.sent and delivery_tag == 2:  # aiormq's write queue (10 frames) was full: this put waits,
            await room.wait()  # and a put that finds the room freed before this one resumes goes first
        await record(delivery_tag, multiple, wait)

    channel.basic_ack = full_queue  # type: ignore[method-assign]
    channel.write_queue.jammed = True  # the batched send waits for room, in a task of its own
    await acks.ack(2)
    await acks.ack(4)
    await asyncio.sleep(0)  # the loop's turn: the batched send starts, and waits for room
    await asyncio.sleep(0)
    await acks.ack(1)
    await acks.ack(3)
    at_once = asyncio.create_task(acks.ack(5, at_once=True))
    await asyncio.sleep(0)
    room.set()
    channel.write_queue.jammed = False
    await asyncio.sleep(0)
    await at_once
    await acks.flush()
    assert channel.sent == [(2, False), (4, False), (5, True)]


async def test_the_acks_of_a_turn_on_several_channels_of_one_connection_are_one_write() -> None:
    """A sharded worker's lanes: 3 channels of one connection, acks due in the same turn: one frame for the writer."""
    queue = RecordingQueue()
    channels = [RecordingChannel(queue, number) for number in (1, 2, 3)]
    batchers = [AckBatcher(channel) for channel in channels]  # type: ignore[arg-type]
    for acks in batchers:
        for tag in (1, 2, 3):
            acks.delivered(tag)
    await batchers[0].ack(1)
    await batchers[0].ack(2)
    await batchers[1].ack(2)  # behind a running 1: singly
    await batchers[2].ack(1)
    await asyncio.sleep(0)
    assert queue.writes == [[(1, 2, True), (2, 2, False), (3, 1, True)]]
    await batchers[1].ack(1)
    await batchers[0].ack(3)
    await asyncio.sleep(0)
    assert queue.writes[1:] == [[(2, 1, True), (1, 3, True)]]  # in the order they became due


async def test_a_channel_the_broker_closed_sends_no_acks_and_the_others_still_do(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An ack after our close-ok would be on a channel number not open: the broker closes the connection (504)."""
    queue = RecordingQueue()
    closing, open_ = RecordingChannel(queue, 1), RecordingChannel(queue, 2)
    batchers = [AckBatcher(closing), AckBatcher(open_)]  # type: ignore[arg-type]
    for acks in batchers:
        acks.delivered(1)
        await acks.ack(1)
    closing._Channel__close_event = asyncio.Event()  # type: ignore[attr-defined]  # aiormq's, set at the broker's channel.close
    closing._Channel__close_event.set()  # type: ignore[attr-defined]
    await asyncio.sleep(0)
    assert queue.writes == [[(2, 1, True)]]
    assert "acks of 1 deliveries lost with their channel (1 closed)" in caplog.text


async def test_held_acks_of_one_consumer_wait_for_release_and_stop_the_run() -> None:
    """A quorum lease being drained: its acks wait; the channel's other deliveries' acks still go."""
    acks, channel = batcher(range(0))
    for tag, owner in ((1, ""), (2, "lease"), (3, ""), (4, "lease")):
        acks.delivered(tag, owner)
    acks.hold("lease")
    for tag in (1, 2, 3, 4):
        await acks.ack(tag)
    await turn(acks)
    assert channel.sent == [(1, True), (3, False)]  # 2 held stops the run; 3 goes singly, 4 waits
    assert acks.outstanding("lease") == 2  # the broker still counts both unacked: no credit freed
    await acks.release("lease")
    assert channel.sent == [(1, True), (3, False), (4, True)]  # one multiple ack covers 2, 3, 4
    assert acks.outstanding("lease") == 0


async def test_outstanding_counts_what_the_broker_has_not_seen_settled() -> None:
    acks, _ = batcher(range(0))
    for tag in (1, 2, 3):
        acks.delivered(tag, "lease")
    acks.hold("lease")
    assert acks.outstanding("lease") == 3  # running
    await acks.ack(1)
    acks.rejected(2)  # a reject goes out at once, not through the batcher: settled on the broker
    await turn(acks)
    assert acks.outstanding("lease") == 2  # 1 held, 3 running
    assert acks.outstanding("other") == 0
