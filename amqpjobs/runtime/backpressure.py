"""What ``enqueue`` checks before it writes: broker resource alarms and the job queue's bounds (issue 25).

Alarms: RabbitMQ tells a connection it is blocked (``connection.blocked``) only once it
published during the alarm, and holds that first publish unread until the alarm clears
(RabbitMQ "Blocked Connection Notifications": sent "to publishing connections"). So the
gate also asks the management API for the cluster's alarms (a figure is used for at most
:data:`REFRESH`, and read again in the background after :data:`EARLY_REFRESH`, once the
enqueue that found it that old is answered) and refuses before the first publish; without
the management API it only knows what ``connection.blocked`` told it.

Bounds: the work queue's ready messages (a passive declare: exact when read) and, for
``max_age``, its oldest message's timestamp (management API; seconds, or milliseconds by
:mod:`amqpjobs.jobs.timestamps`' one rule; not asked when the exact depth is 0: a stale
head timestamp outlives the last message), each read at most once a second per work queue.
Between two reads the gate counts what it let through: its depth estimate is the depth read
plus every publish it let through that may be missing from that figure (those unsettled when
the read began, and all let through since). It lets a publish through only while that
estimate is under ``max_depth``, so one gate never takes a queue over ``max_depth``, however
many enqueues run at once; when the estimate (not the figure read) reaches the bound, it reads
again at once before refusing, so publishes consumed meanwhile don't cause refusals. Each
work queue has its own lock for its reads, and the alarm read another: a full queue never
holds enqueues to other queues. Several gates (processes, apps, sync publishers) each count
only their own publishes: each may take the queue up to the bound (README "Backpressure").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from amqpjobs.errors import AmqpJobsError, BrokerBlockedError, QueueFullError
from amqpjobs.jobs.timestamps import head_age
from amqpjobs.runtime.shared_clients import SharedManagementClients
from amqpjobs.topology.bounds import QueueBounds
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.alarms import blocked_by
from amqpjobs.wire.browse import queue_state
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.publisher")
T = TypeVar("T")

#: Queue figures and the cluster's alarms are read at most this often (seconds); an enqueue never
#: uses figures older than this: it waits for a read.
REFRESH = 1.0
#: The alarms are read again in the background by an enqueue that finds them this old (seconds), so
#: that while enqueues keep coming none waits for the management API (it answers in ms to tens of ms:
#: the worst enqueue latencies of a steady stream, bench/ section 5). The read begins once that
#: enqueue's publish is answered (:meth:`EnqueueGate.read_ahead_if_due`): its thread holds the GIL
#: for about 0.7 ms of client CPU, which made that publish late (bench/RESULTS.md, section 5's notes).
EARLY_REFRESH = REFRESH / 2
#: While waiting, the gate looks again this often (seconds).
_POLL = 0.1
#: After the management API failed, alarms are read from it again only after this long (seconds).
_MANAGEMENT_BACKOFF = 60.0


def full_at_max_length(layout: JobQueueLayout, routing_key: str, job_id: str) -> QueueFullError | None:
    """What a broker's nack of job ``job_id`` means when its work queue has ``max_length`` with ``reject-publish``.

    The broker nacks a publish to a queue at its ``x-max-length`` with ``x-overflow:
    reject-publish`` and does not store it (RabbitMQ "Queue Length Limit" -> "Overflow
    Behaviour"): that nack is a :class:`QueueFullError`. None: the queue has no such limit
    (the nack stays a ``PublishNackedError``).
    """
    limit = layout.bounds.max_length
    if limit is None:
        return None
    work_queue = layout.work_queue_for(routing_key)
    return QueueFullError(
        f"work queue {work_queue!r} is full: the broker nacked job {job_id!r} at the queue's max_length {limit} "
        "(overflow reject-publish); it was NOT stored, enqueue it again later",
        queue=work_queue,
        limit=f"max_length {limit}",
    )


@dataclass(frozen=True)
class QueueFigures:
    """A work queue's figures: ready messages, the oldest one's age (s) or None; ``at``: read began (monotonic s)."""

    ready: int
    oldest_age: float | None
    at: float


@dataclass
class _Queue:
    """One work queue as a gate sees it: its figures and the publishes it let through."""

    figures: QueueFigures | None = None
    let_through: int = 0  # publishes let through, ever
    settled: int = 0  # of those, published (or failed): no longer in flight
    unread: int = 0  # let through and maybe missing from figures.ready (in flight when read, or since)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one read of this queue at a time

    def over(self, bounds: QueueBounds) -> str | None:
        """Which bound the estimate is over (in words), or None."""
        assert self.figures is not None
        ready, age = self.figures.ready, self.figures.oldest_age
        if bounds.max_depth is not None and ready + self.unread >= bounds.max_depth:
            since = f" when read + {self.unread} let through by this publisher since" if self.unread else ""
            return f"max_depth {bounds.max_depth} ({ready} ready{since})"
        if bounds.max_age is not None and age is not None and age >= bounds.max_age:
            return f"max_age {bounds.max_age:g}s (oldest ready message {age:.1f}s old)"
        return None

    def over_by_count(self, bounds: QueueBounds) -> bool:
        """At ``max_depth`` by the publishes counted since the read, not by the figure read."""
        if self.figures is None or bounds.max_depth is None:
            return False
        return self.figures.ready < bounds.max_depth <= self.figures.ready + self.unread


def blocked_error(alarm: str, waited: float, timeout: float) -> BrokerBlockedError:
    """The refusal of an enqueue a resource ``alarm`` blocked for ``waited`` s (``blocked_timeout`` ``timeout`` s)."""
    return BrokerBlockedError(
        f"the broker is blocking publishers: resource alarm ({alarm}); not cleared after {waited:.1f}s "
        f"(blocked_timeout {timeout:g}s); the job was NOT sent, enqueue it again later "
        '(RabbitMQ "Memory and Disk Alarms": free memory or disk on the node)',
        alarm=alarm,
        waited=waited,
    )


class EnqueueGate:
    """Refuses or holds an enqueue while the broker is blocked or the work queue is over its bounds.

    Args:
        settings: The broker (its management API answers the alarm and age questions).
        blocked_timeout: Seconds to wait for a resource alarm to clear before
            ``BrokerBlockedError`` (0: refuse at once).
        full_wait: Seconds to wait for a work queue to come under its bounds before
            ``QueueFullError`` (0: refuse at once).

    """

    def __init__(self, settings: BrokerSettings, blocked_timeout: float, full_wait: float) -> None:
        self.settings = settings
        self.blocked_timeout = blocked_timeout
        self.full_wait = full_wait
        self._management = SharedManagementClients(settings, timeout=2.0)  # one client per lock: alarms, ages
        self._alarm_lock = asyncio.Lock()  # one read of the alarms at a time; the others use it
        self._ages_lock = asyncio.Lock()  # one age question to the management API at a time
        self._alarms: tuple[list[str], float] = ([], float("-inf"))  # (alarms, monotonic time read)
        self._early_read: asyncio.Future[None] | None = None  # a read ahead of need (EARLY_REFRESH)
        self._read_due = False  # an enqueue found the alarms EARLY_REFRESH old: read once its publish ends
        self._management_down_until = float("-inf")
        self._queues: dict[str, _Queue] = {}

    @asynccontextmanager
    async def admitted(self, connection: Connection, work_queue: str, bounds: QueueBounds) -> AsyncIterator[None]:
        """Enter once a publish to ``work_queue`` may be written (publish inside the block); else raise.

        The publish is counted against ``max_depth`` from entry, and as in flight until the
        block ends (published, refused or failed).

        Raises:
            BrokerBlockedError: a resource alarm did not clear within ``blocked_timeout``.
            QueueFullError: ``work_queue`` stayed over ``max_depth`` / ``max_age`` for ``full_wait``.

        """
        await self.unblocked(connection)
        if not bounds.checked:
            yield
            return
        queue = self._queues.setdefault(work_queue, _Queue())
        await self._under_bounds(connection, work_queue, queue, bounds)
        try:
            yield
        finally:
            queue.settled += 1

    def clear(self, connection: Connection) -> bool:
        """Whether :meth:`unblocked` would return at once and start no read: a publish need not await it.

        True while ``connection`` is not blocked and the alarms read less than
        :data:`EARLY_REFRESH` ago were none (the common case: an enqueue skips two coroutines).
        """
        alarms, read_at = self._alarms
        return not alarms and time.monotonic() - read_at < EARLY_REFRESH and blocked_by(connection) is None

    async def unblocked(self, connection: Connection) -> None:
        """Return once no resource alarm blocks publishing (all :meth:`admitted` asks of a queue without bounds).

        Raises:
            BrokerBlockedError: a resource alarm did not clear within ``blocked_timeout``.

        """
        started = time.monotonic()
        while (alarm := await self._alarm(connection)) is not None:
            waited = time.monotonic() - started
            if waited >= self.blocked_timeout:
                raise blocked_error(alarm, waited, self.blocked_timeout)
            await asyncio.sleep(min(_POLL, self.blocked_timeout - waited))

    async def _alarm(self, connection: Connection) -> str | None:
        """The alarm blocking publishers now (the connection's notification, else the management API), or None."""
        notified = blocked_by(connection)
        if notified is not None:
            return notified
        age = time.monotonic() - self._alarms[1]
        if age >= REFRESH:  # too old to use (or never read): wait for a read
            await self._read_alarms()
        elif age >= EARLY_REFRESH and self._early_read is None:  # read ahead once this enqueue's publish ends
            self._read_due = True
        return " & ".join(self._alarms[0]) or None

    def read_ahead_if_due(self) -> None:
        """Begin the read ahead an enqueue found due (:data:`EARLY_REFRESH`); call once its publish is answered.

        The read runs in a thread (a management API request), which would otherwise compete
        for the GIL with the publish that found it due. No read is begun when none is due.
        """
        if self._read_due and self._early_read is None:
            self._early_read = asyncio.ensure_future(self._read_alarms())
            self._early_read.add_done_callback(self._early_read_done)
        self._read_due = False

    def known_alarms(self) -> tuple[list[str], float]:
        """The alarms last read from the management API and their age in seconds (inf: never read).

        One read of one attribute, so another thread may call it (the sync publisher's fast path).
        """
        alarms, read_at = self._alarms
        return alarms, time.monotonic() - read_at

    async def read_ahead(self, connection: Connection) -> None:
        """Read the broker's alarms now unless read within :data:`EARLY_REFRESH` (so a first enqueue won't wait).

        Waits for the read only when the alarms are :data:`REFRESH` old or were never read.
        """
        await self._alarm(connection)
        self.read_ahead_if_due()

    async def _read_alarms(self) -> None:
        async with self._alarm_lock:
            if time.monotonic() - self._alarms[1] >= EARLY_REFRESH:  # not read meanwhile by another enqueue
                self._alarms = (await self._read(self._management_alarms, []), time.monotonic())

    def _early_read_done(self, read: asyncio.Future[None]) -> None:
        self._early_read = None
        if not read.cancelled() and (exc := read.exception()) is not None:  # _read logs what it expects
            log.warning("reading the broker's alarms failed: %s", exc)

    async def _under_bounds(self, connection: Connection, work_queue: str, queue: _Queue, bounds: QueueBounds) -> None:
        """Return once ``queue`` is under its bounds, counting the publish let through; else raise."""
        started = time.monotonic()
        while (over := await self._over(connection, work_queue, queue, bounds)) is not None:
            waited = time.monotonic() - started
            if waited >= self.full_wait:
                how_long = (
                    f"still full after waiting {waited:.1f}s (queue_full_wait {self.full_wait:g}s)"
                    if self.full_wait > 0
                    else "not waited: App(queue_full_wait=...) is 0"
                )
                raise QueueFullError(
                    f"work queue {work_queue!r} is full: {over}; {how_long}; the job was NOT sent "
                    "(the job queue's bound in the topology; enqueue again later or raise the bound)",
                    queue=work_queue,
                    limit=over,
                    waited=waited if self.full_wait > 0 else 0.0,
                )
            await asyncio.sleep(min(_POLL, self.full_wait - waited))

    async def _over(self, connection: Connection, work_queue: str, queue: _Queue, bounds: QueueBounds) -> str | None:
        """Which bound ``work_queue`` is over (in words), or None and the publish is counted."""
        asked = time.monotonic()
        if queue.figures is None or asked - queue.figures.at >= REFRESH:
            await self._refresh(connection, work_queue, queue, bounds, asked - REFRESH)
        elif queue.over_by_count(bounds):  # the count says full, the last figure did not: look again now
            await self._refresh(connection, work_queue, queue, bounds, asked)
        over = queue.over(bounds)
        if over is None:  # no await since the check: concurrent enqueues each see the one before counted
            queue.let_through += 1
            queue.unread += 1
        return over

    async def _refresh(
        self, connection: Connection, work_queue: str, queue: _Queue, bounds: QueueBounds, since: float
    ) -> None:
        """Read ``work_queue``'s figures unless a read began after ``since`` (monotonic s); one read at a time."""
        async with queue.lock:
            if queue.figures is not None and queue.figures.at > since:
                return  # read meanwhile by another enqueue
            began = time.monotonic()
            let_through, in_flight = queue.let_through, queue.let_through - queue.settled
            figures = await self._read_figures(connection, work_queue, bounds, began)
            # what may be missing from the figure: in flight when the read began, and let through since
            queue.figures, queue.unread = figures, in_flight + queue.let_through - let_through

    async def _read_figures(
        self, connection: Connection, work_queue: str, bounds: QueueBounds, began: float
    ) -> QueueFigures:
        """The figures of ``work_queue`` now (a missing queue counts as empty: the publish then says unroutable).

        An empty queue has no age: the management API's ``head_message_timestamp`` outlives
        the last message by up to a statistics interval, so it is not asked then.
        """
        state = await queue_state(connection, work_queue)
        ready = state.messages if state is not None else 0
        age = None
        if bounds.max_age and ready:
            async with self._ages_lock:
                age = await self._read(lambda: self._oldest_age(work_queue), None)
        return QueueFigures(ready, age, began)

    def _management_alarms(self) -> list[str]:
        return self._management.ask("alarms", lambda client: client.alarms(), [])

    def _oldest_age(self, work_queue: str) -> float | None:
        info = self._management.ask("ages", lambda client: client.queue(self.settings.vhost, work_queue), None) or {}
        return head_age(info.get("head_message_timestamp"), time.time())  # any unit, 0 no age: the one rule

    async def _read(self, question: Callable[[], T], otherwise: T) -> T:
        """Ask the management API ``question`` (a blocking call) off the loop; ``otherwise`` when it fails."""
        if time.monotonic() < self._management_down_until or self._management.closed:
            return otherwise
        try:
            return await asyncio.to_thread(question)  # one at a time per client: callers hold its lock
        except AmqpJobsError as exc:
            self._management_down_until = time.monotonic() + _MANAGEMENT_BACKOFF
            log.warning(
                "enqueue can't read the broker's alarms or queue ages from the management API (%s); until "
                "it can (retried in %gs), a resource alarm is seen only after the first publish it blocks, "
                "and max_age is not checked",
                exc, _MANAGEMENT_BACKOFF,
            )  # fmt: skip
            return otherwise

    async def aclose(self) -> None:
        """:meth:`close` once a read ahead under way has ended (its thread uses a client; bounded by its timeout)."""
        if self._early_read is not None:
            await asyncio.wait([self._early_read])
        self.close()

    def close(self) -> None:
        """Close the management API clients once no thread uses them (a read ahead under way is cancelled).

        A read still in its thread (its enqueue was cancelled, or this loop ended) keeps its
        client until its request ends (bounded by the client's timeout); no read begins after.
        """
        if self._early_read is not None:
            self._early_read.cancel()
        self._management.close()
