"""What the end of an unconfirmed publish means, and the words for it (:mod:`amqpjobs.wire.publish`).

An enqueue error says "not stored" only when the broker said so for that publish (a return,
a nack, a 404 naming its own exchange); any other end of a publish sent but not confirmed is
uncertain (README "Enqueueing").
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import aiormq

from amqpjobs.errors import (
    BrokerBlockedError,
    BrokerError,
    MessageTooLargeError,
    PublisherClosedError,
    PublishError,
    UnroutableError,
)
from amqpjobs.message import OutgoingMessage
from amqpjobs.wire.errors import CHANNEL_OPEN_ERRORS


def heard_close(underlay: aiormq.Channel) -> bool:
    """Whether aiormq closed ``underlay``, or heard the broker's close (its ``close-ok`` queued, same step).

    A frame sent on a channel after its ``close-ok`` makes RabbitMQ close the whole connection
    (``504 CHANNEL_ERROR - expected 'channel.open'``). aiormq queues the ``close-ok`` in the step
    in which it reads the broker's close and notes the close in ``_close_exception``; a writer
    that checks this and queues its frames in one step (no await between) goes ahead of the
    ``close-ok`` (the broker ignores it) or not at all. ``is_closed`` alone is set a few steps later.
    (Should a later aiormq drop that attribute, only ``is_closed`` is checked: a crossing is possible again.)
    """
    return underlay.is_closed or getattr(underlay, "_close_exception", None) is not None


def job_words(message: OutgoingMessage) -> str:
    """How an error names a publish: ``job 'order-17' (orders.confirm)``, or ``the message`` without an id."""
    job = f"job {message.message_id!r}" if message.message_id is not None else "the message"
    return f"{job} ({message.type})" if message.type else job


def uncertain(what_happened: str, message: OutgoingMessage) -> str:
    """The words of an unconfirmed publish whose outcome is unknown: it names the job, claims no failure."""
    job = job_words(message)
    return (f"{what_happened}; {job} may or may not be stored (not confirmed): enqueueing it again may store it "
            "twice; with the same job id an idempotent job runs once")  # fmt: skip


def not_connected(exchange: str, routing_key: str, refused: str | None = None, waited: float | None = None) -> str:
    """The words of a publish not sent for want of a connection.

    Lost (``waited``: seconds waited for it to come back), or its reconnect ``refused`` (why).
    """
    words = f"publish to {exchange!r} / {routing_key!r} not sent: not connected to the broker"
    if refused is not None:
        return f"{words}; it refuses the reconnect: {refused}"
    if waited is not None:
        return f"{words}; the connection was lost and has not come back for {waited:g}s (it goes on reconnecting)"
    return f"{words} (the connection was lost; it reconnects by itself)"


def unroutable(exchange: str, routing_key: str) -> str:
    """The words of a ``basic.return`` of a mandatory publish: no queue is bound for it (not stored)."""
    return (f"unroutable: no queue is bound to exchange {exchange or '(default)'!r} with routing key "
            f"{routing_key!r}; apply the topology (amqpjobs topology apply) or fix the job's queue")  # fmt: skip


def nacked(exchange: str, routing_key: str) -> str:
    """The words of a ``basic.nack`` of a publish (not stored)."""
    return (f"the broker nacked the publish to {exchange or '(default)'!r} / {routing_key!r} "
            "(queue full with overflow reject-publish, or a broker-side failure)")  # fmt: skip


#: The broker's refusal of a body over its ``max_message_size`` (RabbitMQ 3.x and 4.x ``rabbit_channel``).
_MAX_SIZE = re.compile(r"larger than (?:configured )?max size (\d+)")


def max_size_in(refusal: str) -> int | None:
    """The ``max_message_size`` a 406 channel close names (``... is larger than configured max size M``), or None."""
    found = _MAX_SIZE.search(refusal)
    return int(found.group(1)) if found else None


def too_large(size: int, refusal: str) -> MessageTooLargeError | None:
    """The error for a body of ``size`` bytes the broker refused over its ``max_message_size`` (a 406 close).

    None when ``size`` is within the limit the refusal names: it was another message's
    refusal, and this publish was only cut off (uncertain).
    """
    limit = max_size_in(refusal)
    if limit is not None and size <= limit:
        return None
    of = f" of {limit} bytes" if limit is not None else ""
    return MessageTooLargeError(
        f"{size} bytes is over the broker's max_message_size{of}; store large "
        "data elsewhere and put a reference in the payload",
        f"a body of {size} bytes, over the broker's max_message_size{of}",
    )


def size_refusal(message: OutgoingMessage, refusal: str) -> MessageTooLargeError | PublishError:
    """What a channel closed over the broker's ``max_message_size`` (406 ``PRECONDITION_FAILED``) says of a publish.

    The broker names no such setting at connect (``connection.tune`` has no field for it),
    only this refusal: ``message size N is larger than configured max size M`` (the caller
    keeps ``M``, :func:`max_size_in`, to refuse later bodies over it before sending).

    Returns:
        :class:`MessageTooLargeError` when ``message`` is over the limit (its ``reason`` names
        both sizes); else :class:`PublishError`: another publish's refusal closed the channel
        under it (not confirmed; it may or may not be stored).
    """
    if (refused := too_large(len(message.body), refusal)) is not None:
        return refused
    return PublishError(uncertain(
        f"the channel closed under this publish ({len(message.body)} bytes): another message was over the "
        f"broker's max_message_size of {max_size_in(refusal)} bytes ({refusal})", message
    ))  # fmt: skip


def over_max_size(channel_code: int | None, text: str) -> bool:
    """Whether a close (reply code, None for a connection's; words) is the broker's ``max_message_size`` refusal.

    The broker closes the channel with 406 PRECONDITION_FAILED naming the limit (RabbitMQ
    "Configuration": ``max_message_size``).
    """
    return channel_code == 406 and ("max size" in text or "message size" in text)


def closed_under(
    text: str, channel_code: int | None, exchange: str, routing_key: str, message: OutgoingMessage,
    missing: Callable[[], str], closed_by: str | None = None, dropped: str | None = None,
) -> UnroutableError | MessageTooLargeError | PublishError:  # fmt: skip
    """What a channel or connection closed under a publish says of it (both publishers' reading).

    Args:
        text: The close's words (``reply_text``, as the error map words it).
        channel_code: The channel close's reply code; None: the connection closed.
        exchange: The publish's exchange.
        routing_key: Its routing key.
        message: The publish (its size and id word the error).
        missing: The words for the exchange missing (called only then).
        closed_by: Who closed the publisher under the publish (its own close), if it was closed.
        dropped: The resource alarm that held it unread when that close reset the connection
            (:mod:`amqpjobs.wire.reset`): then it is not stored, and the error says so.

    Returns:
        :class:`UnroutableError` for a 404 naming ``exchange`` (not stored); a 406 over the
        broker's ``max_message_size`` is :func:`size_refusal`'s; with ``dropped``,
        :class:`BrokerBlockedError` (not stored: the alarm did not clear within the close's wait);
        else :class:`PublishError`: it may or may not be stored.
    """
    if channel_code == 404 and f"no exchange '{exchange}' in vhost" in text:
        return UnroutableError(missing())
    if over_max_size(channel_code, text):
        return size_refusal(message, text)
    what = f"the channel or connection closed under the publish to {exchange!r} / {routing_key!r} ({text})"
    if closed_by is not None:
        what = f"{closed_by} was closed under the publish to {exchange!r} / {routing_key!r}"
    if dropped is not None:  # its close reset the connection an alarm blocked: the broker drops what it held unread
        return BrokerBlockedError(f"{what} while a resource alarm ({dropped}) held it unread; the close reset the "
                                  f"connection, so the broker drops it: {job_words(message)} NOT stored; enqueue it "
                                  "again once the alarm clears", alarm=dropped)  # fmt: skip
    return PublishError(uncertain(what, message))


def cut_off(closed: bool, exc: BaseException) -> bool:
    """Whether ``exc`` is what a publisher's close (``closed``: it was called) did to a publish under way.

    The caller's own cancel is not: only a future aio-pika cancelled at the close, or what reading a
    channel or connection closed under it raises.
    """
    if not closed:
        return False
    if isinstance(exc, asyncio.CancelledError):  # a future aio-pika cancelled at the close, not the task
        task = asyncio.current_task()
        return task is None or task.cancelling() == 0
    closing: tuple[type[BaseException], ...] = (RuntimeError, BrokerError, PublisherClosedError, *CHANNEL_OPEN_ERRORS)
    return type(exc) is Exception or isinstance(exc, closing)


def no_confirm(
    exchange: str, routing_key: str, message: OutgoingMessage, timeout: float, alarm: str | None, waited: float,
    blocked: str | None = None, kept: str | None = None,
) -> PublishError:  # fmt: skip
    """The error of a confirm wait that ended unanswered.

    Given up on, held by resource alarm ``alarm`` for ``waited`` seconds (:func:`held_unread`); or no
    confirm within ``timeout`` seconds while alarm ``blocked`` blocks the connection, which ``kept`` says
    stays open (:func:`held_past_confirm_wait`); else it may or may not be stored.
    """
    if alarm is not None:
        return held_unread(exchange, routing_key, alarm, waited)
    if blocked is not None and kept is not None:
        return held_past_confirm_wait(exchange, routing_key, message, timeout, blocked, kept)
    return PublishError(
        uncertain(f"no publisher confirm within {timeout:g}s for {exchange!r} / {routing_key!r}", message)
    )


def held_unread(exchange: str, routing_key: str, alarm: str, waited: float) -> BrokerBlockedError:
    """The error of a publish a resource alarm's broker held unread for ``waited`` seconds (``alarm``: ``"memory"``)."""
    return BrokerBlockedError(
        f"publish to {exchange!r} / {routing_key!r} held unread by the broker: resource alarm ({alarm}) for "
        f"{waited:g}s; it is stored once the alarm clears unless the connection is reset",
        alarm=alarm,
        waited=waited,
    )


#: What keeps a held publish's connection open, as each publisher says it (:func:`held_past_confirm_wait`).
KEPT_BY_APP = (
    "the app keeps it open, and the broker confirms it then, unless the app is closed or this process exits before"
)
KEPT_BY_SYNC = (
    "this publisher keeps it open until the broker answers (even after close()), and logs the answer; only this "
    "process's exit before then can lose the job"
)


def held_past_confirm_wait(
    exchange: str, routing_key: str, message: OutgoingMessage, timeout: float, alarm: str, kept: str
) -> PublishError:
    """The error of a publish whose confirm wait (``timeout`` s) ended while a resource alarm blocks its connection.

    The broker holds it unread (``alarm``: ``"memory"`` ...) and stores it once the alarm clears if its
    connection is open then (a connection closed meanwhile races its teardown against the held frames,
    README "Backpressure"); ``kept`` says what keeps it open. A :class:`PublishError` as such: not
    confirmed, and not refused either.
    """
    job = job_words(message)
    return PublishError(
        f"no publisher confirm within {timeout:g}s for {exchange!r} / {routing_key!r}: the broker blocked the "
        f"connection under it (resource alarm: {alarm}) and holds {job} unread; it stores it once the alarm clears "
        f"if the connection is still open then: {kept}; do not enqueue it again unless a second copy is harmless "
        "(with the same job id an idempotent job runs once)"
    )
