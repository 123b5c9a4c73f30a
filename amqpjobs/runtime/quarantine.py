"""Quarantine operations over the wire: browse, list, export, purge, and the mover lock.

Browsing uses ``basic.get`` without acking and then closes the channel, so every browsed
message returns to the quarantine queue (RabbitMQ "Consumer Acknowledgements" →
"Negative Acknowledgement and Requeuing": a requeued message goes back to its original
position where possible). Browsed messages come back with ``redelivered = true``; their
order is kept on classic queues.

Moving messages out is :mod:`amqpjobs.runtime.replay` (back to their work queues) and
:mod:`amqpjobs.runtime.parking` (to the parked queue, or deleted).

One mover per quarantine queue at a time: whatever takes messages out of one (replay,
purge, park, filtered purge; later console actions) holds :func:`mover_lock` while it
does, and a second is refused at once with :class:`~amqpjobs.errors.BusyError` naming the
first. Two replays of one queue would otherwise each replay the other's returning
failures. Browsing does not take the lock (see :func:`browse`).
"""

from __future__ import annotations

import base64
import os
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from amqpjobs.errors import (
    BrokerError,
    ConfigurationError,
    NotFoundError,
    ResourceLockedError,
)
from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.holding_moves import other_queue_problem
from amqpjobs.jobs.json_fast import strict_loads
from amqpjobs.printable import json_text
from amqpjobs.runtime.mover_names import mover_program
from amqpjobs.runtime.undeliverable_mend import PastUndeliverable
from amqpjobs.topology.naming import PARKED_SUFFIX, QUARANTINE_SUFFIX
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.acks import DeliveryChannelClosed
from amqpjobs.wire.alarms import blocked_by
from amqpjobs.wire.browse import probe_queue, purge_queue
from amqpjobs.wire.connection import connect
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.errors import LIBRARY_ERRORS
from amqpjobs.wire.lock import HeldLock, LockHolder, exclusive_lock
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.reset import reset
from amqpjobs.wire.settings import BrokerSettings

_T = TypeVar("_T")

#: A move (replay, park, filtered purge) stopped by the broker: the channel or connection failed mid-move.
INTERRUPTED: tuple[type[BaseException], ...] = (*LIBRARY_ERRORS, DeliveryChannelClosed)


@dataclass(frozen=True)
class QuarantinedMessage:
    """A browsed quarantined message: the raw delivery and what it says about itself."""

    delivery: Delivery
    item: q.QuarantinedJob

    def to_json(self) -> dict[str, Any]:
        """JSON form for ``show --json`` / ``export``: properties, all headers, payload and raw body.

        ``payload`` is the body as strict JSON (:func:`~amqpjobs.jobs.json_fast.strict_loads`),
        else None; a UTF-8 body that is not strict JSON (``NaN``, ``1e400``, not JSON at all)
        also gets ``payload_text``, its text. ``headers`` holds one value per name (the last
        entry's); when the header table holds a name more than once (another publisher's, or
        two names that are not UTF-8 and read alike), ``header_entries`` lists every entry,
        ``[name, value]`` in the received order. Write it with :func:`~amqpjobs.printable.json_text`.
        """
        d = self.delivery
        payload: Any = None
        text: str | None = None
        try:
            text = d.body.decode("utf-8-sig")
            payload = strict_loads(text)
            text = None
        except (UnicodeDecodeError, ValueError, RecursionError):
            pass
        doc: dict[str, Any] = {
            "queue": d.queue,
            "message_id": d.message_id,
            "type": d.type,
            "content_type": d.content_type,
            "content_encoding": d.content_encoding,
            "timestamp": d.timestamp,
            "priority": d.priority,
            "redelivered": d.redelivered,
            "reason": self.item.reason,
            "job": self.item.job,
            "error_type": self.item.error_type,
            "original_queue": self.item.original_queue,
            "headers": q.jsonable(d.headers),
            "payload": payload,
            "body_b64": base64.b64encode(d.body).decode("ascii"),
        }
        if text is not None:
            doc["payload_text"] = text
        entries = d.header_entries()
        if len(entries) > len({name for name, _ in entries}):
            doc["header_entries"] = [[name, q.jsonable(value)] for name, value in entries]
        return doc


