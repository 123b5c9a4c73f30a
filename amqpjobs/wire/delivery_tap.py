"""Taking a consumer's deliveries straight off aiormq's connection reader.

aiormq hands every frame of a channel through an ``asyncio.Queue`` (the channel's
``frames``) to a reader task of the channel's own: a delivery is three frames
(``basic.deliver``, its content header, its body), so three puts and three gets, then a
``DeliveredMessage`` and a task of aiormq's per delivery, before our consumer creates the
task that runs the job. On a worker draining small jobs that was about a tenth of its CPU
per job (bench/RESULTS.md, issue 30).

:class:`DeliveryTap` stands in for that queue on a consuming channel: the connection's
reader puts each frame of the channel into it (``await channel.frames.put((weight,
frame))``) as before. A ``basic.deliver`` for a consumer tag registered here
(:meth:`DeliveryTap.consume`), with the content header and body frames that follow it
(AMQP 0-9-1 section 4.2.6: a channel's content frames follow their method frame with no
other frame of that channel between them), is given to that consumer's callback at once,
in the reader's step; every other frame goes into the channel's own queue for its reader,
in the order received. Nothing is reordered that the channel's reader would see: a
delivery reaches the callback no later than it would have reached aiormq's consumer.

What stays as aiormq does it:

* a ``basic.cancel`` or ``cancel-ok`` passing through ends the tag here too, so a delivery
  after it (a quorum queue's late one on RabbitMQ 3.10) goes to aiormq, which drops it
  for an unknown tag, as it did;
* a channel aiormq has closed gets nothing more (the broker requeues what it held);
* a ``basic.deliver`` for a tag not registered here (or a ``get-ok``) goes to the queue.

The tap is put in place only when aiormq's reader and the channel's frame getter are
exactly the code it was written against (their source text, :data:`AUDITED`), as
:mod:`amqpjobs.wire.frame_reading` does: another aiormq keeps its own path, unchanged
(:func:`tap` returns None and the consumer goes through aiormq).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import aiormq
from aiormq.abc import AbstractChannel as UnderlayChannel
from aiormq.channel import Channel
from aiormq.connection import Connection
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from amqpjobs.wire.frame_reading import source_digest

log = logging.getLogger("amqpjobs.wire")

#: Called with each complete delivery of a tapped consumer: the ``basic.deliver`` frame, its content
#: header, the body, and the channel it came on. It runs in the connection reader's step: it must not
#: block (create a task for the work).
OnDelivery = Callable[[Basic.Deliver, ContentHeader, bytes, UnderlayChannel], None]

#: SHA-256 of the source text of the aiormq functions the tap relies on (aiormq 7.2.4): the connection's
#: reader (it puts ``(weight, frame)`` into ``channel.frames``) and the channel's frame getter (it takes
#: them with ``get`` and ``task_done``). Another source: no tap.
AUDITED = {
    "Connection.__reader": frozenset({"4c85e094b91e25af7abc49bb885fdb7872a32ec1f598f2f40d69af9464c19aa8"}),
    "Channel._get_frame": frozenset({"8309963cc284ea5f0dae88544b13490589e5aecde5573dc8c0e8e5702e3f38d7"}),
}
_READER = getattr(Connection, "_Connection__reader", None)
_audited: bool | None = None


def audited() -> bool:
    """Whether this aiormq's reader and frame getter are the audited ones (read once)."""
    global _audited
    if _audited is None:
        _audited = (
            source_digest(_READER) in AUDITED["Connection.__reader"]
            and source_digest(Channel._get_frame) in AUDITED["Channel._get_frame"]
        )
        if not _audited:
            log.debug("aiormq's reader is not the audited one: deliveries go through aiormq's channel reader")
    return _audited


class DeliveryTap:
    """An aiormq channel's ``frames`` queue, with the deliveries of registered consumers taken out.

    Args:
        channel: The aiormq channel (its ``frames`` is replaced by this tap).

    Everything but ``put`` is the channel's own queue's (``get``, ``task_done``, ``qsize`` ...).
    """

    def __init__(self, channel: aiormq.Channel) -> None:
        self._channel = channel
        self._inner = channel.frames
        self._consumers: dict[str, OnDelivery] = {}
        self._deliver: Basic.Deliver | None = None  # a tapped delivery whose content is still arriving
        self._header: ContentHeader | None = None
        self._parts: list[bytes] = []
        self._size = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def consume(self, tag: str, on_delivery: OnDelivery) -> None:
        """Give the deliveries for consumer ``tag`` to ``on_delivery`` (register before ``basic.consume``)."""
        self._consumers[tag] = on_delivery

    def forget(self, tag: str) -> None:
        """Stop tapping ``tag`` (its ``basic.consume`` failed); later deliveries for it go to aiormq."""
        self._consumers.pop(tag, None)

    async def put(self, item: tuple[int, Any]) -> None:
        """Take one frame of the channel from the connection's reader (see the module docstring)."""
        frame = item[1]
        deliver = self._deliver
        if deliver is None:
            if type(frame) is Basic.Deliver and frame.consumer_tag in self._consumers:
                if not self._channel.is_closed:
                    self._deliver = frame
                    return
            elif type(frame) in (Basic.Cancel, Basic.CancelOk):  # no delivery for this tag passes here after it
                self._consumers.pop(frame.consumer_tag, None)
            await self._inner.put(item)
            return
        header = self._header
        if header is None:
            if not isinstance(frame, ContentHeader):  # not AMQP: let the channel's reader refuse it
                self._deliver = None
                await self._inner.put(item)
                return
            self._header = header = frame
            if header.body_size:
                return
        elif isinstance(frame, ContentBody):
            self._parts.append(frame.value)
            self._size += len(frame.value)
            if self._size < header.body_size:
                return
        else:  # not AMQP: let the channel's reader refuse it
            self._reset()
            await self._inner.put(item)
            return
        parts = self._parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        self._reset()
        on_delivery = self._consumers.get(deliver.consumer_tag or "")
        if on_delivery is not None and not self._channel.is_closed:
            try:
                on_delivery(deliver, header, body, self._channel)
            except Exception:  # a bug of ours: it must not end the connection's reader (and every channel with it)
                log.exception(
                    "consumer %s could not take delivery %s on channel %s: it stays unacked until the channel closes",
                    deliver.consumer_tag, deliver.delivery_tag, self._channel.number,
                )  # fmt: skip

    def _reset(self) -> None:
        self._deliver = self._header = None
        self._parts = []
        self._size = 0


def untap(channel: aiormq.Channel, tag: str) -> None:
    """Stop tapping consumer ``tag`` on ``channel`` (no tap there: nothing to do)."""
    frames = channel.frames
    if isinstance(frames, DeliveryTap):
        frames.forget(tag)


def tap(channel: aiormq.Channel) -> DeliveryTap | None:
    """``channel``'s :class:`DeliveryTap`, put in place at the first call; None when aiormq is not the audited one.

    Frames already in the channel's queue stay there, for its reader, in order: only frames
    put after this call pass the tap.
    """
    frames = channel.frames
    if isinstance(frames, DeliveryTap):
        return frames
    if not audited():
        return None
    tapped = DeliveryTap(channel)
    channel.frames = tapped  # type: ignore[assignment]
    return tapped
