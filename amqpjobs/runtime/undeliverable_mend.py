"""A quarantine or parked queue holding a message no AMQP 0-9-1 client can receive: mend it, then go on.

Such a message (:mod:`amqpjobs.jobs.undeliverable`) closes with 541 the connection of every
``basic.get`` that reaches it, so a quarantine tool (``show``, ``replay``, ``park`` ...) reading
the queue stops there, and every message behind it is out of reach. :func:`mend_queue` replaces
it, in its own queue, by the copy a 0-9-1 client can read (each long value in an
``amqpjobs-undeliverable-*`` header, evidence of reason ``undeliverable``), with the worker's
rescue (:func:`~amqpjobs.runtime.undeliverable.rescue_heads`, its one rule and order):

1. find it: the management API reads the properties of every message in place
   (``reject_requeue_true``; each counts as redelivered after, as any browse), then it alone with
   its body, then finds it again (a quorum queue puts what a requeued read took behind the rest;
   a read of all keeps the order);
2. hold the ``i`` messages ahead of it, unacked, on a channel of our own (they are deliverable), so
   that it is the first ready message;
3. the rescue, with the message as read in 1 (never read again): the copy is published to the queue's
   tail with a confirm, and only then the original is taken (the management API, ``ack_requeue_false``)
   and checked by its fingerprint (another one taken is published back at once, logged as an ERROR);
4. the channel closes: the ``i`` held messages are ready again, in their place (classic queues; at the
   back of a quorum queue).

Killed at any step, the message is in the queue as it was, as the copy, or both (step 3's order);
the held messages are never acked. :class:`PastUndeliverable` is the tools' browse that mends and goes on.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter
from collections.abc import AsyncGenerator, Callable
from typing import Final

from amqpjobs.errors import AmqpJobsError
from amqpjobs.jobs.undeliverable import overflows
from amqpjobs.printable import printable
from amqpjobs.runtime.undeliverable import rescue_heads
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.browse import QueueBrowser
from amqpjobs.wire.cluster import mends_undeliverable
from amqpjobs.wire.connection import connect
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.errors import met_internal_error
from amqpjobs.wire.head_reads import peek_at, peek_properties
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.quarantine")

#: Looks for the message, :data:`SETTLE_PAUSE` seconds apart, before a mend finds none (returns settle first).
SETTLE_LOOKS: Final = 10
SETTLE_PAUSE: Final = 0.2
#: How many times a tool mends its queue and runs again before the 541 is its answer (one mend per message).
MEND_ROUNDS: Final = 20


async def first_undeliverable(settings: BrokerSettings, queue: str, near: int | None = None) -> int | None:
    """The position (0: the head) of the first message of ``queue`` a 0-9-1 client can't receive, None: none.

    ``near``: where it likely is (a browse's count when the 541 came): the first ``near + 1`` messages
    are read first, and the whole queue only when none of them is such a message. The answer is the
    same either way (the first one found among the first ``k`` is the first of all); only the cost is
    not: every message read travels with its headers (5,000 with a 10 KiB header: 51 MB, 4.3 s).

    Raises:
        ManagementApiError, BrokerUnavailableError: the management API refused or can't be reached.

    """
    counts = ([near + 1] if near is not None and near >= 0 else []) + [2**31 - 1]
    for count in counts:
        found = await peek_properties(settings, queue, count)
        for position, properties in enumerate(found):
            if overflows(properties):
                return position
        if len(found) < count:  # that was the whole queue
            return None
    return None


async def mend_queue(
    settings: BrokerSettings, queue: str, on_step: Callable[[str], None] | None = None, near: int | None = None
) -> int:
    """Replace the first message of ``queue`` no 0-9-1 client can receive by a copy one can (module docstring).

    Args:
        settings: Broker settings (the management API finds, reads and takes the message).
        queue: A quarantine or parked queue (nothing consumes it).
        on_step: Called with each step done: ``held``, then the rescue's (``locked``, ``peeked``,
            ``copied``, ``removed``): tests kill the process there.
        near: Where the message likely is (:func:`first_undeliverable`): the reads stop there when it is.

    Returns:
        1 when a message was replaced, 0 when none was found (or another process mends it now).
        Never raises for the rescue's broker failures (it logs them; the message stays).

    Raises:
        ManagementApiError, BrokerUnavailableError: the management API or the broker can't be used.

    """
    for _ in range(SETTLE_LOOKS):  # a quorum queue takes back what a closed connection held a little later
        if (position := await first_undeliverable(settings, queue, near)) is not None:
            break
        await asyncio.sleep(SETTLE_PAUSE)
    else:
        return 0
    if (read := await peek_at(settings, queue, position)) is None or not overflows(read.properties):
        return 0  # someone took some meanwhile: the next 541 looks again
    # where it is now: a quorum queue puts what a read requeued behind the rest (a read of all keeps the order)
    if (position := await first_undeliverable(settings, queue, position)) is None:
        return 0
    connection = await connect(settings, name="amqpjobs-mend")
    try:
        browser = await QueueBrowser.open(connection)
        try:
            held = 0
            async for _ in browser.deliveries(queue, position):
                held += 1
            if held != position:  # someone took or added some meanwhile: the next 541 looks again
                return 0
            if on_step is not None:
                on_step("held")
            # read once: another requeued read would send it behind the others on a quorum queue
            return await rescue_heads(settings, connection, {queue: ""}, on_step=on_step, read=read)
        finally:
            try:  # the held messages are ready again, in their place, before the browse goes on
                await browser.close()
            except Exception:  # its channel or connection closed already: nothing is held
                await browser.close_quietly()
    finally:
        await connection.close()


async def _mended(settings: BrokerSettings, queue: str, near: int) -> bool:
    try:
        return await mend_queue(settings, queue, near=near) > 0
    except AmqpJobsError as exc:
        log.warning("could not replace the message of %s no AMQP 0-9-1 client can receive: %s", printable(queue), exc)
        return False


def _key(delivery: Delivery) -> tuple[str, str]:
    return delivery.message_id or "", hashlib.sha256(delivery.body).hexdigest()


class PastUndeliverable:
    """A browse of ``queue`` on a connection of its own that goes past a message no 0-9-1 client can receive.

    :meth:`deliveries` yields up to ``depth`` deliveries, unacked, each once: when a 541 closes the
    connection, :func:`mend_queue` replaces that message by its readable copy (at the tail), and a new
    browse goes on, leaving out the messages yielded before (by job id and body: the held ones came
    back, in their place on a classic queue, at the back of a quorum one). The channel stays open
    (acks go on) until :meth:`close`, which returns every message still held.
    """

    def __init__(self, settings: BrokerSettings, queue: str, depth: int) -> None:
        self._settings, self._queue, self._depth = settings, queue, depth
        self._connection: Connection | None = None
        self._browser: QueueBrowser | None = None
        self._owed: Counter[tuple[str, str]] = Counter()
        self._skipped: dict[tuple[str, str], list[Delivery]] = {}

    async def deliveries(self) -> AsyncGenerator[Delivery, None]:
        """The deliveries (class docstring).

        Raises:
            BrokerError: the broker failed (a 541 with nothing found to mend too: its hint says what to do by hand).

        """
        seen: Counter[tuple[str, str]] = Counter()
        for _ in range(MEND_ROUNDS + 1):
            again: Counter[tuple[str, str]] = Counter()
            self._skipped = {}
            await self._close(quietly=True)
            self._connection = await connect(self._settings, name="amqpjobs-quarantine")
            mends_undeliverable(self._connection, self._queue)  # its 541 line says what happens now
            self._browser = await QueueBrowser.open(self._connection)
            got = 0  # this round's deliveries: where a 541 came, near enough to start looking there
            try:
                async for delivery in self._browser.deliveries(self._queue, self._depth):
                    got += 1
                    key = _key(delivery)
                    again[key] += 1
                    if again[key] <= seen[key]:
                        if self._owed[key] > 0:  # moved (its copy confirmed) but its ack was cut: taken now
                            self._owed[key] -= 1
                            await delivery.ack()
                        else:  # held again; its ack may be cut yet (a copy still awaiting its confirm)
                            self._skipped.setdefault(key, []).append(delivery)
                        continue
                    seen[key] += 1
                    yield delivery
                return
            except Exception as exc:
                if not met_internal_error(exc) or not await _mended(self._settings, self._queue, got):
                    raise

    async def ack(self, delivery: Delivery) -> None:
        """Ack ``delivery`` (its copy is confirmed elsewhere); an ack cut (its channel closed) is owed, not raised.

        The original then stays where it was, unacked, so it is back in the queue (a duplicate, never a loss);
        a browse that goes on past a 541 acks it when it meets it again. A cut that ends the browse is said by it.
        """
        try:
            await delivery.ack()
        except Exception as exc:  # whatever cut it, the original was not removed
            key = _key(delivery)
            if self._skipped.get(key):  # the browse after the 541 holds it again: taken from there
                await self._skipped[key].pop().ack()
                return
            self._owed[key] += 1
            log.info("the ack of %s was cut (%s): taken when browsed again, else left in %s too",
                     printable(repr(delivery.message_id)), type(exc).__name__, printable(self._queue))  # fmt: skip

    async def close(self) -> None:
        """Close the channel and connection once every message still held is back (:meth:`QueueBrowser.close`).

        So the count or browse that follows (a replay's, a park's "left N") sees each of them.
        """
        await self._close(quietly=False)

    async def _close(self, quietly: bool) -> None:
        browser, connection, self._browser, self._connection = self._browser, self._connection, None, None
        try:
            if browser is not None and not quietly:
                try:
                    await browser.close()
                except Exception:  # its channel or connection closed already: nothing is held
                    await browser.close_quietly()
            elif browser is not None:
                await browser.close_quietly()
        finally:
            if connection is not None:
                await connection.close()
