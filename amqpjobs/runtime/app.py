"""The application object: registers jobs and enqueues them (async and sync)."""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from amqpjobs.durations import duration_argument
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.cron import Schedule
from amqpjobs.jobs.enqueue_args import check_broker_priority, checked_job_id, checked_max_message_size
from amqpjobs.jobs.envelope import with_trace
from amqpjobs.jobs.evidence import WORKER_HEADROOM
from amqpjobs.jobs.registry import DEFAULT_APP_NAME, JobDef
from amqpjobs.printable import listed
from amqpjobs.runtime import loop_binding
from amqpjobs.runtime.backpressure import EnqueueGate
from amqpjobs.runtime.ledger import Ledger
from amqpjobs.runtime.publisher_close import close_publishing
from amqpjobs.runtime.publisher_routing import PublisherRouting
from amqpjobs.runtime.results import ResultsStore
from amqpjobs.runtime.results_reads import JobResults
from amqpjobs.runtime.schedules import CronSchedules
from amqpjobs.runtime.sending import get_ready, new_message, send
from amqpjobs.runtime.store_args import store_argument
from amqpjobs.runtime.tracing import Tracing, tracing_for
from amqpjobs.topology.loader import load_topology
from amqpjobs.topology.models import JobQueueLayout, Topology
from amqpjobs.wire import ticks
from amqpjobs.wire.abc import Connection, Publisher, TickWire
from amqpjobs.wire.connection import broker_info, connect, default_max_message_size, server_address
from amqpjobs.wire.held_publishes import HELD_WAIT
from amqpjobs.wire.publish import ConfirmedPublisher
from amqpjobs.wire.publish_outcome import KEPT_BY_APP
from amqpjobs.wire.settings import BrokerSettings, broker_settings

if TYPE_CHECKING:
    from amqpjobs.runtime.payloads import PayloadStore
    from amqpjobs.runtime.sync_publisher import SyncPublisher

C = TypeVar("C", bound=Callable[..., Any])
JobRef = str | Callable[..., Any] | JobDef
_NO_HEADERS: Mapping[str, str] = {}


