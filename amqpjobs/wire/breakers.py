"""Circuit breakers on the wire: notices to every worker, the durable open record, the probe lock.

Three broker objects carry a job's breaker (:mod:`amqpjobs.jobs.breaker`) across all
worker processes of an app (names: :mod:`amqpjobs.topology.naming`):

* **Notices** (a counted failure, a probe's result) are published, transient and without
  confirms, to RabbitMQ's pre-declared headers exchange ``amq.headers`` with header
  ``amqpjobs-breaker: <job queue>``. Every worker binds an exclusive, auto-delete queue of
  its own there for each job queue it consumes, so every worker (the sender too) hears
  every notice and counts the same failures. ``amq.headers`` exists on every vhost and
  can't be deleted (RabbitMQ "Exchanges" -> "Pre-declared Exchanges"), so unlike the
  outcome events exchange it is never missing, and notices don't depend on
  ``--outcome-events``. A headers match is exact: no topic wildcard in a name matters.
* **The open record**: a durable classic queue ``<job queue>.breaker.<job>`` that holds no
  messages; its arguments (``amqpjobs-breaker-*``, stored and otherwise ignored by the
  broker, as :mod:`amqpjobs.wire.lock` keeps a holder) say since and until when it is
  open. A worker started later, and ``amqpjobs status``, read it through the management
  API. It is deleted when a probe succeeds. RabbitMQ does not compare such arguments on a
  re-declare (it keeps the first ones), so a new record is written by delete + declare.
* **The probe lock**: an exclusive queue ``<job queue>.breaker-probe.<job>``; the broker
  lets exactly one connection declare it (others get ``RESOURCE_LOCKED``), and deletes it
  when that connection dies, so a killed prober frees it (RabbitMQ "Queues" -> "Exclusive
  Queues"). Declared on the channel underneath aio-pika's robust one, never re-declared
  on a reconnect. Its arguments (``amqpjobs-probe-*``) name the probe: its job id, the
  worker running it and since when (:class:`ProbeHolder`; ``amqpjobs status`` shows them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from amqpjobs.errors import AmqpJobsError, ResourceLockedError
from amqpjobs.topology.naming import BREAKER_EXCHANGE, BREAKER_HEADER, breaker_probe_name, breaker_queue_name
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.connection import close_channel
from amqpjobs.wire.errors import CHANNEL_OPEN_ERRORS, broker_errors, error_kind
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.worker")

_OPENED_AT: Final = "amqpjobs-breaker-opened-at"
_UNTIL: Final = "amqpjobs-breaker-until"
_FAILURES: Final = "amqpjobs-breaker-failures"
_PROBE_ID: Final = "amqpjobs-probe-job-id"
_PROBE_BY: Final = "amqpjobs-probe-by"
_PROBE_SINCE: Final = "amqpjobs-probe-since"
#: Seconds the management API gets to read records (a worker's start, a won probe lock).
_LOOKUP_TIMEOUT: Final = 3.0
# RuntimeError: aio-pika opening a channel while the connection is closed (it reconnects by itself)
_BROKER_ERRORS: tuple[type[BaseException], ...] = (*CHANNEL_OPEN_ERRORS, TimeoutError)
#: Seconds a record write or a lock declare may take before it is given up (and logged).
_CALL_TIMEOUT: Final = 10.0


@dataclass(frozen=True)
class OpenRecord:
    """A breaker's durable open record: open since ``opened_at`` until ``until`` (wall seconds)."""

    opened_at: float
    until: float
    failures: int = 0

    def arguments(self) -> dict[str, Any]:
        """The record queue's arguments."""
        return {
            "x-queue-type": "classic",
            _OPENED_AT: _iso(self.opened_at),
            _UNTIL: _iso(self.until),
            _FAILURES: self.failures,
        }

    @classmethod
    def from_arguments(cls, arguments: dict[str, Any]) -> OpenRecord | None:
        """Read a record back from its queue's arguments; None when they don't hold one."""
        try:
            opened = datetime.fromisoformat(str(arguments[_OPENED_AT])).timestamp()
            until = datetime.fromisoformat(str(arguments[_UNTIL])).timestamp()
            return cls(opened, until, int(arguments.get(_FAILURES, 0)))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class ProbeHolder:
    """Who runs a breaker's probe: job id ``job_id``, worker ``by`` (``host:pid:worker``), since ``since`` (wall s)."""

    job_id: str
    by: str
    since: float

    def arguments(self) -> dict[str, Any]:
        """The probe lock queue's arguments."""
        return {"x-queue-type": "classic", _PROBE_ID: self.job_id, _PROBE_BY: self.by, _PROBE_SINCE: _iso(self.since)}

    @classmethod
    def from_arguments(cls, arguments: dict[str, Any]) -> ProbeHolder | None:
        """Read a holder back from a probe lock queue's arguments; None when they don't name one."""
        try:
            since = datetime.fromisoformat(str(arguments[_PROBE_SINCE])).timestamp()
            return cls(str(arguments[_PROBE_ID]), str(arguments[_PROBE_BY]), since)
        except (KeyError, TypeError, ValueError):
            return None


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


