"""Stopping and restarting what takes from a work queue: holds, operator pauses and suspects turns agree here.

Also what /readyz says of them (:meth:`SourceControl.readiness`).

Three things stop a job queue's sources (its consumer, or its sharded job queue's
dispatcher): a held delivery whose target is missing (:mod:`amqpjobs.runtime.holding`), an
operator's ``amqpjobs pause`` (:mod:`amqpjobs.runtime.pausing`) and a suspects turn
(:mod:`amqpjobs.runtime.suspects`). Each one's end resumes the sources only when neither of
the others still holds them. Part of :class:`~amqpjobs.runtime.worker.Worker` (its state is
the worker's).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Sequence

from amqpjobs.jobs.isolation import IsolationGate
from amqpjobs.runtime.deliveries import DeliveryPath
from amqpjobs.runtime.holding import BrokerObject, Holding, broker_bind, broker_probe
from amqpjobs.runtime.pausing import OperatorPauses
from amqpjobs.runtime.sources import Source
from amqpjobs.runtime.worker_config import WorkerOptions
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.naming import parse_queue_name
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.consume import MISSING_FIX, WorkQueueConsumer

#: Seconds the event loop may go without a heartbeat before /readyz says not ready.
STUCK_AFTER = 3.0


def consuming_words(queues: Sequence[str], slots: int) -> str:
    """``"work with 2 slot(s)"``, ``"a, b with 2 slot(s) per queue"`` or ``"nothing with 0 slot(s)"``.

    The one wording of the worker's start line and its /readyz answer (``slots``: each queue's).
    """
    if not queues:
        return "nothing with 0 slot(s)"
    return f"{', '.join(queues)} with {slots} slot(s){' per queue' if len(queues) > 1 else ''}"


class SourceControl(DeliveryPath):
    """Pause and resume a work queue's sources (see the module's docstring)."""

    _consumers: list[Source]
    _layouts: dict[str, JobQueueLayout]
    _pauses: OperatorPauses
    _holding: Holding
    _gate: IsolationGate
    _stop: asyncio.Event
    options: WorkerOptions
    ready: asyncio.Event
    heartbeat_at: float
    _connection: Connection | None
    _lanes_missing: set[str]

    def _holds_any(self, source: Source) -> bool:
        """Whether a delivery of one of the work queues ``source`` takes from is held."""
        layout = self._layouts.get(source.queue)
        queues = layout.work_queues if layout is not None and layout.shard_routing_keys else (source.queue,)
        return any(self._holding.holds(q) for q in queues)

    async def _probe(self, objects: Collection[BrokerObject]) -> set[BrokerObject]:
        assert self._connection is not None
        return await broker_probe(self._connection)(objects)

    async def _bind(self, queue: str, exchange: str) -> None:
        """Bind ``queue`` to ``exchange`` (a no-op when bound): the dead-letter route of a reject into quarantine."""
        assert self._connection is not None
        await broker_bind(self._connection)(queue, exchange)

    def _sources_of(self, work_queue: str) -> list[Source]:
        """What takes from ``work_queue``: its consumer, or its sharded job queue's dispatcher (all shards)."""
        names = {work_queue} | {
            layout.name
            for layout in self._layouts.values()
            if layout.shard_routing_keys and work_queue in layout.work_queues
        }
        return [c for c in self._consumers if c.queue in names]

    async def _pause_queue(self, work_queue: str) -> None:
        await asyncio.gather(*(c.pause() for c in self._sources_of(work_queue)))

    async def _resume_queue(self, work_queue: str) -> None:
        if self._stop.is_set() or self._gate.suspect_pending or self._pauses.pauses(work_queue):  # a suspects
            return  # turn resumes it when it ends; an operator's pause lasts until its resume
        await asyncio.gather(*(c.resume() for c in self._sources_of(work_queue) if c.paused))

    def _rooms_of(self, job_queue: str) -> list[Source]:
        """The waiting rooms of ``job_queue``'s rate-limited jobs (README "Flow control" -> "Rate limits")."""
        return [
            c
            for c in self._consumers
            if (p := parse_queue_name(c.queue)).kind == "waiting" and p.job_queue == job_queue
        ]

    async def _started(self, source: Source) -> None:
        """Start ``source``, paused when an operator paused its job queue or a suspects turn is under way.

        Paused, it takes no delivery until resumed (the turn's end resumes every source).
        """
        self._consumers.append(source)  # first: a pause signalled while it starts finds it
        if self._operator_paused(source) or self._gate.suspect_pending:  # a turn's pause did not find it
            await source.pause()
        await source.start()

    def _operator_paused(self, source: Source, known: bool = False) -> bool:
        """Whether an operator paused the job queue ``source`` takes from (or it is not known, unless ``known``)."""
        parsed = parse_queue_name(source.queue)
        queue = parsed.job_queue if parsed.kind == "waiting" else source.queue
        return self._pauses.flagged(queue) if known else self._pauses.pauses(queue)

    async def _pause_job_queue(self, job_queue: str) -> None:
        """An operator's pause: its work queues' sources and waiting rooms (whose waiting deliveries go back)."""
        await asyncio.gather(*(c.pause() for c in (*self._sources_of(job_queue), *self._rooms_of(job_queue))))
        if self._rates is not None:
            await self._rates.hold_back(job_queue)

    async def _resume_unheld(self, job_queue: str) -> None:
        """An operator's resume: its waiting rooms, and its sources unless a delivery of it is held.

        A hold's end resumes the sources it stopped.
        """
        if self._stop.is_set() or self._pauses.pauses(job_queue):
            return
        await asyncio.gather(*(c.resume() for c in self._rooms_of(job_queue) if c.paused))
        if not any(self._holds_any(c) for c in self._sources_of(job_queue)):
            await self._resume_queue(job_queue)

    def readiness(self) -> tuple[bool, str]:
        """(ready, reason): connected to the broker and consuming every assigned queue.

        Safe to call from another thread (it only reads state).
        """
        if self._stop.is_set():
            return False, "stopping"
        stuck = time.monotonic() - self.heartbeat_at
        if stuck > STUCK_AFTER:  # the loop is blocked: whatever the connection state says, nothing moves
            return False, f"event loop blocked for {stuck:.0f}s"
        connection = self._connection
        if not self.ready.is_set() or connection is None:
            return False, "starting"
        if connection.is_closed or not connection.connected.is_set():
            return False, "not connected to the broker (reconnecting)"
        if self._holding.summary:
            return False, self._holding.summary
        if self._lanes_missing:
            return False, f"suspects queue(s) {', '.join(sorted(self._lanes_missing))} missing (apply the topology)"
        if gone := [c.queue for c in self._consumers if isinstance(c, WorkQueueConsumer) and c.missing_since]:
            return False, f"work queue(s) {', '.join(gone)} missing: {MISSING_FIX}"
        idle = sum(1 for c in self._consumers if not c.consuming and not c.paused)
        if idle:
            return False, f"{idle} of {len(self._consumers)} consumer(s) not consuming (channel closed or cancelled)"
        return True, self._consuming()

    def _consuming(self) -> str:
        """What /readyz says when ready: the queues taken from, their slots, and the job queues paused."""
        active = sorted(c.queue for c in self._consumers if not self._operator_paused(c, known=True))
        paused = f"; paused: {', '.join(sorted(self._pauses.flags))}" if self._pauses.flags else ""
        return f"consuming {consuming_words(active, self.options.concurrency)}{paused}"