class App(CronSchedules, JobResults, PublisherRouting):
    """An amqpjobs application: its jobs, its topology, and a publisher.

    Args:
        name: Application name (connection names, logs).
        topology: Path of the topology file or folder (read when first needed, never at
            import), or a :class:`~amqpjobs.topology.models.Topology`.
        app_version: Your application's version, written into evidence headers.
        url: AMQP URL for enqueueing; default ``$AMQPJOBS_URL`` when first needed.
        ledger: Idempotency ledger for jobs declared ``idempotent=True``
            (:class:`~amqpjobs.runtime.ledger.SqliteLedger` or
            :class:`~amqpjobs.runtime.ledger_postgres.PostgresLedger`).
        quarantine_retention: How long failed jobs may rest in quarantine before replay
            (seconds or duration, default 7 days); the ledger must keep done-markers longer
            than that plus the retry window, or a late replay could run an effect again.
        max_message_size: Largest message body in bytes that ``enqueue`` sends; default the
            connected broker's default (128 MiB before RabbitMQ 4.0, 16 MiB from 4.0), read
            from its version at connect. Set it when your broker is configured otherwise.
        tracing: OpenTelemetry spans for enqueue (``send``) and for each delivery a worker of
            this app processes (``process``), to the global TracerProvider, with the trace
            context in ``traceparent``/``tracestate``/``baggage`` headers (README "Tracing").
            Default False: no ``opentelemetry`` module is imported.
        results: Results store (:class:`~amqpjobs.runtime.results.SqliteResults` or
            :class:`~amqpjobs.runtime.results_postgres.PostgresResults`): workers record each
            job's states and return value there (and ``enqueue`` records ``queued`` after the
            broker's confirm, off the publish path), for :meth:`job_status`, :meth:`result` and
            ``amqpjobs job show`` (README "Job status and results"). Default None: nothing recorded.
        blocked_timeout: How long ``enqueue`` waits for a broker resource alarm (memory, disk) to
            clear before raising ``BrokerBlockedError`` (seconds or duration; default 10 s: long
            enough to ride out a short alarm, short enough for a web request; 0: raise at once).
            README "Backpressure".
        queue_full_wait: How long ``enqueue`` waits for a work queue over its ``max_depth`` /
            ``max_age`` to come under it before raising ``QueueFullError`` (seconds or duration;
            default None, same as 0: raise at once).
        payload_store: Where payloads larger than its ``threshold`` (default 256 KiB) are kept
            while the message carries a reference (:mod:`amqpjobs.runtime.payloads`; README
            "Large payloads"): a :class:`~amqpjobs.runtime.payloads_file.FilePayloadStore`,
            :class:`~amqpjobs.runtime.payloads_postgres.PostgresPayloadStore` or
            :class:`~amqpjobs.runtime.payloads_s3.S3PayloadStore`. Producers and workers of the
            app need the same store. Default None: every payload travels in the message body.

    Raises:
        ConfigurationError: ``tracing=True`` without OpenTelemetry (``pip install 'amqpjobs[otel]'``);
            ``payload_store`` not a payload store; ``blocked_timeout`` or ``queue_full_wait``
            negative, NaN, infinite or not a duration; ``max_message_size`` not a whole number
            of bytes >= 1.

    Example::

        app = App("shop", topology="topology/")

        @app.job("orders.confirm", queue="urgent", payload=OrderConfirm, timeout="30s")
        async def confirm(payload: OrderConfirm, ctx: JobContext) -> None: ...

        await app.enqueue("orders.confirm", OrderConfirm(order_id=17, to="a@example.com"))

    """

    def __init__(
        self,
        name: str = DEFAULT_APP_NAME,
        *,
        topology: str | Path | Topology = "topology",
        app_version: str = "",
        url: str | None = None,
        max_message_size: int | None = None,
        ledger: Ledger | None = None,
        quarantine_retention: float | str = "7d",
        tracing: bool = False,
        results: ResultsStore | None = None,
        blocked_timeout: float | str = "10s",
        queue_full_wait: float | str | None = None,
        payload_store: PayloadStore | None = None,
    ) -> None:
        super().__init__(name, app_version=app_version)
        self.tracing: Tracing | None = tracing_for(tracing)
        self.max_message_size = checked_max_message_size(max_message_size)
        self._layouts: dict[str, JobQueueLayout] = {}
        self.ledger = store_argument("ledger", ledger)
        self.results = store_argument("results", results)
        if payload_store is not None:  # the store's module loads only for an app given one
            from amqpjobs.runtime.payloads import checked_store

            payload_store = checked_store(payload_store)
        self.payload_store = payload_store
        self.quarantine_retention = duration_argument("App(quarantine_retention=...)", quarantine_retention)
        now = "refuse at once"
        self.blocked_timeout = duration_argument("App(blocked_timeout=...)", blocked_timeout, zero_means=now)
        self.queue_full_wait = duration_argument(
            "App(queue_full_wait=...)", 0 if queue_full_wait is None else queue_full_wait, zero_means=now
        )
        self._gate: EnqueueGate | None = None
        self._topology_source = topology
        self._topology: Topology | None = topology if isinstance(topology, Topology) else None
        self._url = url
        self._connection: Connection | None = None
        self._connected_on: asyncio.AbstractEventLoop | None = None  # the loop _connection lives on
        self._publisher: Publisher | None = None
        self._broker_version: tuple[int, ...] = (0,)  # read at connect
        self._connect_lock: asyncio.Lock | None = None
        self._role = "publisher"  # its connections' names, <app>-<role>: a sync publisher's "sync-publisher-thread"
        self._watchers: list[Callable[[Connection], None]] = []  # told of each publishing connection opened
        self._schedules: dict[str, Schedule] = {}

    def topology(self) -> Topology:
        """The app's topology, loaded and validated on first use.

        Raises:
            TopologyValidationError: the topology files are invalid.
        """
        if self._topology is None:
            self._topology = load_topology(Path(str(self._topology_source))).topology
        return self._topology

    def layout_of(self, job: JobRef) -> JobQueueLayout:
        """The layout of the job queue ``job`` goes to.

        Raises:
            ConfigurationError: the job, or its job queue in the topology, does not exist.
        """
        jobdef = self.resolve(job)
        cached = self._layouts.get(jobdef.queue)
        if cached is not None:
            return cached
        topology = self.topology()
        try:
            layout = self._layouts[jobdef.queue] = topology.layout(jobdef.queue)
            return layout
        except KeyError:
            raise ConfigurationError(
                f"job {jobdef.name!r} names job queue {jobdef.queue!r}, which the topology ({self.topology_origin}) "
                f"does not declare; known: {listed(q.name for q in topology.job_queues)}"
            ) from None

    def settings(self) -> BrokerSettings:
        """Broker settings from the app's URL or ``$AMQPJOBS_URL``."""
        return broker_settings(self._url)

    def set_default_url(self, url: str) -> None:
        """Use ``url`` for enqueueing (from handlers too) unless the app was given a URL of its own.

        A worker calls this with its own broker URL, so jobs enqueued from handlers go to the
        broker the worker consumes from even when ``$AMQPJOBS_URL`` is not set.
        """
        if self._url is None:
            self._url = url

    def watch_connections(self, watch: Callable[[Connection], None]) -> None:
        """Call ``watch`` with the app's publishing connection now, if open, and with each one it opens later.

        A worker watches it as its own connections (:mod:`amqpjobs.runtime.hard_closes`): its handlers enqueue on it.
        """
        self._watchers.append(watch)
        if self._connection is not None and not self._connection.is_closed:
            watch(self._connection)

    async def connect(self, settings: BrokerSettings | None = None) -> None:
        """Open the publishing connection now (else the first enqueue does), ready: exchanges checked, alarms read.

        Raises:
            BrokerUnavailableError: the broker can't be reached.
            ConfigurationError: the app connected on another event loop (README "Enqueueing").
        """
        loop_binding.refuse_another_loop(self)
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._connection is None or self._connection.is_closed:
                self._connected_on = asyncio.get_running_loop()
                settings = settings or self.settings()
                self._connection = await connect(settings, name=f"{self.name}-{self._role}")
                for watch in self._watchers:
                    watch(self._connection)
                if self._gate is not None:
                    await self._gate.aclose()
                self._gate = EnqueueGate(settings, self.blocked_timeout, self.queue_full_wait)
                self._broker_version = version = broker_info(self._connection).version
                limit = self.max_message_size or default_max_message_size(version)
                self._publisher = ConfirmedPublisher(
                    self._connection, max_message_size=limit, is_modulus_exchange=self._is_modulus_exchange,
                    header_reserve=WORKER_HEADROOM, owner="the app", wait_reconnect=True,  # room for copies' headers
                    kept=KEPT_BY_APP,
                )  # fmt: skip
                await get_ready(self._publisher, self._gate, self._connection, self.layout_of, list(self))

    def default_url(self, url: str) -> None:
        """Deprecated name of :meth:`set_default_url` (it sets, it does not return, the URL)."""
        warnings.warn("App.default_url() is deprecated: use App.set_default_url()", DeprecationWarning, stacklevel=2)
        self.set_default_url(url)

    def _is_modulus_exchange(self, exchange: str) -> bool:
        """Whether ``exchange`` is the ``x-modulus-hash`` exchange of a job queue this app enqueued to."""
        return any(lay.shards_exchange == exchange for lay in self._layouts.values())

    def for_another_loop(self, url: str | None = None) -> App:
        """A copy of this app for another event loop (a SyncPublisher's): the one home of "what carries over".

        Everything the app was given or set since (topology, jobs, URL unless ``url`` is given,
        ``max_message_size``, ``blocked_timeout``, ``queue_full_wait``, tracing, ...) is carried
        over as it is, so an option added to :class:`App` reaches the sync publisher too. What is
        bound to an event loop is not: the publishing connection, its gate and the ``queued``
        writer are the copy's own, and ``results`` and ``payload_store`` are copies with their own
        connections (``.copy()``), closed by the copy's :meth:`close`. The ledger is left out
        (enqueue never uses it, and the copy must not close the app's).
        """
        return loop_binding.copy_for_another_loop(self, url)

    async def marker_wire(self) -> tuple[TickWire, Any]:
        """Where the overlap guard holds its running markers: :meth:`use_markers`'s, else the app's connection.

        Raises:
            BrokerUnavailableError: the broker can't be reached.

        """
        if self._markers is not None:
            return self._markers
        await self.connect()
        return ticks, self._connection

    @property
    def topology_origin(self) -> str:
        """Where the topology comes from, for error messages: its path, or "given as an object"."""
        if isinstance(self._topology_source, Topology):
            return "given to App() as a Topology object"
        return f"loaded from {Path(str(self._topology_source)).resolve()}"

    async def close(self, held_wait: float | str = HELD_WAIT) -> None:
        """Write the pending ``queued`` records, then close the publishing connection and the stores' connections.

        A connect under way (an enqueue's) ends first and what it opened is closed. An enqueue cut off raises
        ``PublisherClosedError`` (not sent) or ``PublishError`` (sent, not confirmed). A connection made on an
        ended event loop is dropped, not closed (README "Enqueueing"). While a resource alarm blocks it, it waits
        up to ``held_wait`` (seconds or "5s", default 5 s), then resets it: held jobs dropped, named in a WARNING.

        Raises:
            ConfigurationError: the connection lives on another thread's loop, still running; a bad ``held_wait``.
        """
        wait = duration_argument("App.close(held_wait=...)", held_wait, zero_means="reset at once")
        loop_binding.forget_an_ended_loop(self)
        async with self._connect_lock or nullcontext():
            await self.flush_queued()
            for store in (self.ledger, self.results, self.payload_store):
                if store is not None:
                    await store.close()
            await close_publishing(self._publisher, self._connection, wait)
            if self._gate is not None:
                await self._gate.aclose()
            self._connection = self._gate = self._connected_on = self._publisher = None

    async def enqueue(
        self,
        job: JobRef,
        payload: Any,
        *,
        job_id: str | None = None,
        priority: int | None = None,
        tenant: str | None = None,
        headers: Mapping[str, Any] | None = None,
    ) -> str:
        """Validate ``payload`` and publish job ``job``, waiting for the broker's confirm.

        Publishers never declare queues: the topology is applied at deploy time, and a
        missing exchange or queue is an error here, not a silent drop.

        Args:
            job: Job name, handler function, or :class:`JobDef`.
            payload: A dict or an instance of the job's payload model.
            job_id: Job id (``message_id``); default a random UUID. Give a business
                identity (e.g. ``"invoice-2026-11-0042"``) to make duplicates recognisable.
            priority: AMQP priority 0..the job queue's ``max_priority`` (default 0). A quorum job queue without
                ``max_priority``: none before RabbitMQ 4.0, 4.0-4.2 0-4 normal and 5+ high, 4.3+ 0-31.
            tenant: Tenant key (header ``amqpjobs-tenant``; picks the shard of a sharded queue).
            headers: Extra headers (not ``x-*`` nor ``amqpjobs-*``).

        Returns:
            The job id.

        Raises:
            InvalidPayloadError: the payload fails the job's model (nothing sent).
            ConfigurationError: unknown job, bad header names or priority (any, 0 too, to a quorum job queue
                before RabbitMQ 4.0: once connected, still before sending), header values AMQP can't carry;
                the app connected on an event loop that has ended, or another thread's (README "Enqueueing").
            UnroutableError: no queue is bound for the job, or its exchange does not exist
                (topology not applied).
            BrokerBlockedError: a resource alarm blocks publishing and did not clear within
                ``blocked_timeout`` (nothing sent).
            QueueFullError: the work queue is over its ``max_depth`` / ``max_age`` (nothing sent),
                or the broker nacked it at ``max_length`` (``reject-publish``).
            PublishNackedError: the broker refused it otherwise.
            MessageTooLargeError: over the broker's ``max_message_size``, or headers and properties
                over ``frame_max`` less :data:`~amqpjobs.jobs.evidence.WORKER_HEADROOM` (nothing sent).
            PayloadStoreError: the payload store could not keep a large payload (nothing sent).
            (After a definite refusal, ``UnroutableError``, ``PublishNackedError`` or
            ``MessageTooLargeError``, a payload stored for it is deleted before raising; after
            ``PublishError``, where the broker may have it, the payload is kept.)
            PublishError: the outcome is unknown: no confirm came, or the channel or connection closed
                under the publish, :meth:`close` too (the message names the job: it may or may not be stored).
            PublisherClosedError: :meth:`close` was called before it was sent (nothing sent).
            BrokerUnavailableError: the broker can't be reached (nothing sent).

        """
        jobdef, body, layout, job_id, exchange, routing_key = self._addressed(job, payload, job_id, priority, tenant)
        tracing = self.tracing
        span = nullcontext(_NO_HEADERS) if tracing is None else tracing.sending(
            exchange, routing_key, jobdef.name, job_id
        )  # fmt: skip
        with span as trace_headers:
            if tracing is not None:  # only the current context's trace headers: a caller's stale ones are dropped
                headers = with_trace(headers or {}, trace_headers)
            now = time.time()
            message = new_message(jobdef, body, job_id, now, priority, tenant, headers)
            on = self._connected_on  # a connection of another loop: connect() says what to do
            if self._publisher is None or (on is not None and on is not asyncio.get_running_loop()):
                await self.connect()
            # what the broker would ignore: a broker's version, or the one a double stands for (if given)
            version = self._broker_version if isinstance(self._publisher, ConfirmedPublisher) else self._routed_version
            if version is not None:
                check_broker_priority(jobdef, layout, priority, version)
            if tracing is not None:  # the node, known once connected (none through amqpjobs.testing)
                tracing.at_server(server_address(self._connection))
            assert self._publisher is not None
            await send(self._publisher, self._gate, self._connection, self.payload_store, layout, exchange,
                       routing_key, message, job_id)  # fmt: skip
        self.note_queued(jobdef.name, job_id, layout.name, now)  # after the confirm; never waits nor raises
        return job_id

    def _addressed(
        self, job: JobRef, payload: Any, job_id: str | None, priority: int | None, tenant: str | None
    ) -> tuple[JobDef, dict[str, Any], JobQueueLayout, str, str, str]:
        """An enqueue's checks and address: (job, body, job queue, job id, exchange, routing key).

        Raises:
            InvalidPayloadError, ConfigurationError: as :meth:`enqueue` (nothing sent).
        """
        jobdef = self.resolve(job)
        body = jobdef.payload_body(payload)
        layout = self.layout_of(jobdef)
        job_id = checked_job_id(jobdef, layout, payload, job_id=job_id, priority=priority, tenant=tenant)
        exchange, routing_key = layout.publish_target(tenant or job_id)
        return jobdef, body, layout, job_id, exchange, routing_key

    def sync_publisher(self, url: str | None = None) -> SyncPublisher:
        """A publisher for code that is not async (a Flask/Django view, a script, a plain-function handler).

        Under :mod:`amqpjobs.testing` (a publisher installed with ``loop``) it enqueues into
        that double, from the calling thread onto the double's loop; ``url`` is then ignored.
        """
        from amqpjobs.runtime.sync_publisher import SyncPublisher

        return SyncPublisher(self, url)
