"""Running slots: at most N handlers at once; a delivery beyond them waits for one, or is sent away.

A sharded job queue's dispatcher (:mod:`amqpjobs.runtime.dispatch`) may hold one delivery
more than its slots (the look-ahead, README "Tenant fairness"): that delivery waits here
for the next slot to free. Pure asyncio, no broker.
"""

from __future__ import annotations

import asyncio
from collections import deque


class RunningSlots:
    """At most ``slots`` runs at once; further :meth:`start` calls wait, first come first served.

    Args:
        slots: Runs allowed at once (>= 1).

    Raises:
        ValueError: ``slots`` < 1.

    """

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1 (got {slots})")
        self.slots = slots
        self.running = 0
        self._waiting: deque[asyncio.Future[bool]] = deque()

    @property
    def waiting(self) -> int:
        """Runs waiting for a slot now."""
        return sum(1 for w in self._waiting if not w.done())

    async def start(self, may_wait: bool = True, max_wait: float | None = None) -> bool:
        """Take a slot: True once granted (call :meth:`end` after the run), False when sent away.

        Without a free slot, waits for one when ``may_wait`` (at most ``max_wait`` seconds
        when given), else returns False at once. :meth:`evict` sends the waiters away (False).
        """
        if self.running < self.slots:
            self.running += 1
            return True
        if not may_wait:
            return False
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            if max_wait is None:
                return await waiter
            done, _ = await asyncio.wait({waiter}, timeout=max_wait)
            if done:
                return waiter.result()
            waiter.cancel()  # not granted in time (nothing ran since the wait returned): end() skips it
            return False
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.end()  # granted just as it was cancelled: pass the slot on
            raise

    def end(self) -> None:
        """A run ended: its slot goes to the first waiter, else back to the free ones."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return
        self.running -= 1

    def evict(self) -> int:
        """Send every waiter away (their :meth:`start` returns False); returns how many there were."""
        sent = 0
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(False)
                sent += 1
        return sent
