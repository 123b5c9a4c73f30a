"""The one error map: aio-pika / aiormq / pamqp exceptions into :mod:`amqpjobs.errors`.

One table (:data:`ERROR_MAP`, first match wins, most specific first) and one context
manager (:func:`broker_errors`), as httpx maps its transports' errors. Code in ``wire/``
runs client-library calls inside ``with broker_errors():`` and catches our classes only;
nothing above the wire sees a client-library exception. The library exception is kept
as ``__cause__``.

``ConnectionError`` is in the table too: the client raises it (an ``OSError``) when the
socket goes under a call.
"""

from __future__ import annotations

import re
import shlex
from types import TracebackType
from typing import Final

import aio_pika.exceptions
import aiormq.exceptions
import pamqp.exceptions

from amqpjobs.errors import (
    AmqpJobsError,
    BrokerError,
    BrokerUnavailableError,
    ChannelClosedError,
    NotFoundError,
    PreconditionFailedError,
    PublishNackedError,
    ResourceLockedError,
    UnaddressableNameError,
    UnroutableError,
)
from amqpjobs.topology.naming import ADDRESSABLE_CHARS, MAX_CLIENT_NAME
from amqpjobs.wire.channel_room import limit_fix, with_limit_fix

#: (client-library exception, our exception), first ``isinstance`` match wins.
ERROR_MAP: Final[tuple[tuple[type[BaseException], type[AmqpJobsError]], ...]] = (
    (aiormq.exceptions.PublishError, UnroutableError),  # basic.return of a mandatory publish
    (aiormq.exceptions.DeliveryError, PublishNackedError),  # basic.nack
    (aiormq.exceptions.ChannelNotFoundEntity, NotFoundError),
    (pamqp.exceptions.AMQPNotFound, NotFoundError),
    (aiormq.exceptions.ChannelLockedResource, ResourceLockedError),
    (pamqp.exceptions.AMQPResourceLocked, ResourceLockedError),
    (aiormq.exceptions.ChannelPreconditionFailed, PreconditionFailedError),
    (pamqp.exceptions.AMQPPreconditionFailed, PreconditionFailedError),
    (aiormq.exceptions.ChannelInvalidStateError, ChannelClosedError),  # used after it closed
    (aiormq.exceptions.ChannelClosed, ChannelClosedError),
    (aiormq.exceptions.AMQPConnectionError, BrokerUnavailableError),  # refused, auth, closed
    (aio_pika.exceptions.MessageProcessError, BrokerError),
    (aiormq.exceptions.AMQPError, BrokerError),
    (pamqp.exceptions.PAMQPException, BrokerError),
    (ConnectionError, BrokerUnavailableError),
)

#: Every client-library exception the map knows (for an ``except`` that only needs "the
#: broker failed", on a hot path where building our exception would cost).
LIBRARY_ERRORS: Final[tuple[type[BaseException], ...]] = tuple(library for library, _ in ERROR_MAP)
#: What opening a channel raises while its connection is down (aio-pika reconnects by itself): the library's
#: errors, and the ``RuntimeError`` of aio-pika ("Connection was not opened") and aiormq ("<Connection ...> closed").
CHANNEL_OPEN_ERRORS: Final[tuple[type[BaseException], ...]] = (*LIBRARY_ERRORS, RuntimeError)


#: pamqp's own words when it refuses a name before sending a frame (``pamqp.commands`` validate()).
_PAMQP_NAME_REFUSAL: Final = re.compile(r"(Invalid value|Max length exceeded) for (queue|exchange|destination|source)")


def unaddressable(exc: BaseException, name: str | None) -> UnaddressableNameError | None:
    """Our error for pamqp's ``ValueError`` refusing a queue/exchange name (None: ``exc`` is not that).

    pamqp checks names against ``[a-zA-Z0-9-_.:@#,/+ ]`` and 256 characters (127 for an
    exchange; the rule's home: :func:`amqpjobs.topology.naming.unaddressable_problem`),
    stricter than RabbitMQ (any UTF-8, 255 bytes: RabbitMQ "Queues" →
    "Names"), so a queue made by another client or the management UI can be out of reach.
    """
    if type(exc) is not ValueError or not (m := _PAMQP_NAME_REFUSAL.fullmatch(str(exc))):
        return None
    kind = "queue" if m.group(2) == "queue" else "exchange"
    what = f"{kind} {name!r}" if name is not None else f"a {kind} name"
    why = (f"is too long for it (over {MAX_CLIENT_NAME[kind]} characters)" if m.group(1).startswith("Max")
           else f"has characters it does not accept (only {ADDRESSABLE_CHARS})")  # fmt: skip
    ours = UnaddressableNameError(
        f"{what} can't be addressed by the AMQP client: the name {why}, though RabbitMQ accepts it; "
        f"rename it within those characters (move its messages to a new {kind}, e.g. with a shovel from the "
        "management UI, and delete it) to use it with amqpjobs",
        name or "",
    )
    ours.__cause__ = exc
    return ours