async def resolve_quarantine_queue(connection: Connection, name: str) -> tuple[str, int]:
    """Find quarantine or parked queue ``name`` (``<name>.quarantine`` when ``name`` is a job queue) and its depth.

    Only quarantine and parked queues (``<job queue>.parked``) are accepted, so a typo can't
    purge or replay a work queue (hence the name: it resolves no other queue).

    Raises:
        ConfigurationError: it does not exist, or ``name`` is another queue of ours (a tier, the ledger marker).
        BrokerError: it is exclusive to another connection.
    """
    candidate = name if name.endswith((QUARANTINE_SUFFIX, PARKED_SUFFIX)) else name + QUARANTINE_SUFFIX
    try:
        return candidate, await probe_queue(connection, candidate)
    except NotFoundError:
        pass
    except ResourceLockedError as exc:
        raise BrokerError(
            f"queue {candidate!r} is exclusive to another connection (RESOURCE_LOCKED): only that "
            "connection can use it; close it and try again"
        ) from exc.__cause__
    if problem := other_queue_problem(name):
        raise ConfigurationError(problem)
    raise ConfigurationError(f"no quarantine queue {candidate!r} in this vhost")


async def queue_depth(settings: BrokerSettings, name: str) -> tuple[str, int]:
    """(queue, messages ready in it now) of quarantine or parked queue ``name``.

    ``name`` is resolved as :func:`resolve_quarantine_queue` resolves it.

    Raises:
        ConfigurationError: no such quarantine or parked queue.
        BrokerUnavailableError: the broker can't be reached.

    """
    async with session(settings) as connection:
        return await resolve_quarantine_queue(connection, name)


def quarantine_queues(settings: BrokerSettings) -> list[str]:
    """Every queue of the vhost whose name ends with ``.quarantine``, sorted."""
    with ManagementClient(settings) as mgmt:
        return sorted(x["name"] for x in mgmt.queues(settings.vhost) if x["name"].endswith(QUARANTINE_SUFFIX))


@asynccontextmanager
async def session(settings: BrokerSettings) -> AsyncIterator[Connection]:
    """A connection for one quarantine command, closed when the block ends.

    Raises:
        BrokerUnavailableError: the broker can't be reached.

    """
    connection = await connect(settings, name="amqpjobs-quarantine")
    try:
        yield connection
    finally:
        await connection.close()


#: Seconds a mover's copy waits for its confirm while a resource alarm blocks its connection (then it stops).
HELD_COPY_WAIT = 5.0


@asynccontextmanager
async def publishing_session(settings: BrokerSettings, action: str) -> AsyncIterator[Connection]:
    """The connection a mover (``action``: ``"replay"``, ``"park"``) publishes its copies on, apart from the session.

    A resource alarm blocks only a connection that publishes: the mover's gets, acks and lock stay on
    :func:`session`'s, which the broker goes on reading. Left blocked, this one is reset, not closed
    (:func:`~amqpjobs.wire.reset.reset`): the copies the broker holds unread are dropped, never stored,
    so their originals (not acked) are the jobs' only place, and the command ends at once.

    Raises:
        BrokerUnavailableError: the broker can't be reached.

    """
    connection = await connect(settings, name=f"amqpjobs-{action}-copies")
    try:
        yield connection
    finally:
        if blocked_by(connection) is not None:
            await reset(connection)
        else:
            await connection.close()


