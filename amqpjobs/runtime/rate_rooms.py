"""A rate-limited job in a worker process: its queues and its token gate (README "Flow control" -> "Rate limits").

Each waiting delivery of the job in this process waits at the :class:`TokenGate` for a
token from the job's token queue, oldest first; the gate consumes the token queue (prefetch
1) only while a delivery waits, and drops a token it held over
:data:`~amqpjobs.jobs.rate.HOLD_FRACTION` of an interval (:mod:`amqpjobs.runtime.rate_limits`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amqpjobs.jobs.rate import HOLD_FRACTION, RateLimit
from amqpjobs.topology.declarations import Declarations
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.naming import RateQueues
from amqpjobs.wire.acks import DeliveryChannelClosed
from amqpjobs.wire.consume import WorkQueueConsumer
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.lock import LockHolder

#: Deliveries of a rate-limited job a worker process holds waiting for a token, at most: one
#: process starts at most one per token, so two keep it busy; more only come back marked
#: redelivered (as crash suspects) when the process is killed.
WAITING_PER_PROCESS = 2


class TokenGate:
    """One rate-limited job's tokens in this process: each waiting delivery gets one, oldest first.

    Args:
        job: The job's name (for logs).
        rate: Its rate limit.
        stop: Set when the worker stops: no token is given out from then, and waiting ends
            without one at :meth:`release` (once the worker took its last delivery: what it
            hands back then is not taken again by its own consumers).
        held_back: Whether an operator's pause holds the job's job queue back now: no token is
            given out then, and waiting ends without one (call :meth:`hold_back` when it starts).
    """

    def __init__(
        self, job: str, rate: RateLimit, stop: asyncio.Event, held_back: Callable[[], bool] = lambda: False
    ) -> None:
        self.job = job
        self.rate = rate
        self.feed: WorkQueueConsumer | None = None  # the token queue's consumer, consuming while a delivery waits
        self._stop = stop
        self._held_back = held_back
        self._released = asyncio.Event()
        self._aside = False  # a suspect's turn: only the suspect (``front``) waits for a token
        self._waiters: deque[asyncio.Future[tuple[float, Delivery]]] = deque()
        self._switching = asyncio.Lock()
        self.taken = 0  # tokens taken by deliveries of this process (suspects' included)
        self._held: dict[asyncio.Task[Any], Delivery] = {}  # tokens taken, unacked until used (by the taker's task)

    async def acquire(self, front: bool = False, within: float | None = None) -> bool:
        """Wait for a fresh token; False when the worker stops or a pause holds it back first (not to start).

        ``front``: first in line (a suspect's turn); ``within``: seconds to wait at most (then False).
        The token taken stays unacked, held by the calling task, until :meth:`spend` (its
        handler starts) or :meth:`give_back` (it does not: the token goes back to its queue).
        """
        loop = asyncio.get_running_loop()
        first = not front
        deadline = None if within is None else time.monotonic() + within
        while not self._released.is_set() and not self._held_back() and (front or not self._aside):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            waiter: asyncio.Future[tuple[float, Delivery]] = loop.create_future()
            (self._waiters.append if first else self._waiters.appendleft)(waiter)  # a retry keeps its turn
            first = False
            stopping = loop.create_task(self._released.wait())
            try:
                await self._want()
                await asyncio.wait((waiter, stopping), timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
                if not waiter.done():
                    waiter.cancel()
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                    await self._want()
            if waiter.cancelled():
                if deadline is not None and not self._released.is_set():
                    continue  # out of time, or held back: said at the top
                return False
            received, token = waiter.result()
            if time.monotonic() - received <= self.rate.interval * HOLD_FRACTION:
                self.taken += 1
                if (task := asyncio.current_task()) is not None:
                    self._held[task] = token
                return True
            # held too long before this delivery could take it (a blocked loop): dropped, wait for the next one
            with contextlib.suppress(DeliveryChannelClosed):
                await token.ack()
        return False

    async def spend(self, task: asyncio.Task[Any] | None) -> None:
        """``task``'s delivery starts its handler: the token it took, if any, is used (acked)."""
        token = self._held.pop(task, None) if task is not None else None
        if token is not None:
            with contextlib.suppress(DeliveryChannelClosed):  # a closed channel put it back: a start more, once
                await token.ack()

    async def give_back(self, task: asyncio.Task[Any] | None) -> None:
        """``task``'s delivery did not start: the token it took, if any, goes back to its queue (its expiry kept).

        The broker hands it to the next delivery waiting for one, here or in another process
        (requeued first in line: RabbitMQ "Negative Acknowledgements"); a newer token already
        there drops it (``x-max-length`` 1), so one token at most waits, as ever.
        """
        token = self._held.pop(task, None) if task is not None else None
        if token is not None:
            await self._want()  # nothing waits here (a stop): stop consuming first, or it comes straight back
            with contextlib.suppress(DeliveryChannelClosed):  # a closed channel puts it back anyway
                await token.requeue()

    async def on_token(self, token: Delivery) -> None:
        """A token from the token queue: hand it to the oldest waiter (unacked until used), else put it back.

        Held back by a pause, it goes back, and so does every waiting delivery (:meth:`hold_back`);
        so it does once the worker stops (its waiting deliveries go back at :meth:`release`).
        """
        received = time.monotonic()
        if self._held_back():
            self._wake()
        while self._waiters and not self._stop.is_set():
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result((received, token))
                await self._want()
                return
        await self._want()  # stop consuming first, or the broker hands it straight back
        with contextlib.suppress(DeliveryChannelClosed):  # a closed channel puts it back anyway
            await token.requeue()

    async def hold_back(self) -> None:
        """A pause holds the job back: each waiting delivery stops waiting without a token (goes back unstarted)."""
        self._wake()
        await self._want()

    async def set_aside(self, aside: bool) -> None:
        """A suspect's turn starts (``aside``) or ends.

        While it runs, each waiting delivery stops waiting without a token, and none waits
        until it ends, bar the suspect's own :meth:`acquire` with ``front``.
        """
        self._aside = aside
        if aside:
            self._wake()
            await self._want()

    def release(self) -> None:
        """The stopping worker took its last delivery: each waiting one stops waiting without a token."""
        self._released.set()

    def _wake(self) -> None:
        while self._waiters:
            self._waiters.popleft().cancel()

    async def _want(self) -> None:
        """Consume the token queue while a delivery waits here, not otherwise (tokens go where they are needed)."""
        async with self._switching:
            feed, wanted = self.feed, not self._stop.is_set() and any(not w.done() for w in self._waiters)
            if feed is None or wanted == (not feed.paused):
                return
            await (feed.resume() if wanted else feed.pause())


@dataclass
class Room:
    """One rate-limited job in this worker: its queues, its job queue's layout and its gate."""

    job: str
    rate: RateLimit
    names: RateQueues
    layout: JobQueueLayout
    gate: TokenGate
    declarations: Declarations  # its waiting room and token queue, declared again when found missing
    source: RoomSource | None = None  # its waiting room's consumer in this process
    look_at_minter: float = 0.0  # monotonic time of the next look at another minter's rate
    minters_warned: set[LockHolder] = field(default_factory=set)  # minters at another rate (with it), each said once


class RoomSource:
    """A waiting room's consumer holding few waiting deliveries: at most :data:`WAITING_PER_PROCESS`.

    Its runs (a delivery that took its token runs on, unacked until its outcome) hold slots
    too: ``concurrency`` deliveries in all. When a token taken or a run ended leaves room for
    more than its consumer's credit (its prefetch less its unsettled deliveries), it consumes
    again (``basic.cancel``, then ``basic.consume`` under a new tag) with a prefetch of what
    it may still take (per consumer: RabbitMQ "Consumer Prefetch"), so a killed process
    leaves only those few waiting ones marked redelivered. A quorum waiting room is consumed
    again only once the consumer's credit is used up: a quorum queue returns a delivery on
    its way to a cancelled consumer marked ``redelivered`` (README "Tenant fairness",
    leases), which a worker takes for a crashed start. It is a
    :class:`~amqpjobs.runtime.sources.Source`: the worker pauses and resumes it as any other.

    Args:
        inner: The waiting room's consumer (its handler is :meth:`deliver`'s caller's).
        concurrency: The process's slots for this waiting room.
        quorum: The waiting room is a quorum queue (the job queue's type).
    """

    def __init__(self, inner: WorkQueueConsumer, concurrency: int, quorum: bool = False) -> None:
        self.inner = inner
        self._concurrency = concurrency
        self._quorum = quorum
        self._consumer = 0  # which consume deliveries come from now (bumped at each basic.consume)
        self._unsettled: Counter[int] = Counter()  # received, not yet settled, by the consume they came from
        self._waiting = 0  # received, not yet past their token wait
        self._held = 0  # received, not yet settled (waiting or running)
        self._none_waiting = asyncio.Event()  # set while nothing received waits for a token
        self._none_waiting.set()
        self._paused = False  # by the worker: a suspects turn, a missing target, an operator's pause
        self._busy = 0  # consuming again under way
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        inner.prefetch = self._room()

    def _room(self) -> int:
        return min(WAITING_PER_PROCESS - self._waiting, self._concurrency - self._held)

    def _credit(self) -> int:
        """Deliveries the broker may still send the current consumer (0 when not consuming); never above the room."""
        return max(0, self.inner.prefetch - self._unsettled[self._consumer]) if self.inner.consuming else 0

    @property
    def queue(self) -> str:
        """The waiting room's name."""
        return self.inner.queue

    @property
    def consuming(self) -> bool:
        """Consuming, or full (nothing more to take until a token is taken or a run ends)."""
        return not self._paused and (self.inner.consuming or self._busy > 0 or self._room() <= 0)

    @property
    def paused(self) -> bool:
        """Paused by the worker."""
        return self._paused

    def one_at_a_time(self) -> bool:
        """Never: a waiting room holds copies a worker published (a 0-9-1 client's), never a 541's cause."""
        return False

    async def widen(self) -> None:
        """Nothing to widen (:meth:`one_at_a_time`)."""

    async def none_waiting(self) -> None:
        """Return once no delivery received waits for a token (each gone on to run or to its hand-back)."""
        await self._none_waiting.wait()

    def received(self) -> int:
        """A delivery arrived (call first in the handler); returns what to give :meth:`settled`."""
        self._waiting += 1
        self._held += 1
        self._none_waiting.clear()
        consumer = self._consumer
        self._unsettled[consumer] += 1
        if self._quorum and self._credit() <= 0 < self._room():  # safe to consume again now: nothing on its way
            self._again()
        return consumer

    def waited(self) -> None:
        """Its wait for a token is over (it runs, or goes back): room for another waiting delivery."""
        self._waiting -= 1
        if not self._waiting:
            self._none_waiting.set()
        self._again()

    def settled(self, consumer: int) -> None:
        """It is settled (call last in the handler), ``consumer``: what :meth:`received` returned for it."""
        self._held -= 1
        self._unsettled[consumer] -= 1
        if self._unsettled[consumer] <= 0:
            del self._unsettled[consumer]
        self._again()

    def _again(self) -> None:
        task = asyncio.get_running_loop().create_task(self._refresh())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refresh(self) -> None:
        """Consume again with a prefetch of the room left (unless paused, or full: then it waits as it is)."""
        self._busy += 1
        try:
            async with self._lock:
                room, credit = self._room(), self._credit()
                if self._paused or room <= credit:  # the consumer may already bring all there is room for
                    return
                if self._quorum and credit > 0:  # a cancel would send what is on its way back redelivered:
                    return  # consumed again once the credit is used (received)
                await self.inner.pause()
                if self._paused:  # paused meanwhile
                    return
                self.inner.prefetch = room
                self._consumer += 1
                await self.inner.resume()
        finally:
            self._busy -= 1

    async def start(self) -> None:
        """Consume the waiting room (not while paused: a :meth:`pause` before it holds)."""
        await self.inner.start()

    async def pause(self) -> None:
        """Stop taking deliveries (``basic.cancel``)."""
        self._paused = True
        async with self._lock:
            await self.inner.pause()

    async def resume(self) -> None:
        """Take again, with a prefetch of the room left (none: once a token is taken or a run ends)."""
        self._paused = False
        async with self._lock:
            if not self._paused and (room := self._room()) > 0:
                self.inner.prefetch = room
                self._consumer += 1
                await self.inner.resume()

    async def cancel(self) -> None:
        """Stop taking for good."""
        self._paused = True
        for task in self._tasks:
            task.cancel()
        await self.inner.cancel()

    async def settle(self) -> None:
        """Make sure the broker has every ack sent so far."""
        await self.inner.settle()

    async def flush_acks(self) -> None:
        """Send the acks still batched."""
        await self.inner.flush_acks()
