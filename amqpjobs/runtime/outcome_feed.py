"""Outcome events for a page that refreshes when jobs end (``amqpjobs console``'s ``/events``).

:class:`OutcomeHub` subscribes to the outcome events exchange (:func:`amqpjobs.wire.events.subscribe_outcomes`,
an exclusive auto-delete queue of its own) and shares that one subscription among many readers.
"""

from __future__ import annotations

import asyncio
import time

from amqpjobs.errors import BrokerUnavailableError
from amqpjobs.jobs.events import OutcomeEvent, decode_events
from amqpjobs.runtime.quarantine import session
from amqpjobs.wire.events import subscribe_outcomes
from amqpjobs.wire.settings import BrokerSettings

#: Events kept for a slow reader; past it the oldest are dropped (a page only needs to know "something ended").
BACKLOG = 1000
#: Seconds the console's reads (pages and the shared subscription) keep retrying a refused connect (at most
#: the settings' connect timeout): a page's 503 should not wait out the 30 s a worker waits.
CONNECT_WAIT = 2.0
#: Seconds a failed connect is answered again without trying (each new page with the broker down).
FAILURE_MEMORY = 5.0


class OutcomeHub:
    """One subscription to the outcome events shared by every reader (the console's ``/events`` clients).

    The first :meth:`join` opens it (one connection named ``amqpjobs-quarantine``, one
    exclusive auto-delete queue); the last :meth:`leave` closes both. Leaving needs no
    ``await``: a reader cancelled by its client's disconnect can still leave. Readers only
    learn "something ended"; a slow reader drops its oldest events (:data:`BACKLOG`).

    With the broker down, opening fails fast: connects are retried for :data:`CONNECT_WAIT`
    seconds at most, and for :data:`FAILURE_MEMORY` seconds after a failure each new reader
    gets the same :class:`~amqpjobs.errors.BrokerUnavailableError` without a new attempt.
    """

    def __init__(self, settings: BrokerSettings) -> None:
        self._settings = settings.with_connect_timeout(min(settings.connect_timeout, CONNECT_WAIT))
        self._failed: tuple[float, str] | None = None  # (monotonic time, message) of the last refused connect
        self._readers: set[asyncio.Queue[OutcomeEvent]] = set()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def _on_body(self, body: bytes) -> None:
        for event in decode_events(body):
            for reader in self._readers:
                if reader.full():
                    reader.get_nowait()
                reader.put_nowait(event)

    async def _run(self, ready: asyncio.Future[None]) -> None:
        try:
            async with session(self._settings) as connection:
                watch = await subscribe_outcomes(connection, self._on_body)
                ready.set_result(None)
                try:
                    await asyncio.Event().wait()  # until the last reader leaves (cancelled)
                finally:
                    if not watch.is_closed:
                        await watch.close()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                raise

    async def join(self) -> asyncio.Queue[OutcomeEvent]:
        """A new reader's queue of events, the subscription opened if none is.

        Raises:
            NotFoundError: the events exchange does not exist (apply the topology).
            BrokerUnavailableError: the broker can't be reached (within :data:`CONNECT_WAIT`
                seconds), or could not be a moment ago (:data:`FAILURE_MEMORY`).

        """
        async with self._lock:
            if self._task is None or self._task.done():
                if self._failed is not None and time.monotonic() - self._failed[0] < FAILURE_MEMORY:
                    raise BrokerUnavailableError(self._failed[1])
                ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._task = asyncio.create_task(self._run(ready), name="amqpjobs-outcome-hub")
                try:
                    await asyncio.shield(ready)
                except BrokerUnavailableError as exc:
                    self._failed = (time.monotonic(), str(exc))
                    self._task = None
                    raise
                except BaseException:  # refused, or this reader left while it connected
                    if not self._readers:
                        self._task.cancel()
                        self._task = None
                    raise
            reader: asyncio.Queue[OutcomeEvent] = asyncio.Queue(BACKLOG)
            self._readers.add(reader)
            return reader

    def leave(self, reader: asyncio.Queue[OutcomeEvent]) -> None:
        """Forget ``reader``; the subscription closes (in the background) when it was the last."""
        self._readers.discard(reader)
        if not self._readers and self._task is not None:
            self._task.cancel()
            self._task = None

    async def close(self) -> None:
        """Close the subscription whoever still reads (the console shutting down)."""
        self._readers.clear()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
