"""Stopping and restarting what takes from a work queue: holds, operator pauses and suspects turns agree here.

Three things stop a job queue's sources (its consumer, or its sharded job queue's
dispatcher): a held delivery whose target is missing (:mod:`amqpjobs.runtime.holding`), an
operator's ``amqpjobs pause`` (:mod:`amqpjobs.runtime.pausing`) and a suspects turn
(:mod:`amqpjobs.runtime.suspects`). Each one's end resumes the sources only when neither of
the others still holds them. Part of :class:`~amqpjobs.runtime.worker.Worker` (its state is
the worker's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from amqpjobs.jobs.isolation import IsolationGate
from amqpjobs.runtime.deliveries import DeliveryPath
from amqpjobs.runtime.holding import BrokerObject, Holding, broker_probe
from amqpjobs.runtime.pausing import OperatorPauses
from amqpjobs.runtime.sources import Source
from amqpjobs.topology.models import JobQueueLayout


class SourceControl(DeliveryPath):
    """Pause and resume a work queue's sources (see the module's docstring)."""

    _consumers: list[Source]
    _layouts: dict[str, JobQueueLayout]
    _pauses: OperatorPauses
    _holding: Holding
    _gate: IsolationGate
    _stop: asyncio.Event

    def _holds_any(self, source: Source) -> bool:
        """Whether a delivery of one of the work queues ``source`` takes from is held."""
        layout = self._layouts.get(source.queue)
        queues = layout.work_queues if layout is not None and layout.shard_routing_keys else (source.queue,)
        return any(self._holding.holds(q) for q in queues)

    async def _probe(self, objects: Collection[BrokerObject]) -> set[BrokerObject]:
        assert self._connection is not None
        return await broker_probe(self._connection)(objects)

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

    async def _resume_unheld(self, job_queue: str) -> None:
        """An operator's resume: not while a delivery of it is held (the hold's end resumes it)."""
        if not any(self._holds_any(c) for c in self._sources_of(job_queue)):
            await self._resume_queue(job_queue)
