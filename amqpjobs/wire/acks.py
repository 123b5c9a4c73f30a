"""Acks of consumer channels: batched per loop turn, and one socket write per turn for a connection's channels.

:class:`AckBatcher` turns the acks of one channel finished in one turn of the event loop
into as few ``basic.ack`` frames as it can. A worker on a sharded job queue consumes each
shard on a channel of its own (:class:`~amqpjobs.wire.lane.Lane`), and aiormq writes every
frame it is given to the socket with a write of its own, so with 8 busy shards the acks of
one turn cost up to 8 socket writes (bench/RESULTS.md, issue 30: a channel per shard cost
0.82x of one shared channel's throughput, 349 vs 259 µs of CPU per job). :class:`TurnWrites`
marshals the due acks of every channel of one connection into one payload, queued as one
frame for aiormq's writer: one write. Frames of different channels may follow each other
in any order (AMQP 0-9-1 section 4.2.3, "Frame Format": each frame carries its channel);
the acks of one channel keep their order.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

from aiormq.abc import AbstractChannel as UnderlayChannel
from aiormq.abc import ChannelFrame
from pamqp import commands as spec

from amqpjobs.wire.errors import LIBRARY_ERRORS

log = logging.getLogger("amqpjobs.wire")


class DeliveryChannelClosed(Exception):
    """The channel a delivery came on has closed; the broker will redeliver the message."""


class AckBatcher:
    """The acks of one consumer channel, sent once per turn of the event loop.

    A busy worker finishes several deliveries in one turn of the loop; sending each ack as
    a frame of its own costs a socket write per job (the largest single cost in a profile
    of the worker, bench/RESULTS.md). Here :meth:`ack` only notes the delivery tag, and on
    the loop's next turn one ``basic.ack`` with ``multiple=true`` settles the run of
    settled tags at the head of the channel's unsettled deliveries (RabbitMQ "Consumer
    Acknowledgements": "Acknowledging Multiple Deliveries at Once"); acks behind a delivery
    still running go singly, at once. A multiple ack covers every delivery of the channel
    up to its tag, so every delivery of the channel (of consumers or of ``basic.get``)
    must be noted here; as a channel numbers its deliveries 1, 2, 3, ..., a tag not noted
    yet (a ``get-ok`` still on its way to the code that took it, while a later consumer
    delivery already finished) stops the run: it is never covered before it is settled.

    Args:
        channel: The aiormq channel the deliveries came on.
        batch: False sends every ack at once: with ``prefetch_count`` 1 there is never a
            second delivery to batch with, and the broker sends the next one only after the ack.
    """

    def __init__(self, channel: UnderlayChannel, batch: bool = True) -> None:
        self.channel = channel
        self.batch = batch
        self._unsettled: dict[int, bool] = {}  # delivery tag above _cleared -> settled
        self._cleared = 0  # every tag up to this one is settled and its ack sent
        self._acked: set[int] = set()  # settled by an ack not yet sent
        self._owner: dict[int, str] = {}  # delivery tag above _cleared -> the consumer tag that may hold it
        self._held: set[str] = set()  # consumer tags whose acks are held (hold .. release)
        self._scheduled = False
        self._sending: set[asyncio.Task[None]] = set()
        # one send at a time, in order: a put into aiormq's write queue (10 frames) may wait, and a
        # later send's multiple ack must never reach the socket before an earlier send's single acks
        self._one_send = asyncio.Lock()

    def delivered(self, tag: int, owner: str = "") -> None:
        """Note a delivery from the channel (in delivery order); ``owner``: its consumer tag, for :meth:`hold`."""
        self._unsettled[tag] = False
        if owner:
            self._owner[tag] = owner

    def hold(self, owner: str) -> None:
        """Send no ack of ``owner``'s deliveries (a consumer tag given to :meth:`delivered`) until :meth:`release`.

        Ending a quorum queue's consumer: while its acks are held the broker's credit for it
        only shrinks, and once none is left nothing is in flight to it, so a ``basic.cancel``
        returns nothing to the queue (see :meth:`amqpjobs.wire.lane.Lane.end_lease`).
        """
        self._held.add(owner)

    async def release(self, owner: str) -> None:
        """Send the held acks of ``owner``'s deliveries now (and no longer hold them)."""
        self._held.discard(owner)
        await self._send()

    def outstanding(self, owner: str) -> int:
        """How many of ``owner``'s deliveries the broker still counts as unacked (no ack or reject sent)."""
        return sum(
            1 for tag, who in self._owner.items() if who == owner and (not self._unsettled[tag] or tag in self._acked)
        )

    async def ack(self, tag: int, at_once: bool = False) -> None:
        """Settle ``tag`` by an ack, sent on the loop's next turn (at once when not batching).

        Args:
            tag: The delivery tag.
            at_once: Send it now, with the acks batched before it (a delivery whose copy is
                confirmed: until its ack is out, a worker dying leaves the job two lives).

        Raises:
            DeliveryChannelClosed: the channel is already closed (the broker redelivers).
        """
        if self.channel.is_closed:
            raise DeliveryChannelClosed(f"channel {self.channel.number} is closed")
        self._unsettled[tag] = True
        self._acked.add(tag)
        if at_once or not self.batch:
            await self._send()
        elif not self._scheduled:
            self._scheduled = True
            turn_writes(self.channel).add(self)

    def rejected(self, tag: int) -> None:
        """Note that ``tag`` was settled by a reject already sent."""
        if tag in self._unsettled:
            self._unsettled[tag] = True

    def send_alone(self) -> None:
        """Send the due acks in a task of its own (the write queue is full, or before a close)."""
        self._scheduled = False
        task = asyncio.get_running_loop().create_task(self._send())
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    def due_frames(self) -> list[spec.Basic.Ack]:
        """The due acks as frames, counted as sent, for one write with other channels' (:class:`TurnWrites`).

        Empty when there are none, when the channel has closed (the broker redelivers), or
        when a send of its own is in flight: the new acks may not overtake it, so they
        follow in a task of their own.
        """
        self._scheduled = False
        if self._one_send.locked():  # a send of its own is in flight: these must not overtake it
            self.send_alone()
            return []
        frames = self._settled()
        # aiormq's basic_ack checks both: its close event is set as soon as the broker's
        # channel.close arrives, and an ack after our close-ok would be a connection error (504)
        if frames and (self.channel.is_closed or _closing(self.channel)):
            log.warning("acks of %d deliveries lost with their channel (%s closed): the broker redelivers them",
                        len(frames), self.channel.number)  # fmt: skip
            return []
        return frames

    async def _send(self) -> None:
        async with self._one_send:
            frames = self._settled()
            try:
                for frame in frames:
                    await self.channel.basic_ack(frame.delivery_tag, multiple=frame.multiple, wait=False)
            except LIBRARY_ERRORS as exc:  # the broker requeues what this channel held
                log.warning("acks of %d deliveries lost with their channel (%s): the broker redelivers them",
                            len(frames), exc)  # fmt: skip

    def _settled(self) -> list[spec.Basic.Ack]:
        """The ack frames for what was settled since the last send, counted as sent."""
        held = {t for t in self._acked if self._owner.get(t) in self._held} if self._held else set()
        head = self._cleared  # the end of the run of settled tags that follow one another from the start
        for tag in sorted(self._unsettled):
            if tag != head + 1 or not self._unsettled[tag] or tag in held:
                break
            head = tag
        # they stay noted (settled) until the run reaches them
        singles = sorted(t for t in self._acked if t > head and t not in held)
        covered = [t for t in self._acked if t <= head]
        for tag in range(self._cleared + 1, head + 1):
            del self._unsettled[tag]
            self._owner.pop(tag, None)
        self._cleared = head
        self._acked = held
        # a multiple ack goes up to the last acked tag: its own tag must still be unsettled
        frames = [spec.Basic.Ack(delivery_tag=max(covered), multiple=True)] if covered else []
        return frames + [spec.Basic.Ack(delivery_tag=tag) for tag in singles]

    async def flush(self) -> None:
        """Send pending acks now and wait until they are queued for the socket (before a close)."""
        if self._scheduled:
            self.send_alone()
        while self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)


