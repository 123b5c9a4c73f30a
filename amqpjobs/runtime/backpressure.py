"""What ``enqueue`` checks before it writes: broker resource alarms and the job queue's bounds (issue 25).

Alarms: RabbitMQ tells a connection it is blocked (``connection.blocked``) only once it
published during the alarm, and holds that first publish unread until the alarm clears
(RabbitMQ "Blocked Connection Notifications": sent "to publishing connections"). So the
gate also asks the management API for the cluster's alarms (at most once a second) and
refuses before the first publish; without the management API it only knows what
``connection.blocked`` told it.

Bounds: the work queue's ready messages (a passive declare: exact when read) and, for
``max_age``, its oldest message's timestamp (management API; seconds, or milliseconds by
:mod:`amqpjobs.jobs.timestamps`' one rule), each read at most once a
second per work queue. Every publisher may thus enqueue for up to a second past the
bound, which is the overshoot (README "Backpressure").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from amqpjobs.errors import AmqpJobsError, BrokerBlockedError, QueueFullError
from amqpjobs.jobs.timestamps import epoch_seconds
from amqpjobs.topology.bounds import QueueBounds
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.alarms import blocked_by
from amqpjobs.wire.browse import queue_state
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.publisher")
T = TypeVar("T")

#: Queue figures and the cluster's alarms are read at most this often (seconds).
REFRESH = 1.0
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
    """A work queue's figures as read at ``at`` (monotonic seconds): ready messages, age of the oldest (s) or None."""

    ready: int
    oldest_age: float | None
    at: float


class EnqueueGate:
    """Refuses or holds an enqueue while the broker is blocked or the work queue is over its bounds.

    Args:
        settings: The broker (its management API answers the alarm and age questions).
        blocked_timeout: Seconds to wait for a resource alarm to clear before
            ``BrokerBlockedError``.
        full_wait: Seconds to wait for a work queue to come under its bounds before
            ``QueueFullError`` (0: refuse at once).

    """

    def __init__(self, settings: BrokerSettings, blocked_timeout: float, full_wait: float) -> None:
        self.settings = settings
        self.blocked_timeout = blocked_timeout
        self.full_wait = full_wait
        self._management: ManagementClient | None = None
        self._refreshing = asyncio.Lock()  # one read of figures or alarms at a time; the others use it
        self._alarms: tuple[list[str], float] = ([], float("-inf"))
        self._management_down_until = float("-inf")
        self._figures: dict[str, QueueFigures] = {}

    async def before_publish(self, connection: Connection, work_queue: str, bounds: QueueBounds) -> None:
        """Return once a publish to ``work_queue`` may be written; else raise (nothing was sent).

        Raises:
            BrokerBlockedError: a resource alarm did not clear within ``blocked_timeout``.
            QueueFullError: ``work_queue`` stayed over ``max_depth`` / ``max_age`` for ``full_wait``.

        """
        await self._unblocked(connection)
        if bounds.checked:
            await self._under_bounds(connection, work_queue, bounds)

    async def _unblocked(self, connection: Connection) -> None:
        started = time.monotonic()
        while (alarm := await self._alarm(connection)) is not None:
            waited = time.monotonic() - started
            if waited >= self.blocked_timeout:
                raise BrokerBlockedError(
                    f"the broker is blocking publishers: resource alarm ({alarm}); not cleared after "
                    f"{waited:.1f}s (blocked_timeout {self.blocked_timeout:g}s); the job was NOT sent, enqueue "
                    'it again later (RabbitMQ "Memory and Disk Alarms": free memory or disk on the node)',
                    alarm=alarm,
                    waited=waited,
                )
            await asyncio.sleep(min(_POLL, self.blocked_timeout - waited))

    async def _alarm(self, connection: Connection) -> str | None:
        """The alarm blocking publishers now (the connection's notification, else the management API), or None."""
        notified = blocked_by(connection)
        if notified is not None:
            return notified
        if time.monotonic() - self._alarms[1] >= REFRESH:
            async with self._refreshing:
                if time.monotonic() - self._alarms[1] >= REFRESH:  # not read meanwhile by another enqueue
                    self._alarms = (await self._read(self._management_alarms, []), time.monotonic())
        return " & ".join(self._alarms[0]) or None

    async def _under_bounds(self, connection: Connection, work_queue: str, bounds: QueueBounds) -> None:
        started = time.monotonic()
        while (over := await self._over(connection, work_queue, bounds)) is not None:
            waited = time.monotonic() - started
            if waited >= self.full_wait:
                raise QueueFullError(
                    f"work queue {work_queue!r} is full: {over}; the job was NOT sent "
                    "(the job queue's bound in the topology; enqueue again later or raise the bound)",
                    queue=work_queue,
                    limit=over,
                )
            await asyncio.sleep(min(_POLL, self.full_wait - waited))

    async def _over(self, connection: Connection, work_queue: str, bounds: QueueBounds) -> str | None:
        """Which bound ``work_queue`` is over (in words), or None."""
        figures = self._figures.get(work_queue)
        if figures is None or time.monotonic() - figures.at >= REFRESH:
            async with self._refreshing:
                figures = self._figures.get(work_queue)
                if figures is None or time.monotonic() - figures.at >= REFRESH:  # not read meanwhile
                    figures = self._figures[work_queue] = await self._read_figures(connection, work_queue, bounds)
        if bounds.max_depth is not None and figures.ready >= bounds.max_depth:
            return f"max_depth {bounds.max_depth} ({figures.ready} ready)"
        if bounds.max_age is not None and figures.oldest_age is not None and figures.oldest_age >= bounds.max_age:
            return f"max_age {bounds.max_age:g}s (oldest ready message {figures.oldest_age:.1f}s old)"
        return None

    async def _read_figures(self, connection: Connection, work_queue: str, bounds: QueueBounds) -> QueueFigures:
        """The figures of ``work_queue`` now (a missing queue counts as empty: the publish then says unroutable)."""
        state = await queue_state(connection, work_queue)
        age = await self._read(lambda: self._oldest_age(work_queue), None) if bounds.max_age else None
        return QueueFigures(state.messages if state is not None else 0, age, time.monotonic())

    def _client(self) -> ManagementClient:
        if self._management is None:
            self._management = ManagementClient(self.settings, timeout=2.0)
        return self._management

    def _management_alarms(self) -> list[str]:
        return self._client().alarms()

    def _oldest_age(self, work_queue: str) -> float | None:
        info = self._client().queue(self.settings.vhost, work_queue) or {}
        head = info.get("head_message_timestamp")
        if not isinstance(head, int | float) or isinstance(head, bool):
            return None
        return max(0.0, time.time() - epoch_seconds(head))  # seconds or ms (Date.now()): the one rule

    async def _read(self, question: Callable[[], T], otherwise: T) -> T:
        """Ask the management API ``question`` (a blocking call) off the loop; ``otherwise`` when it fails."""
        if time.monotonic() < self._management_down_until:
            return otherwise
        try:
            return await asyncio.to_thread(question)  # one at a time: callers hold _refreshing
        except AmqpJobsError as exc:
            self._management_down_until = time.monotonic() + _MANAGEMENT_BACKOFF
            log.warning(
                "enqueue can't read the broker's alarms or queue ages from the management API (%s); until "
                "it can (retried in %gs), a resource alarm is seen only after the first publish it blocks, "
                "and max_age is not checked",
                exc, _MANAGEMENT_BACKOFF,
            )  # fmt: skip
            return otherwise

    def close(self) -> None:
        """Close the management API client."""
        if self._management is not None:
            self._management.close()
            self._management = None
