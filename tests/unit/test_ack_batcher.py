"""Which acks the batcher sends, and how (our rule; the broker side is in tests/integration/test_consumer.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from amqpjobs.wire.delivery import AckBatcher, DeliveryChannelClosed


class RecordingChannel:
    """Stands in for an aiormq channel: records the ack frames it is asked to send."""

    number = 1

    def __init__(self) -> None:
        self.is_closed = False
        self.sent: list[tuple[int, bool]] = []

    async def basic_ack(self, delivery_tag: int, multiple: bool = False, wait: bool = True) -> None:
        self.sent.append((delivery_tag, multiple))


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
    await acks.ack(2)
    await acks.ack(4)
    await asyncio.sleep(0)  # the loop's turn: the batched send starts, and waits for room
    await asyncio.sleep(0)
    await acks.ack(1)
    await acks.ack(3)
    at_once = asyncio.create_task(acks.ack(5, at_once=True))
    await asyncio.sleep(0)
    room.set()
    await asyncio.sleep(0)
    await at_once
    await acks.flush()
    assert channel.sent == [(2, False), (4, False), (5, True)]