def _closing(channel: UnderlayChannel) -> bool:
    """Whether aiormq has seen the broker's ``channel.close`` (its private close event; False if it has none)."""
    event = getattr(channel, "_Channel__close_event", None)
    return isinstance(event, asyncio.Event) and event.is_set()


class TurnWrites:
    """The ack batchers of one connection with acks due on this loop turn.

    Args:
        write_queue: aiormq's write queue of the connection (``channel.write_queue``):
            a queue of :class:`aiormq.abc.ChannelFrame`, bounded.
    """

    def __init__(self, write_queue: asyncio.Queue[ChannelFrame]) -> None:
        self._queue = write_queue
        self._due: list[AckBatcher] = []

    def add(self, batcher: AckBatcher) -> None:
        """Write ``batcher``'s due acks on the loop's next turn, with those of the connection's other channels."""
        if not self._due:
            asyncio.get_running_loop().call_soon(self._write)
        self._due.append(batcher)

    def _write(self) -> None:
        due, self._due = self._due, []
        if self._queue.full():  # no room for the one frame: each waits for room on its own
            for batcher in due:
                batcher.send_alone()
            return
        payloads = []
        for batcher in due:
            if frames := batcher.due_frames():
                payloads.append(ChannelFrame.marshall(channel_number=batcher.channel.number, frames=frames).payload)
        if payloads:  # nothing was awaited since the queue had room
            self._queue.put_nowait(ChannelFrame(payload=b"".join(payloads), should_close=False))


_by_queue: weakref.WeakKeyDictionary[asyncio.Queue[ChannelFrame], TurnWrites] = weakref.WeakKeyDictionary()


def turn_writes(channel: UnderlayChannel) -> TurnWrites:
    """The :class:`TurnWrites` of ``channel``'s connection (one per aiormq write queue: a new one after a reconnect)."""
    queue: asyncio.Queue[ChannelFrame] = channel.write_queue  # type: ignore[attr-defined]
    writes = _by_queue.get(queue)
    if writes is None:
        writes = _by_queue[queue] = TurnWrites(queue)
    return writes
