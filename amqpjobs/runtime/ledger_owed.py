"""Ledger writes a worker still owes: releases and done-marks that failed while the ledger did not answer (one home).

**Releases.** A worker gives a claim up when its run ends without marking the job done (the
handler failed or timed out, its ``ctx.transaction()`` was rolled back, an async handler was
cancelled at stop). The release can fail when the ledger is away, often for the very reason
the run failed (README "Idempotency"). Left alone, the claim would make the job's retry wait
for the lease (``BUSY``, outcome ``deferred``), although the worker knows the run is over.

**Done-marks.** A handler that returned succeeded: its effect happened. When marking its key
done then fails (the ledger went away after the handler's return), the run is still a success
(acked) and the mark is owed. Until it is paid, :meth:`OwedWrites.claim` answers ``DONE`` for
the key here, so a redelivery or replay of it meanwhile runs nothing (outcome ``duplicate``);
elsewhere the key's claim, still running under this run's owner, answers ``BUSY`` until its
lease runs out.

So the debts are kept here and paid:

* **at the key's next claim**: :meth:`OwedWrites.claim` releases an owed claim on the key first,
  so a retry that waits for the ledger runs as soon as the ledger answers (an owed done-mark
  answers ``DONE`` without the ledger);
* **in the background**, every :data:`PAY_EVERY` s while anything is owed (a round stops at
  the first failure: the ledger is away), so the key is free (or done) for other workers too;
* **once more at stop** (:meth:`OwedWrites.close`); what is left waits for its lease.

A release whose lease ran out is dropped: the claim is anyone's to take over by then. A
done-mark is never dropped while the worker lives (late, it still spares a replay the effect).
Told once each, on logger ``amqpjobs.worker``: a WARNING when a write is owed, an INFO when it
is paid (or its lease ran out first), nothing per try. A worker that died owes nothing: its
claim waits for its lease, then the job may run again (the crash rule).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass

from amqpjobs.runtime.ledger import Claim, Ledger
from amqpjobs.text import one_line

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
    expires: float  # monotonic seconds: when its lease runs out (then no release is owed; inf for a done-mark)
    done: bool = False  # a done-mark owed, else a release


class OwedWrites:
    """The ledger writes one worker owes ``ledger``, paid as soon as it answers (see the module docstring).

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
        """The job ids owed a write (a release or a done-mark), in the order owed."""
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

    async def done(self, key: str, owner: str) -> None:
        """Mark ``key`` done for ``owner``'s run, whose handler returned; when that fails, owe it (never raises).

        Until the mark is paid, :meth:`claim` answers ``DONE`` for ``key``.

        Args:
            key: The job id.
            owner: The run's claim owner.
        """
        try:
            await self.ledger.done(key, owner)  # False when its transaction() already marked it: fine
        except Exception as exc:
            self._owe(key, _Debt(owner, time.monotonic(), math.inf, done=True), exc)

    async def claim(self, key: str, owner: str, lease: float) -> Claim:
        """:meth:`Ledger.claim <amqpjobs.runtime.ledger.Ledger.claim>`, after paying an owed release on ``key``.

        A key whose done-mark is owed answers ``DONE`` here, without the ledger.

        Raises:
            LedgerUnavailableError: (or the ledger's other errors) paying or claiming failed.
        """
        debt = self._owed.get(key)
        if debt is not None and debt.done:
            return Claim.DONE
        if debt is not None:
            await self._pay(key)
        return await self.ledger.claim(key, owner, lease)

    def _owe(self, key: str, debt: _Debt, exc: BaseException) -> None:
        self._owed[key] = debt
        if debt.done:
            log.warning("writing the done-mark of job id %s failed (%s); the run succeeded: written as soon as the "
                        "ledger answers", key, one_line(exc))  # fmt: skip
        else:
            log.warning("releasing the claim on job id %s failed (%s); released as soon as the ledger answers",
                        key, one_line(exc))  # fmt: skip
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._keep_paying())

    async def _pay(self, key: str) -> None:
        """Pay the write owed on ``key`` (or drop a release whose lease ran out); raises the ledger's error."""
        debt = self._owed.get(key)
        if debt is None:
            return
        now = time.monotonic()
        if now >= debt.expires:
            if self._owed.get(key) is debt:
                del self._owed[key]
                log.info("the claim on job id %s expired with its lease before the ledger answered", key)
            return
        if debt.done:
            await self.ledger.done(key, debt.owner)
        else:
            await self.ledger.release(key, debt.owner)
        if self._owed.get(key) is debt:  # not paid meanwhile (the retry's claim and a round at once)
            del self._owed[key]
            what = "wrote the done-mark of" if debt.done else "released the claim on"
            log.info("%s job id %s after %.1fs owed", what, key, time.monotonic() - debt.since)

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
        releases = [key for key, debt in self._owed.items() if not debt.done]
        dones = [key for key, debt in self._owed.items() if debt.done]
        if releases:
            log.warning("%d claim(s) could not be released (the ledger is away): job id(s) %s; each waits for its "
                        "lease to run out", len(releases), ", ".join(releases))  # fmt: skip
        if dones:
            log.warning("%d done-mark(s) could not be written (the ledger is away): job id(s) %s; each claim waits "
                        "for its lease to run out, then a redelivery or replay runs the job again",
                        len(dones), ", ".join(dones))  # fmt: skip
        self._owed.clear()