def read_records(settings: BrokerSettings, names: Iterable[str]) -> dict[str, OpenRecord]:
    """The open records among queues ``names`` (management API; blocking: call it in a thread).

    Raises:
        ManagementApiError, BrokerUnavailableError: the management API did not answer.
    """
    found = {}
    with ManagementClient(settings, timeout=_LOOKUP_TIMEOUT) as mgmt:
        for name in names:
            queue = mgmt.queue(settings.vhost, name)
            record = OpenRecord.from_arguments(queue.get("arguments") or {}) if queue is not None else None
            if record is not None:
                found[name] = record
    return found


def records_in(queues: Iterable[dict[str, Any]]) -> dict[str, OpenRecord]:
    """The open records among queues as the management API lists them (``amqpjobs status``)."""
    found = {}
    for queue in queues:
        record = OpenRecord.from_arguments(queue.get("arguments") or {})
        if record is not None:
            found[str(queue.get("name", ""))] = record
    return found


def probes_in(queues: Iterable[dict[str, Any]]) -> dict[str, ProbeHolder]:
    """The running probes among queues as the management API lists them (``amqpjobs status``), by lock queue name."""
    found = {}
    for queue in queues:
        holder = ProbeHolder.from_arguments(queue.get("arguments") or {})
        if holder is not None:
            found[str(queue.get("name", ""))] = holder
    return found


class ProbeLock:
    """The probe lock of one job, held by this connection until :meth:`release`."""

    def __init__(self, name: str, channel: AbstractChannel, underlay: aiormq.abc.AbstractChannel) -> None:
        self.name = name
        self._channel = channel
        self._underlay = underlay

    @property
    def held(self) -> bool:
        """False once the connection that took the lock dropped: the broker deleted it, another may hold it now."""
        return not self._underlay.is_closed

    async def release(self) -> None:
        """Delete the lock queue (errors are logged: it goes with the connection anyway)."""
        try:
            if not self._underlay.is_closed:
                await asyncio.wait_for(self._underlay.queue_delete(self.name), _CALL_TIMEOUT)
        except _BROKER_ERRORS as exc:
            log.warning("breaker probe lock %s not deleted (%s); it goes with the connection", self.name, exc)
        finally:
            await close_channel(self._channel)


