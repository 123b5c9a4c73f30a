"""Releases a worker still owes its ledger: claims it gave up while the ledger did not answer (one home).

A worker gives a claim up when its run ends without marking the job done (the handler failed
or timed out, its ``ctx.transaction()`` was rolled back, an async handler was cancelled at
stop). The release can fail when the ledger is away, often for the very reason the run failed
(README "Idempotency"). Left alone, the claim would make the job's retry wait for the lease
(``BUSY``, outcome ``deferred``), although the worker knows the run is over. So the debt is
kept here and paid:

* **at the retry's claim**: :meth:`OwedReleases.claim` releases an owed claim on the key first,
  so a retry that waits for the ledger runs as soon as the ledger answers;
* **in the background**, every :data:`PAY_EVERY` s while anything is owed (a round stops at
  the first failure: the ledger is away), so the key is free for other workers too;
* **once more at stop** (:meth:`OwedReleases.close`); what is left waits for its lease.

A debt whose lease ran out is dropped: the claim is anyone's to take over by then. Told once
each, on logger ``amqpjobs.worker``: a WARNING when a release is owed, an INFO when it is paid
(or its lease ran out first), nothing per try. A claim of a worker that died is never owed:
it waits for its lease (the crash rule).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from amqpjobs.runtime.ledger import Claim, Ledger
from amqpjobs.runtime.pg_connection import one_line

#: Seconds between two rounds of tries to pay what is owed (a try costs nothing while a
#: PostgreSQL ledger's connect attempts are paced: it fails at once, without the network).
PAY_EVERY = 0.5
#: Seconds a stopping worker gives its last round of tries.
LAST_TRY = 5.0

log = logging.getLogger("amqpjobs.worker")


@dataclass(frozen=True)
class _Debt:
    owner: str  # the run's claim owner
    since: float  # monotonic seconds: when it was owed
    expires: float  # monotonic seconds: when its lease runs out (then nothing is owed)


class OwedReleases:
    """The claim releases one worker owes ``ledger``, paid as soon as it answers (see the module docstring).

    Args:
        ledger: The ledger the claims are in.
        every: Seconds between two background rounds of tries (default :data:`PAY_EVERY`).
    """

    def __init__(self, ledger: Ledger, every: float = PAY_EVERY) -> None:
        self.ledger = ledger
        self.every = every
        self._owed: dict[str, _Debt] = {}
        self._task: asyncio.Task[None] | None = None

    def keys(self) -> list[str]:
        """The job ids whose claims are owed a release, in the order owed."""
        return list(self._owed)

    async def release(self, key: str, owner: str, expires: float) -> None:
        """Release ``owner``'s claim on ``key``; when that fails, owe it (never raises).

        Args:
            key: The job id.
            owner: The run's claim owner.
            expires: When the claim's lease runs out (``time.monotonic()`` seconds).
        """
        try:
            await self.ledger.release(key, owner)
        except Exception as exc:
            self._owe(key, _Debt(owner, time.monotonic(), expires), exc)

    async def claim(self, key: str, owner: str, lease: float) -> Claim:
        """:meth:`Ledger.claim <amqpjobs.runtime.ledger.Ledger.claim>`, after paying an owed release on ``key``.

        Raises:
            LedgerUnavailableError: (or the ledger's other errors) paying or claiming failed.
        """
        if key in self._owed:
            await self._pay(key)
        return await self.ledger.claim(key, owner, lease)

    def _owe(self, key: str, debt: _Debt, exc: BaseException) -> None:
        self._owed[key] = debt
        log.warning("releasing the claim on job id %s failed (%s); released as soon as the ledger answers",
                    key, one_line(exc))  # fmt: skip
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._keep_paying())

    async def _pay(self, key: str) -> None:
        """Pay the release owed on ``key`` (or drop it when its lease ran out); raises the ledger's error."""
        debt = self._owed.get(key)
        if debt is None:
            return
        now = time.monotonic()
        if now >= debt.expires:
            if self._owed.get(key) is debt:
                del self._owed[key]
                log.info("the claim on job id %s expired with its lease before the ledger answered", key)
            return
        await self.ledger.release(key, debt.owner)
        if self._owed.get(key) is debt:  # not paid meanwhile (the retry's claim and a round at once)
            del self._owed[key]
            log.info("released the claim on job id %s after %.1fs owed", key, time.monotonic() - debt.since)

    async def _round(self) -> None:
        """One try for each debt, stopping at the first failure (the ledger is still away)."""
        for key in list(self._owed):
            try:
                await self._pay(key)
            except Exception:
                return

    async def _keep_paying(self) -> None:
        while self._owed:
            await asyncio.sleep(self.every)
            await self._round()

    async def close(self, last_try: float = LAST_TRY) -> None:
        """Stop the background tries, try each debt once more (``last_try`` seconds at most), tell what is left.

        What is left waits for its lease, like a dead worker's claim.
        """
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._owed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._round(), last_try)
        if self._owed:
            log.warning("%d claim(s) could not be released (the ledger is away): job id(s) %s; each waits for its "
                        "lease to run out", len(self._owed), ", ".join(self._owed))  # fmt: skip
            self._owed.clear()
