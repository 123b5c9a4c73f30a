"""Fair sharing of a worker's slots among the shards of a job queue (no broker I/O).

A sharded job queue (``shards = N`` in the topology) spreads tenants over N work queues by
a hash of the tenant key, so a tenant that floods the queue fills only its own shard. The
worker consumes every shard (each consumer prefetch 1) but runs at most ``slots`` handlers
at once; :class:`RoundRobinGate` hands a freed slot to the next shard, in round-robin
order, that has a delivery waiting. Every busy shard therefore gets an equal share of the
slots however deep the others are (README "Tenant fairness").
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Evicted(Exception):
    """A delivery waiting for a slot was sent away (:meth:`RoundRobinGate.evict`) without one."""


class RoundRobinGate:
    """``slots`` permits shared round-robin among ``shards`` lanes.

    Args:
        slots: Handlers allowed to run at once (>= 1).
        shards: Number of lanes (>= 1).

    Raises:
        ValueError: ``slots`` or ``shards`` below 1.
    """

    def __init__(self, slots: int, shards: int) -> None:
        if slots < 1 or shards < 1:
            raise ValueError(f"slots and shards must be >= 1 (got {slots}, {shards})")
        self._free = slots
        self._waiting: list[deque[asyncio.Future[None]]] = [deque() for _ in range(shards)]
        self._next = 0  # the lane served first when a slot frees

    @property
    def free(self) -> int:
        """Slots not in use."""
        return self._free

    def waiting(self, shard: int) -> int:
        """Deliveries of lane ``shard`` waiting for a slot."""
        return sum(1 for f in self._waiting[shard] if not f.done())

    async def acquire(self, shard: int) -> None:
        """Wait for a slot for lane ``shard``."""
        if self._free > 0 and not any(self._waiting):
            self._free -= 1
            self._next = (shard + 1) % len(self._waiting)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[shard].append(future)
        try:
            await future
        except Evicted:
            raise
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # granted just as we were cancelled: pass the slot on
            raise

    def evict(self) -> int:
        """Send every waiting delivery away: their :meth:`acquire` raises :class:`Evicted`. Returns how many."""
        count = 0
        for queue in self._waiting:
            while queue:
                future = queue.popleft()
                if not future.done():
                    future.set_exception(Evicted())
                    count += 1
        return count

    def release(self) -> None:
        """Give a slot back: to the next lane (round-robin) with a waiter, else to the pool."""
        lanes = len(self._waiting)
        for step in range(lanes):
            lane = (self._next + step) % lanes
            queue = self._waiting[lane]
            while queue:
                future = queue.popleft()
                if not future.done():
                    future.set_result(None)
                    self._next = (lane + 1) % lanes
                    return
        self._free += 1

    @asynccontextmanager
    async def slot(self, shard: int) -> AsyncIterator[None]:
        """Hold a slot for lane ``shard`` for the duration of the block."""
        await self.acquire(shard)
        try:
            yield
        finally:
            self.release()


def jain_index(values: list[float]) -> float:
    """Jain's fairness index of ``values``: 1.0 when all equal, 1/n when one takes everything.

    ``(sum x)^2 / (n * sum x^2)`` (Jain, Chiu, Hawe 1984). Returns 1.0 for an empty list or all zeros.
    """
    total = sum(values)
    squares = sum(v * v for v in values)
    if not values or squares == 0:
        return 1.0
    return total * total / (len(values) * squares)