class BreakerWire:
    """A worker's breaker notices (in and out), records and probe locks, on one connection.

    Build it with :meth:`open`.
    """

    def __init__(self, connection: Connection, channel: AbstractChannel, exchange: aio_pika.abc.AbstractExchange):
        self._connection = connection
        self._channel = channel
        self._exchange = exchange
        self._sending: set[asyncio.Task[None]] = set()

    @classmethod
    async def open(
        cls, connection: Connection, job_queues: Iterable[str], on_notice: Callable[[bytes], None]
    ) -> BreakerWire:
        """Hear the notices of ``job_queues`` (each body to ``on_notice``) and get ready to send.

        Raises:
            BrokerError: the broker refused the queue or a binding.
        """
        channel = await connection.channel(publisher_confirms=False)
        try:
            with broker_errors():
                exchange = await channel.get_exchange(BREAKER_EXCHANGE, ensure=False)
                queue = await channel.declare_queue("", exclusive=True, durable=False, auto_delete=True)
                for job_queue in job_queues:
                    await queue.bind(exchange, "", arguments={"x-match": "all", BREAKER_HEADER: job_queue})

                async def on_message(message: AbstractIncomingMessage) -> None:
                    on_notice(message.body)

                await queue.consume(on_message, no_ack=True)
        except BaseException:
            await close_channel(channel)
            raise
        return cls(connection, channel, exchange)

    def send(self, job_queue: str, body: bytes) -> None:
        """Publish a notice to every worker of ``job_queue`` (never waits; a failure is logged)."""
        message = aio_pika.Message(body, headers={BREAKER_HEADER: job_queue}, content_type="application/json",
                                   delivery_mode=aio_pika.DeliveryMode.NOT_PERSISTENT)  # fmt: skip

        async def publish() -> None:
            try:
                await self._exchange.publish(message, routing_key="")
            except Exception as exc:  # a lost notice undercounts failures; the job itself is settled
                log.warning("breaker notice for %s not sent (%s)", job_queue, exc)

        task = asyncio.get_running_loop().create_task(publish())
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def record_open(self, job_queue: str, job: str, record: OpenRecord, replace: bool) -> None:
        """Write ``job``'s open record; ``replace``: delete an older one first (else keep one that exists).

        A failure is logged, not raised: the workers running now know from the notices.
        """
        name = breaker_queue_name(job_queue, job)
        channel = None
        try:
            channel = await self._connection.channel(publisher_confirms=False)
            underlay = await channel.get_underlay_channel()
            async with asyncio.timeout(_CALL_TIMEOUT):
                if replace:
                    await underlay.queue_delete(name)
                await underlay.queue_declare(name, durable=True, arguments=record.arguments())
        except _BROKER_ERRORS as exc:
            log.warning("breaker record %s not written (%s); workers started later won't see it open", name, exc)
        finally:
            if channel is not None:
                await close_channel(channel)

    async def record_closed(self, job_queue: str, job: str) -> None:
        """Delete ``job``'s open record (a failure is logged)."""
        name = breaker_queue_name(job_queue, job)
        channel = None
        try:
            channel = await self._connection.channel(publisher_confirms=False)
            underlay = await channel.get_underlay_channel()
            await asyncio.wait_for(underlay.queue_delete(name), _CALL_TIMEOUT)
        except _BROKER_ERRORS as exc:
            log.warning("breaker record %s not deleted (%s); the next probe deletes it", name, exc)
        finally:
            if channel is not None:
                await close_channel(channel)

    async def try_probe(self, job_queue: str, job: str, holder: ProbeHolder) -> ProbeLock | None:
        """Take ``job``'s probe lock for ``holder``; None when another connection holds it (or the broker failed)."""
        name = breaker_probe_name(job_queue, job)
        channel = None
        try:
            channel = await self._connection.channel(publisher_confirms=False)
            underlay = await channel.get_underlay_channel()  # tied to this connection: never re-declared
            await asyncio.wait_for(
                underlay.queue_declare(name, exclusive=True, durable=False, auto_delete=False,
                                       arguments=holder.arguments()),
                _CALL_TIMEOUT,
            )  # fmt: skip
        except _BROKER_ERRORS as exc:
            if channel is not None:
                await close_channel(channel)
            if error_kind(exc) is not ResourceLockedError:
                log.warning("breaker probe lock %s not taken (%s); trying again at a later delivery", name, exc)
            return None
        return ProbeLock(name, channel, underlay)

    async def close(self) -> None:
        """Give notices being sent a moment (0.5 s), then close the channel (the queue goes with it)."""
        if self._sending:
            await asyncio.wait(set(self._sending), timeout=0.5)
        with contextlib.suppress(AmqpJobsError):
            await close_channel(self._channel)
