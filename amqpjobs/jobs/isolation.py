"""Ordinary job runs share a worker; a suspect runs alone (:mod:`amqpjobs.jobs.crash`).

A suspect is a job whose earlier start ended without an outcome: it may be the one that
brought a worker down. Run beside other jobs, a second crash would charge them too; run
alone, a crash is its own. :class:`IsolationGate` is the per-process rule:

* an ordinary start enters at once unless a suspect waits or runs; then it is refused and
  the worker hands the delivery back unstarted (it also stops consuming meanwhile, so the
  suspect runs with nothing else held: a crash is charged to it alone);
* one suspect at a time: it waits until the ordinary runs already started have finished
  (no new ones start), runs, and lets ordinary starts in again; a second suspect arriving
  meanwhile is refused (the worker hands it back unstarted) rather than held, so a
  crashing suspect is never charged to another;
* a redelivery's registration (a copy to the suspects queue, then the ack) makes ordinary
  starts wait until it is done, a few ms: a job that killed the process in between would
  leave the registered job a second life (the original redelivered beside its copy). A
  restarted worker gets the dead one's redeliveries and the queue's next jobs at once, and
  the next job may be the one that killed it.
"""

from __future__ import annotations

import asyncio


class IsolationGate:
    """Counts ordinary runs in a process and lets one suspect at a time run with none beside it."""

    def __init__(self) -> None:
        self._running = 0
        self._suspect = False  # a suspect waits or runs
        self._idle = asyncio.Event()
        self._idle.set()
        self._registering = 0  # registrations under way (copy, then ack)
        self._registered = asyncio.Event()  # set while none is
        self._registered.set()

    @property
    def suspect_pending(self) -> bool:
        """Whether a suspect waits or runs (ordinary starts and other suspects are refused)."""
        return self._suspect

    @property
    def running(self) -> int:
        """Ordinary runs in progress."""
        return self._running

    def try_enter(self) -> bool:
        """Start an ordinary run: False (refused) while a suspect waits or runs.

        Pair a True with :meth:`leave`.
        """
        if self._suspect:
            return False
        self._running += 1
        self._idle.clear()
        return True

    def leave(self) -> None:
        """An ordinary run ended."""
        self._running -= 1
        if self._running == 0:
            self._idle.set()

    def registration_begins(self) -> None:
        """A registration's copy is about to be published: ordinary starts wait (:meth:`until_registered`).

        Pair with :meth:`registration_ends` once its ack is sent (or it failed).
        """
        self._registering += 1
        self._registered.clear()

    def registration_ends(self) -> None:
        """A registration is done (acked, or settled otherwise)."""
        self._registering -= 1
        if self._registering == 0:
            self._registered.set()

    async def until_registered(self) -> None:
        """Return once no registration is under way (at once when none is)."""
        if self._registering:
            await self._registered.wait()

    def try_alone(self) -> bool:
        """Claim the process for a suspect: False when another suspect waits or runs.

        From now on ordinary starts are refused; wait for :meth:`idle`, run the suspect,
        then :meth:`release_alone`.
        """
        if self._suspect:
            return False
        self._suspect = True
        return True

    async def idle(self) -> None:
        """Wait until no ordinary run is in progress."""
        await self._idle.wait()

    def release_alone(self) -> None:
        """The suspect ended: ordinary starts are let in again."""
        self._suspect = False