@asynccontextmanager
async def mover_lock(
    connection: Connection, settings: BrokerSettings, quarantine_queue: str, action: str
) -> AsyncIterator[HeldLock]:
    """Be the one mover of ``quarantine_queue`` for the ``async with`` block.

    Every operation that takes messages out of a quarantine queue holds this while it
    does. The lock is an exclusive queue on ``connection`` (:mod:`amqpjobs.wire.lock`),
    named by :func:`amqpjobs.jobs.quarantine.mover_lock_queue`: it goes with the
    connection, so a killed mover frees it at once. Call ``check()`` on the lock before
    each move: it raises once the connection dropped (a reconnect does not take it back).

    Args:
        connection: The mover's connection.
        settings: Broker settings (to name the holder when refused).
        quarantine_queue: Full name of the quarantine queue.
        action: What the mover does, shown to a refused one (``"replay"``, ``"purge"`` ...).

    Raises:
        BusyError: another process moves messages of this queue; names it (action, host,
            pid, since when, the program: :mod:`amqpjobs.runtime.mover_names`, its connection)
            when the management API can read that.
        BrokerError: the broker failed while taking the lock.

    """
    by = mover_program()  # the console, a CLI command, a script: a refused mover is told (runtime.mover_names)
    holder = LockHolder(action, socket.gethostname(), os.getpid(), datetime.now(UTC), (("by", by),) if by else ())
    name = q.mover_lock_queue(quarantine_queue)
    kind = "parked queue" if quarantine_queue.endswith(PARKED_SUFFIX) else "quarantine queue"
    async with exclusive_lock(connection, settings, name, holder, f"{kind} {quarantine_queue!r}") as lock:
        yield lock


async def browse(
    settings: BrokerSettings,
    name: str,
    limit: int | None = None,
    selection: q.Selection | None = None,
    census: Census | None = None,
    keep_bodies: int | None = None,
) -> tuple[str, list[QuarantinedMessage]]:
    """Read messages of quarantine queue ``name`` without removing any.

    Browsing does not wait for nor block a mover (:func:`mover_lock`): while one runs, the
    messages it holds are not seen, and one browsed at the moment a replay looks at it is
    left in quarantine by that replay.

    Args:
        settings: Broker settings.
        name: Quarantine queue, or the job queue whose quarantine it is.
        limit: At most this many matching messages (None: all).
        selection: Filters; non-matching messages are skipped (and stay).
        census: Filled with the queue's depth and what every looked-at message holds
            (to show what is there when the filters matched none).
        keep_bodies: Keep the body of the first this many matching messages only (None: of all);
            the others come with an empty body, what they say about themselves (their
            :attr:`~QuarantinedMessage.item`, their key included) read first. A reader that shows no
            payload (a listing, a count, a lookup) then holds no quarantine's worth of bodies in memory.

    Returns:
        (quarantine queue name, matching messages in queue order).

    Raises:
        ConfigurationError: no such quarantine queue.
        BrokerUnavailableError: the broker can't be reached.

    """
    census = census if census is not None else Census()
    out: list[QuarantinedMessage] = []
    async with aclosing(browsing(settings, name, limit, selection, census)) as messages:
        async for message in messages:
            if keep_bodies is not None and len(out) >= keep_bodies:
                message.delivery.body = b""
            out.append(message)
    return census.queue, out


async def browsing(
    settings: BrokerSettings,
    name: str,
    limit: int | None = None,
    selection: q.Selection | None = None,
    census: Census | None = None,
) -> AsyncGenerator[QuarantinedMessage, None]:
    """Each matching message of quarantine queue ``name`` as it is read, without removing any (:func:`browse`).

    A reader that lets go of each message (``quarantine show`` prints it, then drops its body)
    holds about one body at a time, not ``limit`` of them. Close it (``contextlib.aclosing``):
    its channel closes and every message returns to the queue. Arguments as :func:`browse`'s;
    ``census.queue`` names the quarantine queue once the first message (or the end) came.

    Raises:
        ConfigurationError: no such quarantine queue.
        BrokerUnavailableError: the broker can't be reached.
    """
    selection = selection or q.Selection()
    census = census if census is not None else Census()
    matched = 0
    async with aclosing(_browsed(settings, name, census)) as messages:
        async for message in messages:
            if census.matches(message.item, selection):
                yield message
                matched += 1
                if limit is not None and matched >= limit:
                    break


