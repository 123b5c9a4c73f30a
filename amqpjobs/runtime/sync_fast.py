"""The sync publisher's fast path: an enqueue published from the calling thread (:class:`FastPath`).

A sync enqueue handed to the publisher's event loop thread pays the hand-off and the async
publish's loop turns (bench/RESULTS.md, issue 22). Where nothing of the enqueue needs the
loop, :class:`FastPath` checks and builds the message as :meth:`App.enqueue` does
(:meth:`App._addressed`, :func:`~amqpjobs.runtime.sending.new_message`, and once its connection
knows the broker's version :func:`~amqpjobs.jobs.enqueue_args.check_broker_priority`; for an enqueue without
priority, tenant or headers, the job's :class:`~amqpjobs.runtime.job_stencil.JobStencil`
fills in the same bytes) and publishes it on a
:class:`~amqpjobs.wire.blocking.BlockingPublisher` in the calling thread. It steps aside
(returns None: the loop thread's ``App.enqueue`` publishes) for what only the async path
does: a payload store (claim-check), tracing, a job queue with ``max_depth``/``max_age``
(the gate counts against them), a URL option the blocking client does not know, alarms not
read from the management API within :data:`~amqpjobs.runtime.backpressure.REFRESH` or in
force (the async gate waits, and words the refusal), and a broker it could not connect to
(the async path retries for ``connect_timeout`` and says why).

Connections are pooled, not kept per thread: a call takes a free one (or opens one) and
puts it back, so there are as many as calls ever ran at once, whatever the threads. One whose
publish a resource alarm held past its confirm wait is not put back: it stays open until the broker
answers (:class:`~amqpjobs.runtime.sync_held.HeldConnections`), even after :meth:`FastPath.close`.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from amqpjobs.errors import ConfigurationError, PublishNackedError
from amqpjobs.jobs.enqueue_args import check_broker_priority
from amqpjobs.jobs.evidence import WORKER_HEADROOM
from amqpjobs.runtime.backpressure import EARLY_REFRESH, REFRESH, blocked_error
from amqpjobs.runtime.job_stencil import JobStencil
from amqpjobs.runtime.sending import full_refusal, new_message
from amqpjobs.runtime.sync_held import HeldConnections
from amqpjobs.wire.blocking import BlockingPublisher, ConnectFailed
from amqpjobs.wire.exchange_checks import missing_exchange
from amqpjobs.wire.settings import BrokerSettings

if TYPE_CHECKING:
    from amqpjobs.jobs.registry import JobDef
    from amqpjobs.runtime.app import App, JobRef

#: Seconds the fast path is not tried again after it could not connect (the async path publishes meanwhile).
RETRY_CONNECT = 5.0


class FastPath:
    """Publishing an app's enqueues from the calling thread, on pooled blocking connections.

    Args:
        app: The sync publisher's own app (``App.for_another_loop``), connected on ``loop``
            by the publisher's first (async) enqueue: its gate's alarm reads are used here.
        loop: That app's event loop (another thread's): alarm reads are started there, and
            the ``queued`` records of a results store written.
    """

    def __init__(self, app: App, loop: asyncio.AbstractEventLoop) -> None:
        self._app = app
        self._loop = loop
        self._lock = threading.Lock()
        self._free: list[BlockingPublisher] = []
        self._busy: set[BlockingPublisher] = set()
        self._held = HeldConnections()  # a publish an alarm held past its confirm wait: open until answered
        self._down_until = float("-inf")
        self._reading = False  # an alarm read started from here has not finished
        self._closed = False
        #: Enqueues written on a blocking connection (confirmed or refused), for tests and the bench.
        self.calls = 0
        self._pid = os.getpid()  # a forked child steps aside: the pool's sockets are the parent's
        self._settings: BrokerSettings | None = None  # read at the first call, as the async path reads them
        self._usable = app.payload_store is None and app.tracing is None
        self._stencils: dict[str, JobStencil | None] = {}  # by job name

    def enqueue(
        self, job: JobRef, payload: Any, job_id: str | None, priority: int | None, tenant: str | None,
        headers: Mapping[str, Any] | None,
    ) -> str | None:  # fmt: skip
        """Enqueue from this thread and return the job id; None: the async path must (nothing sent).

        Raises:
            (The errors of :meth:`App.enqueue`, with the same words.)
        """
        app = self._app
        if not self._usable or os.getpid() != self._pid or time.monotonic() < self._down_until:
            return None
        if self._settings is None:
            try:
                settings = app.settings()
            except ConfigurationError:  # the async path raises it, in its words
                return None
            self._usable = BlockingPublisher.usable(settings)
            self._settings = settings
            if not self._usable:
                return None
        if not self._alarms_clear():
            return None
        jobdef, body, layout, job_id, exchange, routing_key = app._addressed(job, payload, job_id, priority, tenant)
        if layout.bounds.checked:
            return None
        stencil = self._stencil(jobdef) if priority is None and tenant is None and not headers else None
        publisher = self._take()
        try:
            try:
                alarm = publisher.blocked()  # connects if need be
            except ConnectFailed:  # the async path retries, and says why if it can't either
                self._down_until = time.monotonic() + RETRY_CONNECT
                publisher.close()
                return None
            check_broker_priority(jobdef, layout, priority, publisher.version)  # the broker's it goes to: connected
            if alarm is not None:
                started = time.monotonic()
                if not publisher.wait_unblocked(app.blocked_timeout):
                    raise blocked_error(alarm, time.monotonic() - started, app.blocked_timeout)
            now = time.time()
            filled = None if stencil is None else stencil.fill(job_id, now, body)
            self.calls += 1
            try:
                if filled is None:
                    publisher.publish(exchange, routing_key, new_message(jobdef, body, job_id, now, priority, tenant,
                                                                          headers))  # fmt: skip
                else:
                    publisher.publish_encoded(exchange, routing_key, *filled, job_id, jobdef.name)
            except PublishNackedError as exc:
                if (full := full_refusal(exc, layout, routing_key, job_id)) is None:
                    raise
                raise full from exc
        finally:
            self._give_back(publisher)
            self._read_ahead_if_due()
        if app.results is not None:  # the queued record, written by the loop's writer (never waits nor raises)
            self._loop.call_soon_threadsafe(app.note_queued, jobdef.name, job_id, layout.name, now)
        return job_id

    def _stencil(self, jobdef: JobDef) -> JobStencil | None:
        """The job's :class:`~amqpjobs.runtime.job_stencil.JobStencil`, made at its first enqueue (None: none)."""
        try:
            return self._stencils[jobdef.name]
        except KeyError:
            stencil = self._stencils[jobdef.name] = JobStencil.of(jobdef)
            return stencil

    def _alarms_clear(self) -> bool:
        """Whether the alarms were read within :data:`REFRESH` and none is in force."""
        gate = self._app._gate
        if gate is None:  # not connected yet: the first enqueue is the async path's
            return False
        alarms, age = gate.known_alarms()
        return age < REFRESH and not alarms

    def _read_ahead_if_due(self) -> None:
        """After a publish: have the loop read the alarms again if they are :data:`EARLY_REFRESH` old.

        Not before the publish: the read's thread (a management API request) would compete for
        the GIL with it (as the async gate's
        :meth:`~amqpjobs.runtime.backpressure.EnqueueGate.read_ahead_if_due`).
        """
        gate = self._app._gate
        if gate is not None and not self._reading and gate.known_alarms()[1] >= EARLY_REFRESH:
            self._reading = True
            self._loop.call_soon_threadsafe(self._read_ahead)

    def _read_ahead(self) -> None:
        """On the loop: read the alarms again (as the async gate does for a steady stream of enqueues)."""
        gate, connection = self._app._gate, self._app._connection
        if gate is None or connection is None:
            self._reading = False
            return
        task = asyncio.ensure_future(gate.read_ahead(connection))
        task.add_done_callback(self._read)

    def _read(self, task: asyncio.Future[None]) -> None:
        self._reading = False
        if not task.cancelled():
            task.exception()  # the gate logs a failed read itself

    def _take(self) -> BlockingPublisher:
        with self._lock:
            publisher = self._free.pop() if self._free else None
            if publisher is None:
                app = self._app
                assert self._settings is not None
                publisher = BlockingPublisher(
                    self._settings, f"{app.name}-sync-publisher", max_message_size=app.max_message_size,
                    header_reserve=WORKER_HEADROOM, missing_exchange=lambda name, version: missing_exchange(
                        name, version, app._is_modulus_exchange
                    ),
                )  # fmt: skip
            self._busy.add(publisher)
            return publisher

    def connections(self) -> list[BlockingPublisher]:
        """The blocking connections of the pool, free and in use (for tests and the bench)."""
        with self._lock:
            return [*self._free, *self._busy]

    def held(self) -> list[BlockingPublisher]:
        """The connections kept open until the broker answers the publish an alarm held (for tests)."""
        return self._held.held()

    def _give_back(self, publisher: BlockingPublisher) -> None:
        with self._lock:
            self._busy.discard(publisher)
            if publisher.held is not None:  # never reused, never closed before its answer (runtime/sync_held.py)
                self._held.keep(publisher)
                return
            if not self._closed:
                self._free.append(publisher)
                return
        publisher.close()  # its call outlived close()

    def close(self, cut: bool) -> None:
        """Close every connection; ``cut``: also those of calls still waiting (each ends uncertain)."""
        with self._lock:
            free, self._free = self._free, []
            busy = list(self._busy)
            self._usable = False
            self._closed = True
        if cut:
            for publisher in busy:
                publisher.cut()
        for publisher in free:
            publisher.close()