#: RabbitMQ 3.x's words when a classic queue's node is down: ``NOT_FOUND - home node 'rabbit@b' of durable
#: queue 'q' in vhost '/' is down or inaccessible`` (measured on 3.10 with scripts/cluster.sh).
_HOME_NODE_DOWN: Final = re.compile(r"home node .* of durable queue .* is down or inaccessible")


def home_node_down(exc: BaseException) -> bool:
    """Whether ``exc`` (a 404 ``NOT_FOUND``) says a queue exists but its node is down: not that it is missing."""
    return error_kind(exc) is NotFoundError and _HOME_NODE_DOWN.search(str(exc)) is not None


def access_refused(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, is the broker's 403 ``ACCESS_REFUSED`` (permissions)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, aiormq.exceptions.ChannelAccessRefused | pamqp.exceptions.AMQPAccessRefused):
            return True
        seen = seen.__cause__
    return False


#: The channel-close reply codes (AMQP 0-9-1 "Constants") of the errors the map names by code.
_REPLY_CODES: Final[dict[type[AmqpJobsError], int]] = {NotFoundError: 404, ResourceLockedError: 405,
                                                        PreconditionFailedError: 406}  # fmt: skip


def reply_code(exc: BaseException) -> int | None:
    """The channel-close reply code (404, 405, 406) client-library exception ``exc`` stands for (None: another)."""
    kind = error_kind(exc)
    return None if kind is None else _REPLY_CODES.get(kind)


def error_kind(exc: BaseException) -> type[AmqpJobsError] | None:
    """Which of our exceptions client-library exception ``exc`` maps to (None: not one)."""
    for library, ours in ERROR_MAP:
        if isinstance(exc, library):
            return ours
    return None


def library_error(exc: BaseException) -> AmqpJobsError:
    """Our error for a client-library exception no wire call translated, as a command or a worker child says it.

    :func:`translate`'s when it knows ``exc``, else a :class:`BrokerError` of its words; a channel
    limit's refusal gets its fix (:func:`~amqpjobs.wire.channel_room.with_limit_fix`). The one rule
    of ``amqpjobs`` commands' ``broker error: ...`` line and of a ``--processes`` child's error.
    """
    error = translate(exc) or BrokerError(str(exc) or type(exc).__name__)
    text = with_limit_fix(str(error))
    return error if text == str(error) else BrokerError(text)


def translate(exc: BaseException, name: str | None = None) -> AmqpJobsError | None:
    """Our exception for client-library exception ``exc`` (cause set), or None when it is not one.

    ``name``: the queue or exchange the call was about, named in an :class:`UnaddressableNameError`.
    """
    if isinstance(exc, AmqpJobsError):
        return None
    if (refused := unaddressable(exc, name)) is not None:
        return refused
    ours = error_kind(exc)
    if ours is None:
        return None
    mapped = ours((str(exc) or type(exc).__name__) + internal_error_hint(exc) + channel_limit_hint(exc))
    mapped.__cause__ = exc
    return mapped


def channel_limit_hint(exc: BaseException) -> str:
    """``; fix: ...`` for a connection closed at a channel past ``channel_max`` or a user's max-channels. Else ``""``.

    RabbitMQ's 530 NOT_ALLOWED words name the limit, not what to change.
    """
    text = str(exc)
    if isinstance(exc, aiormq.exceptions.ConnectionNotAllowed) and ("channel_max" in text or "user limit" in text):
        return f"; fix: {limit_fix(text)}"
    return ""


class ChannelReopening(ConnectionError):
    """A consume found its channel closed on a live connection: aio-pika reopens it, and its reopen hook consumes.

    Not worth a WARNING of its own (a resume that raced a reconnect's channel restore): the reopen's
    ``consuming <queue> again after a reconnect`` line says the outcome.
    """


class _Translating:
    """The context manager of :func:`broker_errors` (one shared instance when no name is given)."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is None:
            return
        mapped = translate(exc, self.name)
        if mapped is not None:
            raise mapped from exc


_TRANSLATING: Final = _Translating()


def broker_errors(name: str | None = None) -> _Translating:
    """A context manager re-raising a client-library exception as ours (:data:`ERROR_MAP`).

    ``name``: the queue or exchange the calls inside are about; pamqp's ``ValueError``
    refusing it becomes :class:`~amqpjobs.errors.UnaddressableNameError` naming it.
    Anything else (ours, ``TimeoutError``, cancellation) passes through unchanged.
    """
    return _TRANSLATING if name is None else _Translating(name)


#: What a connection closed with 541 INTERNAL_ERROR most likely met (README "Wire format").
UNDELIVERABLE_HINT: Final = (
    ": RabbitMQ failed while sending this connection something and closed it; the usual cause is a message "
    "it cannot deliver over AMQP 0-9-1 at the head of the queue being read (the broker's log says "
    "content_properties_shortstr_overflow: a property such as correlation_id, or a header's name, over 255 "
    "bytes, taken in through the management API's HTTP publish or another protocol). Every delivery of it "
    "closes the connection and leaves it in place. Remove it in the management UI: the queue's 'Get "
    "messages' (Ack mode 'Nack message requeue true') shows it and keeps it; 'Automatic ack' removes it; "
    "publish it again with every property and header name within 255 bytes"
)


def internal_error_hint(exc: BaseException | None) -> str:
    """:data:`UNDELIVERABLE_HINT` when ``exc`` is a connection closed with 541 INTERNAL_ERROR, else ``""``."""
    return UNDELIVERABLE_HINT if isinstance(exc, aiormq.exceptions.ConnectionInternalError) else ""


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a call on a robust connection, is that connection going away (True), not a refusal.

    True, and aio-pika reconnects by itself, so a call that can wait may be made again after it:

    - a ``connection.close`` with 320 CONNECTION_FORCED (an operator closed it, a node stops) or no
      reply code (aiormq's plain ``ConnectionClosed``);
    - 541 INTERNAL_ERROR: the broker failed sending this connection something, most often a message no
      AMQP 0-9-1 client can receive (:data:`UNDELIVERABLE_HINT`; the worker's rescue mends it);
    - the socket cut or refused (``ConnectionError``, aiormq's other ``AMQPConnectionError``) or a
      channel used while its connection reconnects (``ChannelInvalidStateError``).

    False for the other hard errors, 501-540 (e.g. 530 NOT_ALLOWED past ``channel_max``, 504
    CHANNEL_ERROR): the same call would be refused again after the reconnect, so it is said, not
    waited out; and for anything else (a channel error: a 404, a 406).
    """
    if isinstance(exc, aiormq.exceptions.ConnectionClosed):
        return type(exc) in (aiormq.exceptions.ConnectionClosed, aiormq.exceptions.ConnectionInternalError)
    return isinstance(exc, ConnectionError | aiormq.exceptions.ChannelInvalidStateError)


def open_refused(exc: BaseException) -> bool:
    """Whether ``exc`` is aiormq's word for the broker's 530 answer to ``connection.open`` (see below)."""
    text = str(exc)
    return (
        isinstance(exc, aiormq.exceptions.InvalidFrameError)
        and "Connection.OpenOk" in text
        and "Connection.Close" in text
    )


def refused_connect_reason(exc: BaseException, vhost: str, username: str) -> str:
    """Why the broker refused a connect after the handshake, in words (``exc``: what the client raised).

    RabbitMQ answers ``connection.open`` of a vhost that does not exist, or that the user
    has no permissions on, or whose ``max-connections`` limit is reached, with
    ``connection.close`` 530 NOT_ALLOWED (RabbitMQ "Access Control": "virtual host access";
    "Virtual Hosts": limits); aiormq reports that as an ``InvalidFrameError`` ("Expected one of
    ['Connection.OpenOk'], got <Connection.Close ...>") and keeps no reply code nor text, so the
    expected/got text is what tells it apart (and can't tell those three apart).
    """
    if open_refused(exc):
        return (
            f"vhost {vhost!r} does not exist or user {username!r} has no access to it, or a max-connections limit "
            f"is reached, the vhost's or the user's (rabbitmqctl list_vhost_limits -p {shlex.quote(vhost)}, "
            f"list_user_limits --user {shlex.quote(username)}; raise one with set_vhost_limits, or set_user_limits "
            f"{shlex.quote(username)} '{{\"max-connections\": N}}')"
        )
    return f"{type(exc).__name__}: {exc} (does vhost {vhost!r} exist, with permissions for {username!r}?)"


def met_internal_error(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from (cause or context), is a connection closed with 541."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        if isinstance(at, aiormq.exceptions.ConnectionInternalError) or UNDELIVERABLE_HINT in str(at):
            return True
        seen.add(id(at))
        at = at.__cause__ or at.__context__
    return False


#: What aio-pika and aiormq raise (a ``RuntimeError``, none of their own errors) for a call on a connection that
#: is down or reconnecting: aio-pika's "Connection was not opened" / "Connection is not ready", aiormq's
#: "<Connection: ...> closed" (its URL in it).
_NOT_CONNECTED: Final = re.compile(r"Connection was not opened|Connection is not ready|<Connection: .*> closed", re.S)
#: Our words for them.
NOT_CONNECTED: Final = "not connected to the broker (it reconnects by itself)"


def in_our_words(exc: BaseException) -> str:
    """``exc``'s text for a log line: the client libraries' words for a connection that is down in ours.

    Those become :data:`NOT_CONNECTED`; anything else stays as it is (its type when it has no text).
    """
    text = str(exc)
    if type(exc) is RuntimeError and _NOT_CONNECTED.fullmatch(text):
        return NOT_CONNECTED
    return text or type(exc).__name__
