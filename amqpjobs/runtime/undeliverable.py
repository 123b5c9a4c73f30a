"""Move a message no AMQP 0-9-1 client can receive from the head of a work queue into its quarantine.

Such a message (a property or header name over 255 bytes, taken in by the management API's
HTTP publish: :mod:`amqpjobs.jobs.undeliverable`) closes every connection it is delivered on
(541 INTERNAL_ERROR) and stays at the head of its queue, so no job behind it runs. Under a
lock per queue (one rescuer at a time: an exclusive queue, freed when its process dies) the
rescue goes, in this order:

1. ``peeked``: read the head through the management API and put it back (requeued);
   nothing more when it is not such a message;
2. ``copied``: publish the copy a 0-9-1 client can read (long values moved into headers,
   evidence of reason ``undeliverable``) to the quarantine exchange, and wait for the confirm;
3. ``removed``: take the head through the management API and check by its fingerprint
   that it is the message copied. Another message (someone removed ours meanwhile, by hand)
   is published back to its queue at once, as it was (:mod:`amqpjobs.wire.as_was`), with a confirm,
   and said loudly.

A process that dies before 2 leaves the message where it was; between 2 and 3 it is in
both places (the next rescue makes a second copy: twice at worst, never zero).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any, Final

from amqpjobs._version import __version__
from amqpjobs.errors import AmqpJobsError, BrokerUnavailableError, BusyError
from amqpjobs.jobs.envelope import ENQUEUED_AT
from amqpjobs.jobs.evidence import REASON, Failure, evidence_headers
from amqpjobs.jobs.timestamps import iso_utc, parse_time
from amqpjobs.jobs.undeliverable import SHORTSTR_MAX, Sanitized, fingerprint, overflows, sanitize
from amqpjobs.message import OutgoingMessage
from amqpjobs.printable import printable
from amqpjobs.runtime.logs import field_value
from amqpjobs.runtime.sources import Source
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.as_was import as_it_was
from amqpjobs.wire.cluster import on_internal_error
from amqpjobs.wire.errors import met_internal_error
from amqpjobs.wire.head_reads import HeadMessage, peek_head, take_head
from amqpjobs.wire.lock import LockHolder, exclusive_lock
from amqpjobs.wire.publish import ConfirmedPublisher
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.worker")

#: The steps of a rescue, in order (``on_step`` hears each as it is done).
STEPS: Final = ("locked", "peeked", "copied", "removed")
#: Seconds a start waits for the connection to come back after a 541 and a rescue.
RECONNECT_WAIT: Final = 30.0
#: ``rescue_heads`` bound to its settings, connection and app version: work queue -> quarantine exchange in.
Rescue = Callable[[Mapping[str, str]], Awaitable[int]]


def lock_name(queue: str) -> str:
    """The lock queue of the rescue of ``queue`` (a hash: any queue name of 255 bytes fits)."""
    return "amqpjobs.undeliverable-lock." + hashlib.sha256(queue.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _seconds(stamp: Any) -> float | None:
    """The management API's raw ``timestamp`` (the number the publisher sent: s, ms, µs or ns) as seconds.

    Read once, by the one rule (:func:`~amqpjobs.jobs.timestamps.parse_time`); before, a ``Date.now()``
    value was taken for seconds (a year past 9999): the copy could not be encoded. None: no time.
    """
    when = parse_time(stamp) if isinstance(stamp, int | float) and not isinstance(stamp, bool) else None
    return None if when is None else when.timestamp()


def _first_time(headers: dict[str, Any], seconds: float | None) -> tuple[dict[str, Any], float | None]:
    """``headers`` with ``amqpjobs-enqueued-at`` written from ``seconds`` when missing, as every copy's; the timestamp.

    The ``timestamp`` property is kept only when it reads back as the same second by the one rule: seconds past
    ``2**32 - 1`` (after 2106: a ``time.time_ns()`` of 2262) are read as milliseconds (1970), so such a copy
    carries its time in the header alone (README "Wire format").
    """
    if seconds is None:
        return headers, None
    if parse_time(headers.get(ENQUEUED_AT)) is None:
        headers = {**headers, ENQUEUED_AT: iso_utc(seconds)}
    again = parse_time(int(seconds))
    return headers, seconds if again is not None and int(again.timestamp()) == int(seconds) else None


def _as_message(copy: Sanitized, head: HeadMessage, queue: str, app_version: str) -> OutgoingMessage:
    """The copy to publish; one quarantined already (our evidence, in a quarantine or parked queue) keeps its own."""
    now = iso_utc()
    failure = Failure(
        reason="undeliverable", error_type="UndeliverableMessage",
        error_message=(f"RabbitMQ could not deliver this message over AMQP 0-9-1 ({'; '.join(copy.problems)}: over "
                       f"{SHORTSTR_MAX} bytes, the most a short string holds): every delivery closed the connection "
                       "(541 INTERNAL_ERROR). This copy carries each long value in an amqpjobs-undeliverable-* "
                       "header; publish it again with every property and header name within 255 bytes"),
        traceback="", attempts=0, first_failure_at=now, last_failure_at=now, host=socket.gethostname(),
        pid=os.getpid(), version=__version__, app_version=app_version, exchange=head.exchange, queue=queue,
        routing_key=head.routing_key, job=copy.job, job_id=copy.job_id, tenant="",
    )  # fmt: skip
    props = copy.properties
    stamp = props.get("timestamp")

    def text(name: str) -> str | None:
        value = props.get(name)
        return value if isinstance(value, str) else None

    priority = props.get("priority")
    headers = copy.headers if REASON in copy.headers else {**copy.headers, **evidence_headers(failure)}
    headers, timestamp = _first_time(headers, _seconds(stamp))
    return OutgoingMessage(
        body=head.body, headers=headers,
        content_type=text("content_type"), content_encoding=text("content_encoding"), message_id=copy.job_id,
        type=text("type"), timestamp=timestamp,
        priority=priority if isinstance(priority, int) and 0 <= priority <= 255 else None,
        correlation_id=text("correlation_id"), reply_to=text("reply_to"), app_id=text("app_id"),
    )  # fmt: skip


async def rescue_heads(
    settings: BrokerSettings,
    connection: Connection,
    quarantines: Mapping[str, str],
    *,
    app_version: str = "",
    on_step: Callable[[str], None] | None = None,
    serial: asyncio.Lock | None = None,
    read: HeadMessage | None = None,
) -> int:
    """Move an undeliverable message at the head of each queue into its quarantine (module docstring).

    Args:
        settings: Broker settings (the management API reads and removes the message).
        connection: A robust connection of this process (the lock, the confirmed publish of the copy).
        quarantines: Work queue name -> its quarantine exchange ("": the copy goes to the queue's own tail).
        app_version: The app's version, for the evidence.
        on_step: Called with each step's name (:data:`STEPS`) once it is done (tests kill the process there).
        serial: Held for the whole call: the calls of one process sharing it run one at a time.
        read: The message, read already (then it is not read again: on a quorum queue each requeued read
            sends it to the back of the returned messages); the one queue of ``quarantines`` is then its queue.

    Returns:
        How many messages were moved. Never raises for a broker or management API failure:
        it logs a warning and leaves the message where it was (the next 541 tries again).

    """
    async with serial or contextlib.nullcontext():
        return await _rescue_each(settings, connection, quarantines, app_version, on_step or (lambda _: None), read)


async def _rescue_each(settings: BrokerSettings, connection: Connection, quarantines: Mapping[str, str],
                       app_version: str, on_step: Callable[[str], None], read: HeadMessage | None) -> int:  # fmt: skip
    moved = 0
    for queue, exchange in quarantines.items():
        try:
            head = read or await peek_head(settings, queue)
            if head is None or not overflows(head.properties):
                continue
            moved += await _rescue(settings, connection, queue, exchange, app_version, on_step, read)
        except BusyError:
            log.info("another process moves the undeliverable message at the head of %s", printable(queue))
        except AmqpJobsError as exc:
            log.warning("the message at the head of %s can't be delivered and was not moved to quarantine (%s); "
                        "it stays where it was", printable(queue), exc)  # fmt: skip
    return moved


async def _rescue(settings: BrokerSettings, connection: Connection, queue: str, exchange: str, app_version: str,
                  step: Callable[[str], None], read: HeadMessage | None) -> int:  # fmt: skip
    holder = LockHolder("undeliverable-rescue", socket.gethostname(), os.getpid(), datetime.now(UTC))
    async with exclusive_lock(connection, settings, lock_name(queue), holder, f"work queue {queue!r}", False):
        step("locked")
        head = read or await peek_head(settings, queue)  # again, under the lock: another rescuer may have moved it
        if head is None or not (problems := overflows(head.properties)):
            return 0
        step("peeked")
        copy = sanitize(head.properties, head.body)
        expected = fingerprint(head.properties, head.body)
        publisher = ConfirmedPublisher(connection, owner="the rescue of an undeliverable message")
        try:
            await publisher.publish(exchange, "" if exchange else queue, _as_message(copy, head, queue, app_version))
            step("copied")
            taken = await take_head(settings, queue)
            step("removed")
            if taken is not None and fingerprint(taken.properties, taken.body) != expected:
                # not ours: someone removed ours meanwhile; this one goes back at once
                back, left = as_it_was(taken.properties, taken.body, settings.username)
                await publisher.publish("", queue, back)
                log.error("while moving an undeliverable message from %s to quarantine another message was taken "
                          "from its head (id %s); it was published back to %s (at its tail), as it was%s",
                          printable(queue), field_value(str(taken.properties.get("message_id"))), printable(queue),
                          f" but for {printable('; '.join(left))}" if left else "")  # fmt: skip
        finally:
            await publisher.close()
    log.warning("moved a message no AMQP 0-9-1 client can receive from the head of %s to %s (%s; id %s): "
                "every delivery of it closed the connection (541 INTERNAL_ERROR)", printable(queue),
                printable(exchange or f"the tail of {queue} as a readable copy"), "; ".join(problems),
                field_value(copy.job_id))  # fmt: skip
    return 1


def quarantines_of(layouts: Iterable[JobQueueLayout]) -> dict[str, str]:
    """Each work queue (every shard) of the classic job queues of ``layouts`` -> its quarantine exchange.

    Not a quorum job queue's: RabbitMQ 3.10.8 puts a quorum queue's returned messages at its back
    (measured: after a 541 with prefetch 2, [bad, g0, g1, g2] read g1, g2, bad, g0), so the message is
    at the head only before its first delivery, and each requeued read there charges the job at the
    head a delivery (``x-delivery-count``) and sends it to the back. The broker dead-letters the
    message into quarantine as it is once its deliveries pass the delivery limit (README "Wire format").
    """
    return {queue: layout.quarantine_exchange for layout in layouts if layout.queue_type == "classic"
            for queue in layout.work_queues}  # fmt: skip


async def keep_rescuing(
    rescue: Rescue, quarantines: Mapping[str, str], wanted: asyncio.Event, widen: Callable[[], Awaitable[None]]
) -> None:
    """Each time ``wanted`` is set (a connection closed with 541), ``rescue(quarantines)`` once; runs until cancelled.

    A 541 may come while jobs fetched before the message still ran: they go back ahead of it,
    and the worker takes one delivery at a time until one moved it (then ``widen()``), so it is
    at the head when it is sent again (:mod:`amqpjobs.wire.single_file`); each 541 looks again.
    Only a 541 makes it look: a read through the management API marks a good job at the head
    redelivered (the worker would count a start of it).
    """
    while True:
        await wanted.wait()
        wanted.clear()
        await asyncio.sleep(0.2)  # the close's requeues settle first
        if await rescue(quarantines):
            await widen()


async def start_past_undeliverable(
    first: Callable[[], Awaitable[None]],
    again: Callable[[], Awaitable[None]],
    rescue: Callable[[], Awaitable[int]],
    connection: Connection,
    tries: int = 3,
) -> None:
    """``first()``; when a 541 cut it off, ``rescue()`` then ``again()`` once reconnected, ``tries`` in all.

    Raises:
        What the last try raised, or what any try raised that was not a 541 (unchanged).
        BrokerUnavailableError: not reconnected within :data:`RECONNECT_WAIT` seconds after a rescue.

    """
    start = first
    for attempt in range(tries):
        try:
            await start()
            return
        except Exception as exc:
            if attempt == tries - 1 or not met_internal_error(exc):
                raise
            log.info("starting to consume met a connection closed with 541 INTERNAL_ERROR: looking at the head")
        await rescue()
        try:
            await asyncio.wait_for(connection.connected.wait(), RECONNECT_WAIT)
        except TimeoutError:
            raise BrokerUnavailableError(f"not connected again within {RECONNECT_WAIT:.0f}s after a 541") from None
        start = again


def watch_undeliverable(
    settings: BrokerSettings, consuming: Connection, publishing: Connection, layouts: Iterable[JobQueueLayout],
    app_version: str, sources: Callable[[], Iterable[Source]],
) -> tuple[Rescue, asyncio.Task[None]]:  # fmt: skip
    """A worker's rescue (:func:`rescue_heads` over ``publishing``) and its task, run at each 541 of ``consuming``.

    At each 541 the ``sources()`` of classic job queues take one delivery at a time, until a rescue
    moved a message or their slots' worth came (:mod:`amqpjobs.wire.single_file`). Cancel the task
    to stop it (the worker's stop does, with its other background tasks).
    """
    # one at a time in this process too: the lock queue is this connection's, which may declare it twice
    rescue: Rescue = partial(rescue_heads, settings, publishing, app_version=app_version, serial=asyncio.Lock())
    layouts = list(layouts)
    quarantines = quarantines_of(layouts)
    classic = {*quarantines, *(layout.name for layout in layouts if layout.queue_type == "classic")}

    def one_at_a_time() -> None:
        if began := [source.queue for source in sources() if source.queue in classic and source.one_at_a_time()]:
            log.info("a 541 closed the connection: one delivery at a time from %s, so that the message no client "
                     "can receive is at the head when it is sent (every slot again once it is moved)",
                     ", ".join(map(printable, began)))  # fmt: skip

    async def widen() -> None:
        await asyncio.gather(*(source.widen() for source in sources() if source.queue in classic))

    wanted = asyncio.Event()
    on_internal_error(consuming, one_at_a_time)
    on_internal_error(consuming, wanted.set)
    return rescue, asyncio.create_task(keep_rescuing(rescue, quarantines, wanted, widen))
