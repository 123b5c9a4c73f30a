"""The dispatcher of a sharded job queue: a worker's N slots shared fairly, no more deliveries held than slots.

A worker with ``--concurrency N`` holds at most N unacked deliveries of all the shards of a
job queue together (README "Tenant fairness"), so a job it can't start yet stays in its
shard for another worker. Per-consumer prefetch can't express a budget shared by several
consumers, and a global prefetch is denied on RabbitMQ 4.3. So the slots are tokens, and
a delivery can only come for a token set aside before the take:

* **turns**: a free token takes one job with ``basic.get`` from the shard whose turn it is
  (:class:`~amqpjobs.jobs.fairness.ShardTurns`: round-robin; a shard found empty is skipped
  for 1 ms doubling to 100 ms, so an idle worker asks each shard ~10 times a second);
* **leases**: a shard seen with a backlog (``get-ok`` says messages are left) gets a
  consumer whose prefetch is its share of the tokens
  (:func:`~amqpjobs.jobs.fairness.lease_sizes`), reserved before ``basic.consume``: the
  broker streams to it what the worker can run, without a ``basic.get`` round trip per
  job. A lease whose credit stays unused for :data:`DRY` seconds (its shard ran dry), or
  whose share changed, is cancelled; its tokens return at ``cancel-ok``, after every
  delivery the broker sent before it (classic queues). A quorum queue returns the
  deliveries in flight at a cancel to the queue marked redelivered (taken for crashed
  starts), so a quorum lease is drained first (:meth:`~amqpjobs.wire.lane.Lane.end_lease`:
  its acks wait until the broker has no credit left for it, or until no delivery came for
  :data:`QUORUM_QUIET` seconds), and kept through pauses in its shard's traffic shorter
  than :data:`QUORUM_DRY`. A message published during a dry lease's cancel still goes back
  redelivered, so quorum shards get leases only while jobs are short
  (:data:`QUORUM_LEASE_BELOW`). While jobs are tiny (:data:`TURN_BELOW`), a turn skips a shard whose
  lease has credit to spare: the lease brings its next job for less than a ``basic.get``;
* **look-ahead** (``lookahead=1``): while recent jobs ran shorter than
  :data:`LOOKAHEAD_BELOW`, one token more than N: the delivery it brings waits, unacked,
  for the next free running slot, so a slot freed by a short job does not idle during the
  broker round trip. At most N handlers run.

A token freed by a finished job goes back to its lease (the broker sends the next
delivery for it), or to the pool once the job's ack is on its way. Deliveries go through
the worker's handler like a consumer's; ``may_take`` (SIGTERM, a suspect waiting to run
alone) stops new takes, and :meth:`ShardDispatcher.pause` / :meth:`ShardDispatcher.cancel`
return once nothing more can arrive (gets answered, leases cancelled), having sent what
waited for a running slot to the handler (which hands it back unstarted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from typing import Any

from amqpjobs.errors import BrokerError
from amqpjobs.jobs.fairness import ShardTurns
from amqpjobs.jobs.slots import RunningSlots
from amqpjobs.runtime.leases import DRY, QUORUM_DRY, QUORUM_QUIET, LeaseKeeping, _Lease
from amqpjobs.runtime.paced_warnings import PacedWarnings
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.arguments import consume_arguments
from amqpjobs.wire.consume import DeliveryHandler
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.lane import Lane
from amqpjobs.wire.single_file import SingleFile

log = logging.getLogger("amqpjobs.worker")

#: Seconds a shard is left alone after a take failed (channel closed, queue missing).
RETRY_AFTER = 1.0
#: Seconds between two warnings about a shard whose takes keep failing (the first is logged at once).
WARN_EVERY = 60.0
#: The look-ahead delivery is taken only while the job queue's recent jobs ran shorter than this (seconds).
LOOKAHEAD_BELOW = 0.1
#: Seconds the look-ahead delivery waits for a running slot at most; then (the running jobs
#: turned out long) it is handed back to its shard, for a worker with a free slot.
LOOKAHEAD_WAIT = 0.2
#: While recent jobs ran shorter than this (seconds), a turn skips a shard whose lease has unused
#: credit: its lease brings its next job, and a ``basic.get`` would cost more than the job.
TURN_BELOW = 0.002


class ShardDispatcher(LeaseKeeping):
    """Takes the deliveries of one sharded job queue for ``slots`` slots (see the module docstring).

    Args:
        connection: The worker's robust connection.
        job_queue: The job queue's name.
        work_queues: Its shards' work queues, in shard order.
        slots: Deliveries held at most at once (>= 1).
        handler: Called with each delivery; it must settle it.
        inflight: The worker's set of running deliveries: each handler's task is added while it runs.
        may_take: Whether a new take may start now (False after SIGTERM, while a suspect runs alone).
        lease: Lease busy shards (see the module docstring).
        quorum: The shards are quorum queues: a lease's end drains its credit first (see the module docstring).
        consumer_timeout: Seconds, the leases' ``x-consumer-timeout`` consume argument (quorum
            queues on RabbitMQ 4.3+); None sends none.
        safe_url: The broker URL without password, for error messages.
        lookahead: 1: hold one delivery more than ``slots`` while recent jobs ran shorter than
            :data:`LOOKAHEAD_BELOW` (it waits for a running slot; see the module docstring); 0: never.
        hand_back: Called instead of ``handler`` with a delivery that got no running slot
            (it must settle it without running it: a copy back to its shard, then an ack);
            default ``handler`` (which hands back while stopping or paused).

    """

    def __init__(
        self,
        connection: Connection,
        job_queue: str,
        work_queues: Sequence[str],
        slots: int,
        handler: DeliveryHandler,
        inflight: set[asyncio.Task[Any]],
        may_take: Callable[[], bool] = lambda: True,
        lease: bool = True,
        quorum: bool = False,
        consumer_timeout: float | None = None,
        safe_url: str = "",
        lookahead: int = 0,
        hand_back: DeliveryHandler | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1 (got {slots})")
        self._queue = job_queue
        self.slots = slots
        self._handler = handler
        self._hand_back = hand_back or handler
        self._inflight = inflight
        self._may_take = may_take
        self._leasing = lease
        self._quiet = QUORUM_QUIET if quorum else 0.0
        self._dry = QUORUM_DRY if quorum else DRY
        self._consume_arguments = consume_arguments(consumer_timeout)
        self._work_queues = tuple(work_queues)
        # a channel per shard, for its gets and its lease: gets on one channel wait for each other, and a
        # take or a consume that meets a deleted shard (404) closes only that shard's channel
        self._lanes = [Lane(connection, q, batch_acks=slots > 1, safe_url=safe_url) for q in work_queues]
        self._turns = ShardTurns(len(work_queues))
        self._warnings = PacedWarnings(log, every=WARN_EVERY)  # a missing shard fails every RETRY_AFTER
        self._lookahead = lookahead
        self._ahead = 0  # the look-ahead token in use now (0 or 1): deliveries held at most = slots + this
        self._job_seconds: float | None = None  # moving average of recent handler runs
        self._free = slots  # tokens in the pool
        self._slots = RunningSlots(slots)  # handlers running; the look-ahead delivery waits here
        self._taking: set[int] = set()  # shards with a basic.get under way
        self._failed: set[int] = set()  # shards whose last take failed (not ready)
        self._busy: set[int] = set()  # shards seen with a backlog (they get leases)
        self._leases: dict[int, _Lease] = {}  # each shard's current lease (being armed or consuming)
        self._ending: dict[int, _Lease] = {}  # a shard's lease being cancelled (until cancel-ok)
        self._pending = 0  # tokens the leases waiting to be armed need
        self._chores: set[asyncio.Task[None]] = set()  # arming and cancelling leases
        self._changed = asyncio.Event()
        self._paused = False
        self._closing = False
        self._loop: asyncio.Task[None] | None = None
        self._single = SingleFile()  # one take at a time after a 541 (one_at_a_time)

    # ------------------------------------------------------------------ the worker's view
    @property
    def queue(self) -> str:
        """The job queue's name."""
        return self._queue

    @property
    def waiting(self) -> int:
        """Deliveries held that wait for a running slot (the look-ahead: 0 or 1)."""
        return self._slots.waiting

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause` stopped it (until :meth:`resume`)."""
        return self._paused

    @property
    def consuming(self) -> bool:
        """Whether it takes from every shard: every channel open, no take failing."""
        loop = self._loop
        running = loop is not None and not loop.done()
        return running and not self._closing and not self._failed and all(lane.is_open for lane in self._lanes)

    async def start(self) -> None:
        """Open a channel per shard and start taking.

        Raises:
            BrokerError: a shard's work queue does not exist (apply the topology first).

        """
        try:
            for shard, lane in enumerate(self._lanes):
                await lane.open([self._work_queues[shard]])
                lane.on_reopen = partial(self._lane_reopened, shard)
        except BaseException:
            for lane in self._lanes:
                await lane.close()
            raise
        self._loop = asyncio.get_running_loop().create_task(self._run())

    async def pause(self) -> None:
        """Stop taking: end the leases; return once every get is answered and every lease cancelled.

        Deliveries that arrive meanwhile, or wait for a running slot, go to the handler
        at once (which hands them back unstarted).
        """
        self._paused = True
        self._evict()
        for lease in list(self._leases.values()):
            self._end(lease)
        self._kick()
        await self._until(lambda: not self._taking and not self._chores)

    async def resume(self) -> None:
        """Take again after :meth:`pause`, looking at every shard at once."""
        self._paused = False
        self._busy.clear()
        self._turns.reset()
        self._kick()

    async def cancel(self) -> None:
        """Stop taking for good (shutdown): like :meth:`pause`, and the dispatcher's loop ends."""
        self._closing = True
        await self.pause()
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)

    async def settle(self) -> None:
        """Make sure the broker has every ack sent so far (a round trip on each shard's channel)."""
        await asyncio.gather(*(lane.settle() for lane in self._lanes))

    async def flush_acks(self) -> None:
        """Send the acks still batched (before closing the connection)."""
        await asyncio.gather(*(lane.flush_acks() for lane in self._lanes))

    def one_at_a_time(self) -> bool:
        """A 541 closed the connection: one take at a time, no lease; whether this began it.

        Until :meth:`widen`, or until as many deliveries as its slots came (:mod:`amqpjobs.wire.single_file`).
        """
        began = self._single.begin(self.slots)
        for lease in list(self._leases.values()) if began else ():
            self._end(lease)
        self._kick()
        return began

    async def widen(self) -> None:
        """Every token again after :meth:`one_at_a_time`."""
        self._single.end()
        self._kick()

    # ------------------------------------------------------------------ the loop
    def _kick(self) -> None:
        self._changed.set()

    async def _until(self, done: Callable[[], bool]) -> None:
        while not done():
            self._changed.clear()
            await self._changed.wait()

    async def _run(self) -> None:
        while not self._closing:
            self._changed.clear()
            now = time.monotonic()
            wake: float | None = None
            if not self._paused:
                if self._single.on:  # no lease while one at a time, and no token waits for one
                    self._pending, wake = 0, None
                else:
                    wake = self._plan(now)
                take_wake = self._take(now)
                if take_wake is not None:
                    wake = take_wake if wake is None else min(wake, take_wake)
            if wake is None:
                await self._changed.wait()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(asyncio.get_running_loop().time() + max(0.0, wake - now)):
                    await self._changed.wait()

    def _take(self, now: float) -> float | None:
        """Start gets with the tokens the leases do not wait for; returns when a skipped shard's turn comes."""
        if not self._may_take():
            self._evict()  # SIGTERM, or a suspect waits: what waits for a running slot is handed back
            return None
        if self._free - self._pending <= 0:
            return None
        if self._single.on and (self._free < self.slots + self._ahead or self._leases or self._ending):
            return None  # one at a time: a take only once nothing is held
        skip = set(self._taking)
        average = self._job_seconds
        if average is None or average < TURN_BELOW:  # tiny jobs: a lease with credit brings the next one cheaper
            skip.update(s for s, lease in self._leases.items() if lease.consuming and lease.held < lease.size)
        while self._free - self._pending > 0:
            shard = self._turns.next(now, skip)
            if shard is None:
                return self._turns.wake_at(skip)
            skip.add(shard)
            self._free -= 1
            self._taking.add(shard)
            self._spawn(self._take_one(shard), self._inflight)
            if self._single.on:
                break
        return None

    def _spawn(self, coro: Coroutine[Any, Any, None], into: set[asyncio.Task[Any]]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        into.add(task)

        def done(task: asyncio.Task[Any]) -> None:
            into.discard(task)
            self._kick()  # pause() may be waiting for it

        task.add_done_callback(done)

    async def _release(self, lane: Lane) -> None:
        """A token back to the pool, once the acks of its delivery are on their way (before the next take)."""
        await lane.flush_acks()
        self._free += 1
        self._kick()

    # ------------------------------------------------------------------ running slots
    async def _run_one(self, delivery: Delivery) -> float | None:
        """Run a delivery's handler in a running slot (waiting for one: the look-ahead delivery).

        One not granted a slot (paused, stopping, or waiting past :data:`LOOKAHEAD_WAIT`) goes
        to the hand-back handler: not started, back to its shard. Returns the monotonic time
        the run ended and its slot was freed (None: not granted one).
        """
        granted = await self._start_slot()
        if not granted and not self._paused and self._may_take():  # waited in vain: the running jobs are long
            self._timed(LOOKAHEAD_BELOW, at_least=True)
        started = time.monotonic()
        ended = None
        try:
            await (self._handler if granted else self._hand_back)(delivery)
        finally:
            if granted:
                self._end_slot()
                ended = time.monotonic()
                self._timed(ended - started)
        return ended

    def _timed(self, seconds: float, at_least: bool = False) -> None:
        """A handler ran ``seconds``: keep the look-ahead token while jobs are short.

        ``at_least``: the running jobs have taken at least ``seconds`` so far (the look-ahead
        waited that long in vain): the average becomes at least that, so no look-ahead is
        taken again until shorter runs bring it down.
        """
        average = self._job_seconds
        if at_least:
            average = self._job_seconds = max(average or 0.0, seconds)
        else:
            average = self._job_seconds = seconds if average is None else average + 0.2 * (seconds - average)
        ahead = self._lookahead if average < LOOKAHEAD_BELOW else 0
        if ahead != self._ahead:
            self._free += ahead - self._ahead  # below 0 for a moment when taken back: no take until a slot frees
            self._ahead = ahead
            self._kick()

    async def _start_slot(self) -> bool:
        """A running slot: True once granted, False when sent away (pause, SIGTERM: the handler hands it back)."""
        return await self._slots.start(may_wait=not self._paused and self._may_take(), max_wait=LOOKAHEAD_WAIT)

    def _end_slot(self) -> None:
        self._slots.end()

    def _evict(self) -> None:
        self._slots.evict()

    # ------------------------------------------------------------------ turns
    async def _take_one(self, shard: int) -> None:
        lane = self._lanes[shard]
        try:
            taken = await lane.get(self._work_queues[shard])
        except Exception as exc:  # BrokerError; anything else is a bug of ours, but must not lose the token
            hint = "; apply the topology (amqpjobs topology apply)" if "NOT_FOUND" in str(exc) else ""
            self._warnings.failed(f"taking from {lane.name}", str(exc), f"{hint}; trying again every {RETRY_AFTER:g}s",
                                  exc_info=not isinstance(exc, BrokerError))  # fmt: skip
            self._failed.add(shard)
            self._turns.hold(shard, time.monotonic() + RETRY_AFTER)
            taken = None
        else:
            if shard in self._failed:
                self._warnings.succeeded(f"taking from {lane.name}")
            self._failed.discard(shard)
        finally:
            self._taking.discard(shard)
        if taken is None:
            if shard not in self._failed:
                self._turns.found_empty(shard, time.monotonic())
                if shard not in self._leases:
                    self._busy.discard(shard)
            self._free += 1
            self._kick()
            return
        self._turns.found(shard)
        self._single.came()
        if self._leasing and taken.remaining and shard not in self._busy:
            self._busy.add(shard)  # a backlog: it gets a lease
        self._kick()
        try:
            await self._run_one(taken.delivery)
        finally:
            await self._release(lane)