async def _browsed(settings: BrokerSettings, name: str, census: Census) -> AsyncGenerator[QuarantinedMessage, None]:
    """Each message of quarantine queue ``name`` as it is read (``basic.get``, unacked), in queue order.

    The one browse loop (:func:`browse`, :func:`export`): ``census.queue`` and ``census.depth`` are set
    before the first; closed (use ``contextlib.aclosing``), its channel closes and every message
    returns to the queue. A caller that lets go of a message's body holds no quarantine's worth of them.
    """
    async with session(settings) as connection:
        queue_name, depth = await resolve_quarantine_queue(connection, name)
    census.queue, census.depth = queue_name, depth
    browsed = PastUndeliverable(settings, queue_name, depth)  # one no 0-9-1 client can receive is mended
    try:
        async with aclosing(browsed.deliveries()) as deliveries:
            async for delivery in deliveries:
                item = q.describe(delivery.headers, delivery.message_id, delivery.type, delivery.body)
                yield QuarantinedMessage(delivery, item)
    finally:
        await browsed.close()  # every browsed message returns to the queue


async def purge(settings: BrokerSettings, name: str) -> tuple[str, int]:
    """Remove every message from quarantine queue ``name``. Returns (queue, messages removed).

    Raises:
        ConfigurationError: no such quarantine queue.
        BusyError: a mover (say, a replay) works on the queue; nothing was removed.

    """
    async with session(settings) as connection:
        queue_name, _ = await resolve_quarantine_queue(connection, name)
        async with mover_lock(connection, settings, queue_name, "purge"):
            return queue_name, await purge_queue(connection, queue_name)


class TextSink(Protocol):
    """Where an export writes: a text file, stdout, a FIFO's write end."""

    def write(self, text: str, /) -> int:
        """Write ``text``."""

    def close(self) -> None:
        """Done writing."""


async def export(settings: BrokerSettings, name: str, path: Path, opener: Callable[[], TextSink] | None = None) -> int:
    """Write every message of quarantine queue ``name`` to ``path`` as JSON lines; leave them queued.

    ``opener``: opens where to write (stdout, a FIFO's end already open), instead of ``path``
    (then only its name, in errors).

    Each message is written as it is read and its body let go (:func:`_browsed`): an export holds
    about one body at a time, not the quarantine's worth (20 bodies of 1 MB: 27 MB at the peak before).
    The file is opened once the queue is found: no such queue writes nothing.

    Returns:
        The number of messages written.

    Raises:
        ConfigurationError: no such quarantine queue.
        BrokerUnavailableError: the broker can't be reached.
        OSError: the file can't be opened, written or closed (a full disk): its ``filename`` is
            ``str(path)`` (a write's own error names no file). The messages stay queued.

    """
    count = 0
    async with aclosing(_browsed(settings, name, Census())) as messages:
        fh: TextSink | None = None
        opened = opener or (lambda: path.open("w", encoding="utf-8"))
        try:
            async for message in messages:
                if fh is None:
                    fh = _named(path, opened)
                _named(path, fh.write, json_text(message.to_json()) + "\n")
                message.delivery.body = b""  # written: not held until the browser closes
                count += 1
            if fh is None:  # an empty queue: an empty file, as before
                fh = _named(path, opened)
        finally:
            if fh is not None:
                _named(path, fh.close)
    return count


def _named(path: Path, call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``call(*args, **kwargs)``, a file operation on ``path``: an OSError naming no file is given ``path``'s name."""
    try:
        return call(*args, **kwargs)
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
