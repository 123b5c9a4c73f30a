"""Publishing with publisher confirms and ``mandatory``; broker answers mapped to our errors.

Without confirms a publish can be lost silently; without ``mandatory`` an unroutable message is dropped
silently (RabbitMQ "Consumer Acknowledgements and Publisher Confirms"). Every publish here waits for
the broker's confirm and raises when the message came back or was nacked.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import NoReturn, cast

import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection

from amqpjobs.errors import (
    BrokerError,
    BrokerUnavailableError,
    PublisherClosedError,
    PublishError,
    PublishNackedError,
    UnroutableError,
)
from amqpjobs.message import OutgoingMessage
from amqpjobs.wire import limits
from amqpjobs.wire.alarms import GiveUpWhileBlocked, WhileBlocked, blocked_by, confirm_watch
from amqpjobs.wire.connection import when_connected
from amqpjobs.wire.errors import CHANNEL_OPEN_ERRORS, LIBRARY_ERRORS, broker_errors, reply_code
from amqpjobs.wire.exchange_checks import ExchangeChecks
from amqpjobs.wire.held_publishes import HeldAtClose, held_at_close, watch_late_answer
from amqpjobs.wire.property_encoding import exact_properties
from amqpjobs.wire.publish_now import queue_publish, same_id_in_flight
from amqpjobs.wire.publish_outcome import (
    closed_under,
    cut_off,
    heard_close,
    max_size_in,
    nacked,
    no_confirm,
    over_max_size,
    unroutable,
)
from amqpjobs.wire.reset import ending

_CLOSED = CHANNEL_OPEN_ERRORS  #: What reading a channel closed under us raises (aio-pika's RuntimeError)
_ROOM_RECHECK = 0.001  #: Seconds between looks for room in a full write queue (the queue need not empty)


class ConfirmedPublisher:
    """Publishes on one channel of its own with publisher confirms.

    Args:
        connection: An open (robust) connection.
        timeout: Seconds to wait for each confirm.
        max_message_size: Bodies larger than this many bytes are refused before publishing (the broker would
            close the channel); None = no check.
        on_confirm: Called with the seconds from publish to confirm, for each confirmed publish.
        serial: One publish at a time, each waiting for its confirm before the next is sent. For exchanges
            that may be missing: a publish to a missing exchange makes the broker close the channel (404),
            cutting off the publishes in flight beside it (each then ends uncertain). The first publish to each
            exchange is checked first (:class:`~amqpjobs.wire.exchange_checks.ExchangeChecks`) and no frame is
            queued after the channel's close (see :func:`heard_close`: the broker would close the whole
            connection, ``504 CHANNEL_ERROR``), so only an exchange deleted after its check can cut off others.
        is_modulus_exchange: Tells whether an exchange is a job queue's ``x-modulus-hash``
            exchange (``shard_routing = "modulus-hash"``): when one is missing before RabbitMQ
            4.3, the error names the 4.3 requirement instead of "apply the topology". None: no
            exchange is one (a name alone can't tell: a user's exchange may end in ``.shards``).
        header_reserve: Bytes of the connection's ``frame_max`` a message's properties must leave free (an
            app's enqueue: room for the headers a worker adds to its copies); see :func:`check_header_fits`. Default 0.
        owner: Who closes it, named when :meth:`close` cuts off a publish (default ``"the publisher"``).
        wait_reconnect: While the connection is lost, a publish waits up to ``timeout`` for aio-pika to
            reconnect it (an app's enqueue: nothing depends on the old connection). Default False: it raises
            :class:`BrokerUnavailableError` at once (a worker's copy of a delivery must not go out once the
            delivery's own channel may be gone: its fallback decides).
        wait_while_blocked: While a resource alarm blocks the connection (``connection.blocked``),
            a publish sent waits for its confirm however long the alarm lasts: ``timeout`` counts
            from the last moment the connection was seen blocked. The broker holds the publish
            unread and stores it once the alarm clears, so a publish given up on and sent again
            would be stored twice (a worker's copy: two lives of its job). Default False: an
            app's enqueue raises :class:`PublishError` after ``timeout`` (its caller decides).
        give_up_blocked: Seconds a confirm is awaited while a resource alarm blocks the connection, then
            the connection is reset at once (:func:`~amqpjobs.wire.reset.abort`: the publishes held unread
            are dropped, never stored) and :class:`BrokerBlockedError` raised. None (default): ``timeout``
            alone bounds the wait.
        kept: What keeps the connection open while an alarm holds a publish past ``timeout`` (the app's
            :data:`~amqpjobs.wire.publish_outcome.KEPT_BY_APP`): its error says so (else "may or may not be stored").
    """

    def __init__(
        self,
        connection: AbstractRobustConnection,
        timeout: float = 30.0,
        max_message_size: int | None = None,
        on_confirm: Callable[[float], None] | None = None,
        serial: bool = False,
        is_modulus_exchange: Callable[[str], bool] | None = None,
        header_reserve: int = 0,
        owner: str = "the publisher",
        wait_reconnect: bool = False,
        wait_while_blocked: bool = False,
        give_up_blocked: float | None = None,
        kept: str | None = None,
    ) -> None:
        self._kept = kept
        self.held: HeldAtClose | None = None  # held by an alarm when close(held_wait) left the channel to a reset
        self._owner = owner
        self._give_up_blocked = None if wait_while_blocked else give_up_blocked
        self._wait_while_blocked = wait_while_blocked
        self._wait_reconnect = wait_reconnect
        self._closed = False  # close() was called: no channel opens again, publishes cut off say so
        self._header_reserve = header_reserve
        self._on_confirm = on_confirm
        self._one_at_a_time = asyncio.Lock() if serial else None
        self._connection = connection
        self._timeout = timeout
        self.max_message_size = max_message_size
        self._channel: AbstractChannel | None = None
        self._lock = asyncio.Lock()
        #: Publishes that found the connection's write queue full wait here, in turn (see :meth:`_writable`).
        self._room = asyncio.Lock()
        #: Exchanges seen to exist: a publish to another is checked first.
        self.exchanges = ExchangeChecks(connection, is_modulus_exchange)

    async def _discard_channel(self, channel: AbstractChannel | None = None) -> None:
        """Close and forget a channel the broker closed (a 404): stops aio-pika reopening it beside a new one.

        ``channel``: only if it is still the current one (a publish cut off by the close must not
        discard the channel that replaced it); None: the current one.
        """
        if channel is not None and channel is not self._channel:
            return
        old, self._channel = self._channel, None
        if old is not None:
            with contextlib.suppress(Exception):
                await old.close()

    async def _ensure_channel(self) -> AbstractChannel:
        channel = self._channel
        if channel is not None and not channel.is_closed:  # the common case: no lock
            return channel
        async with self._lock:
            if self._channel is None or self._channel.is_closed:
                await self._discard_channel()
                if self._closed:
                    raise PublisherClosedError(f"{self._owner} was closed")
                self._channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
                if self._closed:  # closed while the channel opened: it is closed too
                    await self._discard_channel()
                    raise PublisherClosedError(f"{self._owner} was closed")
            return self._channel

    async def publish(self, exchange: str, routing_key: str, message: OutgoingMessage) -> None:
        """Publish ``message`` to ``exchange`` (``""`` = default exchange) and wait for the confirm.

        An error says "not stored" only when the broker said so for this publish: a return, a nack,
        or a 404 naming this publish's own exchange. Any other end of a publish sent but not
        confirmed (the channel closed by another publish's error, the connection lost or closed,
        no confirm in time) is a :class:`PublishError` saying it may or may not be stored (with ``kept``, one an
        alarm holds past ``timeout`` says so).

        Raises:
            UnroutableError: the broker returned it (no queue bound for ``routing_key``), or ``exchange`` does not
                exist (404 naming it: the broker closed the channel; a new one is opened for the next publish).
            PublishNackedError: the broker nacked it (e.g. the queue is full, ``reject-publish``).
            PublishError: sent, but not confirmed (see above; the message names the job).
            MessageTooLargeError: the body is over ``max_message_size``, or the headers don't fit the connection's
                ``frame_max`` (nothing sent).
            ConfigurationError: pamqp can't encode its properties, e.g. a header value of a type AMQP
                has no field type for (nothing sent; :func:`~amqpjobs.wire.limits.encoded_size`).
            BrokerUnavailableError, BrokerError: no channel to publish on, or the connection's write
                queue stayed full for ``timeout`` (nothing sent).
            PublisherClosedError: :meth:`close` was called before it was sent (nothing sent); after,
                a :class:`PublishError` saying it may or may not be stored.
        """
        try:
            async with self._one_at_a_time or contextlib.nullcontext():
                await self._publish(exchange, routing_key, message)
        except PublishError:  # sent, or refused: its own words
            raise
        except BaseException as exc:
            if not cut_off(self._closed, exc):
                raise
            raise PublisherClosedError(
                f"{self._owner} was closed under the publish to {exchange!r} / {routing_key!r}: not sent"
            ) from exc

    async def ready(self) -> None:
        """Open the publishing channel now, else the first publish does (raises nothing: that publish says why not)."""
        with contextlib.suppress(BrokerError, BrokerUnavailableError):
            await self._open_channel("", "")

    async def check(self, exchange: str, routing_key: str, message: OutgoingMessage) -> None:
        """Refuse ``message`` as :meth:`publish` would for its size, sending nothing (a dry run, or to skip it).

        Raises:
            MessageTooLargeError: the body is over ``max_message_size``, or the headers don't fit
                the connection's ``frame_max`` (its ``reason`` says which, with the sizes).
            ConfigurationError: pamqp can't encode its properties (:func:`~amqpjobs.wire.limits.encoded_size`).
            BrokerError, BrokerUnavailableError: no channel to read ``frame_max`` from.
        """
        limits.check_body(message, self.max_message_size)
        channel = await self._open_channel(exchange, routing_key)
        with broker_errors():
            underlay = await channel.get_underlay_channel()
        limits.check_fits(message, underlay.connection.connection_tune.frame_max, self._header_reserve)

    async def _open_channel(self, exchange: str, routing_key: str) -> AbstractChannel:
        """The publishing channel; with ``wait_reconnect``, waiting up to ``timeout`` while the connection reconnects.

        Raises:
            BrokerUnavailableError: not connected (:func:`~amqpjobs.wire.connection.when_connected`).
            BrokerError: the broker refused the channel. PublisherClosedError: :meth:`close` was called.
        """
        wait = self._timeout if self._wait_reconnect else None
        try:
            return await when_connected(self._connection, self._ensure_channel, wait, exchange, routing_key)
        except LIBRARY_ERRORS as exc:
            raise BrokerError(f"publish to {exchange!r} / {routing_key!r} not sent: no channel ({exc})") from exc

    async def _writable(
        self, exchange: str, routing_key: str, started: float, message_id: str | None = None
    ) -> tuple[AbstractChannel, aiormq.Channel]:
        """A channel a publish can be queued on now without crossing a close (see :func:`heard_close`).

        The caller queues its publish with no ``await`` in between: aiormq's ``basic_publish``
        writes without suspending while the write queue has room (the channel's lock is held only
        across a put). A channel the broker closed is replaced; an exchange not seen to exist, or
        named missing by a 404 meanwhile, is checked first (so only the publishes queued before the
        broker's 404 was heard are cut off by it, once). A publish whose message id is in flight on the
        channel waits for that publish's answer (:func:`same_id_in_flight`). Publishes that find the queue full
        wait in turn (:attr:`_room`, FIFO): the first wakes when the writer emptied it
        (``Queue.join``) or :data:`_ROOM_RECHECK` later; the others sleep behind it.

        Raises:
            BrokerUnavailableError, BrokerError: no channel could be opened, the write queue stayed
                full, or the publish of the same id before it had no answer, for ``timeout`` seconds (nothing sent).
        """
        in_line = False
        checks = 0  # of the exchange, by this publish (one that could not be made lets it go: it says why)
        try:
            while True:
                channel = self._channel
                if channel is None or channel.is_closed:
                    channel = await self._open_channel(exchange, routing_key)
                try:
                    # aio-pika's per-message objects cost more; an aiormq.Channel (its abc has no ``wait``)
                    underlay = cast(aiormq.Channel, await channel.get_underlay_channel())
                except _CLOSED as exc:  # closed under us: nothing sent yet
                    await self._discard_channel(channel)
                    raise BrokerUnavailableError(f"publish to {exchange!r} / {routing_key!r} not sent: {exc}") from exc
                write_queue = underlay.connection.write_queue
                if self._closed:
                    raise PublisherClosedError(f"{self._owner} was closed")
                elif heard_close(underlay):  # the broker closed it (another publish's 404): a new one
                    self.exchanges.forget_missing(getattr(underlay, "_close_exception", None))
                    await self._discard_channel(channel)
                elif not self.exchanges.seen(exchange) and checks < 2:  # first publish to it, or a 404 named it since
                    if in_line:  # no room taken while the check's round trip runs
                        self._room.release()
                        in_line = False
                    checks += 1
                    await self.exchanges.check(exchange)
                elif (earlier := same_id_in_flight(underlay, message_id)) is not None:  # one answer each
                    if (left := self._timeout - (time.monotonic() - started)) <= 0:
                        raise BrokerError(
                            f"publish to {exchange!r} / {routing_key!r} not sent: the publish of id "
                            f"{message_id!r} before it had no answer within {self._timeout:g}s"
                        )
                    if in_line:
                        self._room.release()
                        in_line = False
                    await asyncio.wait([earlier], timeout=left)
                elif not write_queue.full() and (in_line or not self._room.locked()):
                    return channel, underlay  # (the room lock is released below, without a step in between)
                elif time.monotonic() - started > self._timeout:
                    raise BrokerError(
                        f"publish to {exchange!r} / {routing_key!r} not sent: the connection's write queue stayed "
                        f"full for {self._timeout:g}s (a blocked or stalled connection)"
                    )
                elif not in_line:
                    await self._room.acquire()
                    in_line = True
                else:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(_ROOM_RECHECK):
                            await write_queue.join()  # the writer took every frame queued
        finally:
            if in_line:
                self._room.release()

    async def _publish(self, exchange: str, routing_key: str, message: OutgoingMessage) -> None:
        limits.check_body(message, self.max_message_size)
        exact = exact_properties(message)  # the bytes pamqp would write, in one pass (None: pamqp encodes them)
        properties = limits.amqp_properties(message) if exact is None else exact
        sent = time.monotonic()
        channel, underlay = await self._writable(exchange, routing_key, sent, message.message_id)
        stretched: WhileBlocked | GiveUpWhileBlocked | None = None
        try:
            with broker_errors():
                frame_max = underlay.connection.connection_tune.frame_max
                limits.check_header_fits(properties, message.headers, frame_max, self._header_reserve)
                # No await since _writable's check: the frames go ahead of any close-ok, or not at all.
                confirmation = queue_publish(underlay, exchange, routing_key, message.body, properties)
                tag = underlay.delivery_tag  # its delivery tag (when queued here)
                async with asyncio.timeout(self._timeout) as window:
                    stretched = confirm_watch(
                        self._connection, window, self._timeout, self._wait_while_blocked, self._give_up_blocked
                    )
                    try:
                        if confirmation is not None:  # aiormq's bookkeeping, without its objects
                            await confirmation
                        else:  # wait=False: the confirm is what is waited for (a lost connection fails it)
                            await underlay.basic_publish(
                                message.body, exchange=exchange, routing_key=routing_key, properties=properties,
                                mandatory=True, wait=False,
                            )  # fmt: skip
                    finally:
                        if stretched is not None:
                            stretched.cancel()
        except UnroutableError as exc:  # a basic.return of this very message
            raise UnroutableError(unroutable(exchange, routing_key)) from exc.__cause__
        except PublishNackedError as exc:  # a nack of this publish's delivery tag
            raise PublishNackedError(nacked(exchange, routing_key)) from exc.__cause__
        except asyncio.CancelledError as exc:  # the confirm's future, cancelled when close() closed the connection
            if not cut_off(self._closed, exc):
                raise
            await self._closed_under(channel, underlay, exchange, routing_key, message, exc)
        except TimeoutError as exc:
            alarm = stretched.alarm if isinstance(stretched, GiveUpWhileBlocked) else None
            blocked = blocked_by(self._connection) if self._kept else None  # held unread: say what keeps it
            if blocked is not None and confirmation is not None:  # its late answer is logged, as the sync path's
                watch_late_answer(underlay, tag, message)
            raise no_confirm(
                exchange, routing_key, message, self._timeout, alarm, self._give_up_blocked or 0.0, blocked, self._kept
            ) from exc
        except limits.ENCODING_ERRORS:  # aiormq encodes as it sends (nothing sent); pamqp's refusal is named
            limits.encoded_size(properties)
            raise
        except BrokerError as exc:  # the channel or connection closed under the publish (404, lost, forced, ...)
            await self._closed_under(channel, underlay, exchange, routing_key, message, exc.__cause__ or exc)
        except Exception as exc:
            if type(exc) is not Exception:  # ours (MessageTooLargeError ...) or a bug: as it is
                raise
            # aiormq fails the confirms of a channel closed without a reason with a bare Exception
            await self._closed_under(channel, underlay, exchange, routing_key, message, exc)
        if self._on_confirm is not None:
            self._on_confirm(time.monotonic() - sent)

    async def _closed_under(
        self, channel: AbstractChannel, underlay: aiormq.Channel, exchange: str, routing_key: str,
        message: OutgoingMessage, exc: BaseException,
    ) -> NoReturn:  # fmt: skip
        """The channel or connection closed under an unconfirmed publish: what that says of it (:func:`closed_under`).

        The broker's reason for closing the channel (aiormq's ``_close_exception``; else ``exc``) is read,
        whichever publish's confirm failed first.

        Raises:
            UnroutableError, MessageTooLargeError: the broker's close was about this publish.
            PublishError: it may or may not be stored.
        """
        reason = getattr(underlay, "_close_exception", None) or exc
        text = str(reason)
        if heard_close(underlay):
            # the broker closed the channel: close ours now, so that no task of aio-pika's is left holding
            # the 404 unretrieved ("unhandled exception during asyncio.run() shutdown") if the app is not closed
            await self._discard_channel(channel)
        self.exchanges.forget_missing(reason)
        code = reply_code(reason)
        if over_max_size(code, text):
            await self._discard_channel(channel)  # the next publish opens another
            if (limit := max_size_in(text)) is not None:  # later bodies over it are refused before sending
                self.max_message_size = limit if self.max_message_size is None else min(limit, self.max_message_size)
        dropped = self.held.alarm if self.held is not None and ending(self._connection) else None  # reset: dropped
        owner = self._owner if self._closed else None
        raise closed_under(text, code, exchange, routing_key, message, lambda: self.exchanges.missing(exchange), owner,
                           dropped) from reason  # fmt: skip

    async def close(self, held_wait: float | None = None) -> None:
        """Close the publisher's channel; a publish under way or later raises :class:`PublisherClosedError` (not sent).

        A publish sent but not confirmed when the channel or connection closes raises :class:`PublishError` (it may or
        may not be stored). ``held_wait`` (seconds): while a resource alarm blocks the connection, wait that long for
        it to clear, then leave the channel to the caller's reset, its jobs in :attr:`held` (:func:`held_at_close`).
        """
        self._closed = True
        channel, self._channel = self._channel, None
        if channel is not None and not channel.is_closed:
            if held_wait is not None:
                underlay = cast(aiormq.Channel, await channel.get_underlay_channel())
                self.held = await held_at_close(self._connection, underlay, held_wait)
            if self.held is None:
                await channel.close()
