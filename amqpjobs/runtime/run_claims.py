"""An idempotent job's ledger claim as its run waits for it, and the ledger writes owed when the ledger failed.

A claim can wait long (SQLite's write lock, a row lock, a slow database); a stopping worker
does not wait for it but releases it once it comes (README "Idempotency"). Part of the worker's
one-delivery path (:mod:`.runs`); its state is the worker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from amqpjobs.runtime.ledger import Claim, Ledger, claim_waiting
from amqpjobs.runtime.ledger_owed import OwedWrites


class RunClaims:
    """Ledger claims and owed writes, for :class:`~amqpjobs.runtime.runs.HandlerRuns` (its state is the worker's)."""

    _stop: asyncio.Event
    _owed: OwedWrites | None = None  # ledger writes that failed: releases, done-marks (made at the first)
    #: Claims a stopping worker gave up waiting for, released once they come (it waits for them up to its grace).
    _late_claims: set[asyncio.Task[None]]

    async def _claim(self, owed: OwedWrites, key: str, owner: str, lease: float, ordinary: bool) -> Claim | None:
        """:func:`claim_waiting` for ``key``; None when the worker stops first (``ordinary`` runs only).

        A claim can wait long: SQLite's write lock held by another run's ``ctx.transaction()``,
        a row lock, a slow database. The stop does not wait for it: the delivery is handed
        back unstarted, and a claim that still comes is released (the worker waits for it up to its grace).
        """
        claiming = asyncio.ensure_future(claim_waiting(owed, key, owner, lease, stop=self._stop))
        if not ordinary:
            return await claiming
        stopping = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({claiming, stopping}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            claiming.cancel()
            raise
        finally:
            stopping.cancel()
        if claiming.done():
            return claiming.result()

        async def give_up() -> None:  # the stopping worker waits for it (up to its grace) before closing
            with contextlib.suppress(Exception):
                if await claiming is Claim.CLAIMED:
                    await owed.release(key, owner, time.monotonic() + lease)

        task = asyncio.get_running_loop().create_task(give_up())
        self._late_claims.add(task)
        task.add_done_callback(self._late_claims.discard)
        return None

    async def _settle_late_claims(self, until: float) -> None:
        """Wait for the claims given up at the stop (:meth:`_claim`) until ``until`` (monotonic); cancel the rest."""
        if late := set(self._late_claims):
            _, left = await asyncio.wait(late, timeout=max(0.01, until - time.monotonic()))
            for task in left:
                task.cancel()

    def _owed_of(self, ledger: Ledger) -> OwedWrites:
        """The worker's owed writes to ``ledger`` (made on first use, again when the app's ledger changed)."""
        if self._owed is None or self._owed.ledger is not ledger:
            self._owed = OwedWrites(ledger)
        return self._owed

    async def _settle_owed(self) -> None:
        """At stop, after the last run: one more try to pay the owed writes (what is left waits for its lease)."""
        if self._owed is not None:
            await self._owed.close()
