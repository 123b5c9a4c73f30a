"""The scheduler's AMQP: election channel, tick stores, running markers, the tick transaction.

Everything the scheduler (:mod:`amqpjobs.runtime.scheduler`) and the overlap guard
(:mod:`amqpjobs.runtime.overlap`) do on the broker goes through here, and aiormq errors
are caught where each channel is opened: in :func:`_on_channel` (aio-pika's throwaway
channels) a refusal the caller asked about (``NOT_FOUND``, ``RESOURCE_LOCKED``,
``PRECONDITION_FAILED``) becomes an answer, any other broker error a
:class:`~amqpjobs.errors.BrokerError` (or, inside start-up declarations, passes on
untouched for :func:`~amqpjobs.wire.declare.declaring` to name a Khepri minority); in
:func:`_plain_channel` (the tick transaction's) every broker error is a ``BrokerError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import aiormq.abc
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection

from amqpjobs.errors import BrokerError, NotFoundError, PreconditionFailedError, ResourceLockedError
from amqpjobs.message import OutgoingMessage
from amqpjobs.topology.declarations import QueueDecl
from amqpjobs.wire.arguments import queue_arguments
from amqpjobs.wire.errors import CHANNEL_OPEN_ERRORS, LIBRARY_ERRORS, channel_limit_hint, error_kind, home_node_down
from amqpjobs.wire.limits import amqp_properties

#: The connection, channel and delivery types the scheduler holds (aio-pika's, named here).
Connection = AbstractRobustConnection
Channel = AbstractChannel
Token = AbstractIncomingMessage
#: A plain aiormq channel (no reopening by itself), for the tick transaction.
RawChannel = aiormq.abc.AbstractChannel

#: What the client library raises when the broker or the connection fails (the one error map's).
BROKER_ERRORS: tuple[type[BaseException], ...] = LIBRARY_ERRORS
_OPEN_ERRORS: tuple[type[BaseException], ...] = (*CHANNEL_OPEN_ERRORS, TimeoutError)

Refusal = Literal["missing", "locked", "mismatch"]
#: Our errors (:mod:`amqpjobs.wire.errors`) the scheduler expects as answers, not failures.
_REFUSALS: tuple[tuple[type[Exception], Refusal], ...] = (
    (NotFoundError, "missing"),
    (ResourceLockedError, "locked"),
    (PreconditionFailedError, "mismatch"),
)


class _Closable(Protocol):
    def close(self) -> Awaitable[Any]: ...


async def close_quietly(closable: _Closable | None) -> None:
    """Close a channel (or a publisher) and ignore that the broker or connection is gone."""
    if closable is None:
        return
    with contextlib.suppress(*BROKER_ERRORS, RuntimeError):
        await closable.close()


@contextlib.asynccontextmanager
async def throwaway_channel(connection: Connection) -> AsyncIterator[Channel]:
    """A channel closed on exit even after a channel error.

    A robust channel closed by the broker (e.g. by a failed passive declare) reopens itself
    unless ``close()`` is called; checking ``is_closed`` first would leak the reopened one.

    Raises:
        BrokerError: the channel could not be opened.

    """
    try:
        channel = await connection.channel(publisher_confirms=False)
    except _OPEN_ERRORS as exc:
        raise BrokerError(f"could not open a channel: {exc}{channel_limit_hint(exc)}") from exc
    try:
        yield channel
    finally:
        await close_quietly(channel)


@dataclass
class _Answer:
    refusal: Refusal | None = None


@contextlib.asynccontextmanager
async def _on_channel(
    connection: Connection, what: str | None, refusals: Iterable[Refusal] = (), translate: bool = True
) -> AsyncIterator[tuple[Channel, _Answer]]:
    """A throwaway channel; the one place this module catches aiormq errors.

    A refusal listed in ``refusals`` is recorded in the answer (and the block left); any
    other broker error leaves as ``BrokerError("<what>: <error>")`` (just the error's text
    when ``what`` is None), or untouched when ``translate`` is False.
    """
    answer = _Answer()
    wanted = set(refusals)
    try:
        async with throwaway_channel(connection) as channel:
            yield channel, answer
    except BROKER_ERRORS as exc:
        ours = error_kind(exc)
        kind = next((k for cls, k in _REFUSALS if ours is not None and issubclass(ours, cls)), None)
        if kind == "missing" and home_node_down(exc):  # there, on a node that is down: not an answer
            kind = None
        if kind is not None and kind in wanted:
            answer.refusal = kind
            return
        if not translate:
            raise
        raise BrokerError((str(exc) if what is None else f"{what}: {exc}") + channel_limit_hint(exc)) from exc


def holds(token: Token | None) -> bool:
    """True while ``token`` is held on an open channel."""
    if token is None:
        return False
    try:
        return not token.channel.is_closed
    except LIBRARY_ERRORS:  # the channel is gone
        return False


async def exists(connection: Connection, kind: Literal["exchange", "queue"], name: str) -> bool:
    """Whether the exchange or queue ``name`` exists (a passive declare); other errors pass on untouched."""
    async with _on_channel(connection, None, ("missing",), translate=False) as (channel, answer):
        if kind == "exchange":
            await channel.declare_exchange(name, passive=True)
        else:
            await channel.declare_queue(name, passive=True)
    return answer.refusal is None


async def declare_durable(connection: Connection, name: str, arguments: Mapping[str, Any]) -> bool:
    """Declare the durable queue ``name``; False when it exists with other arguments."""
    async with _on_channel(connection, None, ("mismatch",), translate=False) as (channel, answer):
        await channel.declare_queue(name, durable=True, arguments=dict(arguments))
    return answer.refusal is None


async def declare_or_legacy(connection: Connection, queue: QueueDecl) -> Literal["declared", "legacy", "other"]:
    """Declare the durable ``queue``; found in its :meth:`~QueueDecl.legacy_shape` instead, leave it so.

    Returns:
        ``declared``; ``legacy`` (it exists in its legacy shape); ``other`` (it exists with
        other arguments still).

    Raises:
        BrokerError: ``"declaring queue <name> failed: <error>"`` on any other broker error.

    """
    for shape in (queue, queue.legacy_shape()):
        if shape is None:
            break
        async with _on_channel(connection, f"declaring queue {queue.name} failed", ("mismatch",)) as (channel, answer):
            await channel.declare_queue(queue.name, durable=True, arguments=queue_arguments(shape))
        if answer.refusal is None:
            return "declared" if shape is queue else "legacy"
    return "other"


async def probe(connection: Connection, name: str, what: str) -> Literal["exists", "missing", "locked"]:
    """Passively declare queue ``name``: it exists, is missing, or is another connection's exclusive queue.

    Raises:
        BrokerError: ``"<what>: <error>"`` on any other broker error.

    """
    async with _on_channel(connection, what, ("missing", "locked")) as (channel, answer):
        await channel.declare_queue(name, passive=True)
    return "exists" if answer.refusal is None else ("missing" if answer.refusal == "missing" else "locked")


async def hold_exclusive(connection: Connection, name: str, arguments: Mapping[str, Any]) -> bool:
    """Declare the exclusive queue ``name`` on ``connection``; False when another connection holds it."""
    async with _on_channel(connection, None, ("locked",), translate=False) as (channel, answer):
        await channel.declare_queue(name, exclusive=True, durable=False, auto_delete=False, arguments=dict(arguments))
    return answer.refusal is None


async def delete_queue(connection: Connection, name: str, within: float) -> None:
    """Delete queue ``name`` (empty or not).

    Raises:
        BrokerError: the broker failed (the error's text).
        TimeoutError: no answer within ``within`` seconds.

    """
    async with _on_channel(connection, None) as (channel, _):
        queue = await channel.get_queue(name, ensure=False)
        await asyncio.wait_for(queue.delete(if_unused=False, if_empty=False), within)


async def browse_bodies(connection: Connection, queue: str, limit: int, what: str) -> list[bytes]:
    """The bodies of up to ``limit`` messages at the head of ``queue``; closing the channel returns them.

    Raises:
        BrokerError: ``"<what>: <error>"`` (the queue is missing, or the broker failed).

    """
    bodies: list[bytes] = []
    async with _on_channel(connection, what) as (channel, _):
        store = await channel.get_queue(queue, ensure=False)
        for _ in range(limit):
            message = await store.get(no_ack=False, fail=False)
            if message is None:
                break
            bodies.append(message.body)
    return bodies


async def publish_in_transaction(
    connection: Connection,
    messages: Iterable[tuple[str, str, OutgoingMessage, bool]],
    still_allowed: Callable[[], bool],
    what: str,
    late: str,
    commit_timeout: float = 30,
) -> list[str] | None:
    """Publish ``(exchange, routing key, message, mandatory)`` items in one AMQP transaction.

    The commit is sent only when ``still_allowed()`` is true after the publishes; otherwise
    closing the channel discards them. RabbitMQ routes each publish when it arrives but
    returns an unroutable ``mandatory`` one (``basic.return``) only while committing, before
    ``tx.commit-ok``: the rest of the transaction is committed all the same, and the returns
    are collected here (aiormq drops them on a channel without publisher confirms).

    Nothing is sent on the channel after the broker may have closed it (see
    :func:`_check_exchanges`): a frame that crosses the broker's close can make it close the
    whole connection (RabbitMQ 4.3).

    Returns:
        None when ``still_allowed()`` said no (nothing was published); else the returned
        messages, each as ``"to exchange '<x>' key '<k>': <reply code> <reply text>"``
        (empty: every mandatory message reached a queue).

    Raises:
        BrokerError: ``"<what>: <error>"`` (nothing was published; a missing exchange:
            ``NOT_FOUND - no exchange '<x>' in vhost '<v>'``), ``"could not open a channel:
            <error>"``, or ``late`` when no ``tx.commit-ok`` came within ``commit_timeout``
            (the commit may have happened).

    """
    items = list(messages)
    returned: list[str] = []
    try:
        async with _plain_channel(connection, what) as raw:
            _collect_returns(raw, returned)
            await raw.tx_select()
            await _check_exchanges(raw, [exchange for exchange, _, _, _ in items])
            for exchange, routing_key, message, mandatory in items:
                await raw.basic_publish(
                    message.body, exchange=exchange, routing_key=routing_key,
                    properties=amqp_properties(message), mandatory=mandatory,
                )  # fmt: skip
            if not still_allowed():
                return None  # closing the channel discards the uncommitted publishes
            await raw.tx_commit(timeout=commit_timeout)  # the returns are read before its answer
    except TimeoutError as exc:
        raise BrokerError(late) from exc
    return returned


@contextlib.asynccontextmanager
async def _plain_channel(connection: Connection, what: str) -> AsyncIterator[RawChannel]:
    """A plain aiormq channel of ``connection`` (no confirms), closed on exit; the tick transaction's.

    Not aio-pika's robust channel: one the broker closes stays closed (a robust one reopens
    itself at once, on the same channel number), and a reconnect can't move our publishes
    onto a new channel that is not in transaction mode. Closing one the broker closed sends
    nothing (aiormq has answered the broker's ``channel.close``).

    Raises:
        BrokerError: ``"could not open a channel: <error>"``, or ``"<what>: <error>"`` for a
            broker error in the block.

    """
    transport = connection.transport
    if transport is None:
        raise BrokerError("could not open a channel: not connected to the broker (it reconnects by itself)")
    try:
        raw = await transport.connection.channel(publisher_confirms=False)
    except _OPEN_ERRORS as exc:
        raise BrokerError(f"could not open a channel: {exc}{channel_limit_hint(exc)}") from exc
    try:
        yield raw
    except BROKER_ERRORS as exc:
        raise BrokerError(f"{what}: {exc}{channel_limit_hint(exc)}") from exc
    finally:
        await close_quietly(raw)


async def _check_exchanges(raw: RawChannel, exchanges: Iterable[str]) -> None:
    """Passively declare each exchange of ``exchanges`` (but the default one) on ``raw``, before any publish.

    A publish into a missing exchange has no answer: the broker closes the channel while
    the client goes on sending (the next publish, ``tx.commit``), and RabbitMQ 4.3 sometimes
    takes such a frame for one on a channel never opened and closes the whole connection
    (``504 CHANNEL_ERROR - expected 'channel.open'``, logged as "operation tx.commit caused a
    connection exception"; 15 of 39 runs of 200-300 transactions on 4.3.6; 3.10 and 4.0
    ignore it). A passive declare is answered, so the channel closes while nothing else is
    on its way. An exchange deleted in the moment between the two is not covered.

    Raises:
        aiormq.exceptions.ChannelNotFoundEntity: an exchange is missing (the channel is closed).

    """
    for exchange in dict.fromkeys(exchanges):
        if exchange:  # the default exchange always exists and can't be declared
            await raw.exchange_declare(exchange, passive=True)


def _collect_returns(raw: Any, returned: list[str]) -> None:
    """Make ``raw`` (an aiormq channel without confirms) append each ``basic.return`` to ``returned``.

    aiormq's reader reads a return's content and then logs it as unhandled, having no
    publisher confirm to fail; the frames are read in order, so every return of a
    transaction is in ``returned`` once ``tx.commit-ok`` is. ``_on_return_frame`` is aiormq
    7's private hook (no public one sees returns without confirms); the scheduler's
    returned-tick integration test fails if it changes.
    """
    read_content = raw._on_return_frame

    async def on_return(frame: Any) -> None:
        returned.append(f"to exchange {frame.exchange!r} key {frame.routing_key!r}: {frame.reply_code} "
                        f"{frame.reply_text}")  # fmt: skip
        with _quiet_unhandled(frame):
            await read_content(frame)

    raw._on_return_frame = on_return


_AIORMQ_LOG = logging.getLogger("aiormq.channel")


class _DropReturnOf(logging.Filter):
    """Drops aiormq's "Unhandled message ... returning" record of the return ``frame`` only."""

    def __init__(self, frame: Any) -> None:
        super().__init__()
        self.frame = frame

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (args and getattr(args[0], "delivery", None) is self.frame)


@contextlib.contextmanager
def _quiet_unhandled(frame: Any) -> Iterator[None]:
    """Hide aiormq's log line for the return ``frame``, collected here."""
    drop = _DropReturnOf(frame)
    _AIORMQ_LOG.addFilter(drop)
    try:
        yield
    finally:
        _AIORMQ_LOG.removeFilter(drop)


async def join_election(
    connection: Connection, queue: str, arguments: Mapping[str, Any], on_token: Callable[[Token], Awaitable[None]]
) -> Channel:
    """Consume the election queue with prefetch 1 on a channel of its own (returned; close it to leave).

    Broker errors pass on untouched (inside :func:`~amqpjobs.wire.declare.declaring`).
    """
    election = await connection.channel(publisher_confirms=False)
    await election.set_qos(prefetch_count=1)
    declared = await election.declare_queue(queue, durable=True, arguments=dict(arguments))
    await declared.consume(on_token)
    return election
