"""The leases of a sharded job queue's dispatcher (:mod:`amqpjobs.runtime.dispatch`, "leases").

A shard seen with a backlog gets a consumer whose prefetch is reserved from the worker's
tokens; its tokens return to the pool at ``cancel-ok``. Part of
:class:`~amqpjobs.runtime.dispatch.ShardDispatcher` (its state is the dispatcher's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any

from amqpjobs.errors import BrokerError
from amqpjobs.jobs.fairness import ShardTurns, lease_sizes, resize
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.lane import Lane

log = logging.getLogger("amqpjobs.worker")

#: Seconds a lease's credit may stay unused (no delivery since it was freed) before it is cancelled: its shard ran dry.
DRY = 0.05
#: :data:`DRY` for a quorum queue's lease: its cancel, once its shard ran dry, returns a message
#: published during the cancel's round trip to the queue as redelivered (:mod:`amqpjobs.runtime.dispatch`),
#: so a lease whose shard is fed in bursts is kept between them.
QUORUM_DRY = 0.5
#: A quorum queue's shards get leases only while the job queue's recent jobs ran shorter than this
#: (seconds): there a ``basic.get`` round trip per job costs most of the throughput, and a job that
#: comes back redelivered from a dry lease's cancel (above) runs alone only briefly.
QUORUM_LEASE_BELOW = 0.1
#: Seconds without a delivery after which a quorum queue's lease being ended, its credit not used up,
#: is cancelled (its shard ran dry; :mod:`amqpjobs.runtime.dispatch`).
QUORUM_QUIET = 0.25
#: Seconds a shard whose lease failed (queue missing, channel closed) is left to its turns.
LEASE_RETRY = 1.0


@dataclass(eq=False, slots=True)
class _Lease:
    """A consumer on one shard whose prefetch (``size``) is reserved from the tokens."""

    shard: int
    size: int
    tokens: int  # tokens it owns: its size while consuming, then those of its deliveries still held
    held: int = 0  # deliveries received, handler not finished
    tag: str = ""  # consumer tag once consuming
    consuming: bool = False
    ending: bool = False  # asked to end (cancel sent, or to send once consuming)
    ended: bool = False  # nothing more arrives: its unused credit went back to the pool
    last: float = 0.0  # monotonic time its credit was last used or freed (or it started)


class LeaseKeeping:
    """Arms, ends and runs the leases of :class:`~amqpjobs.runtime.dispatch.ShardDispatcher`."""

    _lanes: list[Lane]
    _turns: ShardTurns
    _work_queues: tuple[str, ...]
    _leases: dict[int, _Lease]
    _ending: dict[int, _Lease]
    _busy: set[int]
    _free: int
    _pending: int
    _inflight: set[asyncio.Task[Any]]
    _chores: set[asyncio.Task[None]]
    _quiet: float  # quorum queues: a lease's end drains its credit, waiting at most this long (s) for deliveries
    _consume_arguments: dict[str, Any]
    _dry: float
    _leasing: bool
    _job_seconds: float | None
    slots: int
    _may_take: Callable[[], bool]

    def _kick(self) -> None:
        raise NotImplementedError

    def _spawn(self, coro: Coroutine[Any, Any, None], into: set[asyncio.Task[Any]]) -> None:
        raise NotImplementedError

    async def _run_one(self, delivery: Delivery) -> float | None:
        raise NotImplementedError

    async def _release(self, lane: Lane) -> None:
        raise NotImplementedError

    def _plan(self, now: float) -> float | None:
        """End dry or resized leases, arm the shares that have their tokens; returns when to look again."""
        if not self._leasing:
            return None
        wake: float | None = None
        for shard, lease in list(self._leases.items()):
            if not lease.consuming:
                continue
            if lease.held < lease.size and now - lease.last >= self._dry:
                self._busy.discard(shard)  # credit and no delivery: its shard ran dry
                continue
            # look again when it could be dry (its handlers free credit without waking this loop)
            due = lease.last + self._dry if lease.held < lease.size else now + self._dry
            wake = due if wake is None else min(wake, due)
        sizes = lease_sizes(self.slots, len(self._lanes), self._busy)
        average = self._job_seconds
        if self._quiet and (average is None or average >= QUORUM_LEASE_BELOW):
            sizes = {}  # quorum: turns only, unless jobs are short (see QUORUM_LEASE_BELOW)
        for shard, lease in list(self._leases.items()):
            target = sizes.get(shard, 0)
            if target > lease.size:  # it grows only into the tokens a new lease would have at once (the free
                # ones, its unused credit): one armed with fewer than its share while the others run long jobs
                # would else be cancelled and armed again with as few, over and over
                target = max(lease.size, min(target, self._free + lease.tokens - lease.held))
            if lease.consuming and resize(lease.size, target):
                self._end(lease)
        self._pending = 0
        for shard, size in sizes.items():
            if shard in self._leases or shard in self._ending:  # armed, or its tokens not back yet
                continue
            if self._free >= 1 and self._may_take():
                # what is free now (at most its share): waiting for the whole share while the other
                # tokens run long jobs would idle the free ones with a backlog waiting; it grows later
                self._arm(shard, min(size, self._free))
            else:
                self._pending += size  # the turns leave it the tokens it waits for
        return wake

    def _arm(self, shard: int, size: int) -> None:
        lease = _Lease(shard, size, tokens=size)
        self._free -= size
        self._leases[shard] = lease
        self._spawn(self._start_lease(lease), self._chores)

    async def _start_lease(self, lease: _Lease) -> None:
        lane = self._lanes[lease.shard]  # the shard's own channel: a consume there that meets a deleted queue
        queue = self._work_queues[lease.shard]  # (404) closes only it, never another shard's running jobs' channel
        try:
            if not await lane.exists(queue):
                raise BrokerError(f"work queue {queue!r} does not exist (apply the topology)")
            lease.tag = await lane.lease(queue, lease.size, partial(self._leased, lease), partial(self._lost, lease),
                                         self._consume_arguments, drain=self._quiet > 0)  # fmt: skip
        except BrokerError as exc:
            log.warning("leasing %s failed (%s); taking it by turns, trying again in %gs", queue, exc, LEASE_RETRY)
            self._busy.discard(lease.shard)  # no new lease at once (a storm of them): its next take decides
            self._turns.hold(lease.shard, time.monotonic() + LEASE_RETRY)
            self._ended(lease)
            return
        lease.consuming = True
        lease.last = time.monotonic()
        if lease.ending:  # paused or resized while it was being armed
            await lane.end_lease(lease.tag, self._quiet)
            self._ended(lease)
        self._kick()

    def _end(self, lease: _Lease) -> None:
        """Cancel a lease; its tokens return at ``cancel-ok`` (see the module docstring)."""
        if lease.ending:
            return
        lease.ending = True
        if self._leases.get(lease.shard) is lease:
            del self._leases[lease.shard]
        self._ending[lease.shard] = lease  # its shard gets a new lease once this one ended (its tokens back)
        if lease.consuming:
            self._spawn(self._cancel_lease(lease), self._chores)
        # still being armed: _start_lease cancels it once consuming

    async def _cancel_lease(self, lease: _Lease) -> None:
        await self._lanes[lease.shard].end_lease(lease.tag, self._quiet)
        self._ended(lease)

    def _ended(self, lease: _Lease) -> None:
        """Nothing more arrives for the lease: its unused credit returns to the pool."""
        if self._leases.get(lease.shard) is lease:
            del self._leases[lease.shard]
        if self._ending.get(lease.shard) is lease:
            del self._ending[lease.shard]
        if lease.ended:
            return
        lease.ended = lease.ending = True
        lease.consuming = False
        self._free += lease.tokens - lease.held
        lease.tokens = lease.held
        self._kick()

    def _lost(self, lease: _Lease) -> None:
        """The broker cancelled the lease (queue deleted, node down)."""
        self._busy.discard(lease.shard)
        self._ended(lease)

    def _lane_reopened(self, shard: int) -> None:
        """A shard's channel was reopened (a reconnect, or the broker closed it): its lease went with the old one.

        The shard takes again by turns (ready once a take there succeeded, at most
        :data:`RETRY_AFTER` later: a channel the broker closed because the queue is missing
        is reopened too, and fails again), and gets a lease again once a take sees a backlog.
        """
        lease = self._leases.get(shard)
        if lease is not None and lease.consuming:
            self._ended(lease)
        self._busy.discard(shard)
        self._kick()

    async def _leased(self, lease: _Lease, delivery: Delivery) -> None:
        """A delivery of a lease: run it on a token the lease already owns (in a task of the lane's)."""
        task = asyncio.current_task()
        assert task is not None
        self._inflight.add(task)
        lease.held += 1
        lease.last = time.monotonic()
        if lease.held == lease.size and self._free > self._pending:
            self._kick()  # its credit is used up: its shard can take a turn again
        ended = None
        try:
            ended = await self._run_one(delivery)  # the time its slot was freed (None: no slot)
        finally:
            self._inflight.discard(task)
            lease.held -= 1
            lease.last = time.monotonic() if ended is None else ended  # its credit is free from now: DRY counts here
            if ended is None and not lease.ended:  # handed back, no slot (the look-ahead waited in vain): the
                self._end(lease)  # lease ends, else the broker sends it the next job at once, to be handed back
                # too, every 0.2 s while the long jobs run; its token goes to the pool at cancel-ok
            if lease.ended:  # else the token stays with the lease: the broker sends the next delivery for it
                lease.tokens -= 1
                await self._release(self._lanes[lease.shard])
