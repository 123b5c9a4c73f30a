"""A rate-limited job's token emitter: one worker process across the app mints its tokens (README "Rate limits").

Each worker process tries the job's emitter lock (an exclusive queue,
:mod:`amqpjobs.wire.lock`) every :data:`TAKEOVER_EVERY` seconds; the holder mints a token
every ``period / count`` seconds on absolute times (:mod:`amqpjobs.jobs.rate`), and carries
its rate in the lock's arguments. A process that does not hold it looks at the holder's rate
every :data:`MINTER_LOOK_EVERY` seconds and warns once per minter (and its rate) at another rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from amqpjobs.errors import AmqpJobsError, BusyError
from amqpjobs.jobs.rate import first_tick, next_tick, tick_time, token_expiration
from amqpjobs.printable import logfmt_value
from amqpjobs.runtime.logs import field_value
from amqpjobs.runtime.rate_rooms import Room
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.lock import LockHolder, exclusive_lock, lock_holder
from amqpjobs.wire.settings import BrokerSettings
from amqpjobs.wire.tokens import TokenMinter

if TYPE_CHECKING:
    from amqpjobs.runtime.metrics import WorkerMetrics

log = logging.getLogger("amqpjobs.worker")

#: Seconds between two tries at a job's emitter lock by a process that does not hold it.
TAKEOVER_EVERY = 1.0
#: Seconds between a non-minting worker's looks at the minter's rate (management API).
MINTER_LOOK_EVERY = 60.0


class TokenEmitter:
    """The emitter candidate of each rate-limited job of a worker process (:meth:`run` one task per job).

    Args:
        publishing: The worker's publishing connection (the lock and the tokens).
        settings: Broker settings.
        stop: The worker's stop event.
        metrics: Where to count (or None).
        declare_again: Declares a job's rate queues again, ``(room, how found)`` (a token came back).
    """

    def __init__(
        self,
        publishing: Connection,
        settings: BrokerSettings,
        stop: asyncio.Event,
        metrics: WorkerMetrics | None,
        declare_again: Callable[[Room, str], Awaitable[None]],
    ) -> None:
        self._publishing = publishing
        self._settings = settings
        self._stop = stop
        self._metrics = metrics
        self.declare_again = declare_again
        self._host = socket.gethostname()
        self._pid = os.getpid()

    async def run(self, room: Room) -> None:
        """Try the job's emitter lock every :data:`TAKEOVER_EVERY` seconds; while held, mint its tokens.

        Runs until the worker stops: a lost connection, a refusal or any other failure only
        costs the try (it was the one candidate of this process: review 16 saw a connection
        still down at the next try end it with aio-pika's ``RuntimeError``, and its job's
        tokens with it).
        """
        what = f"the rate-limit tokens of job {room.job!r}"
        while not self._stop.is_set():
            holder = LockHolder(f"token emitter of job {room.job} at {room.rate}", self._host, self._pid,
                                datetime.now(UTC), (("rate", str(room.rate)),))  # fmt: skip
            try:
                async with exclusive_lock(
                    self._publishing, self._settings, room.names.emitter, holder, what, look_up=False
                ) as lock:
                    log.info("job=%s: this worker (pid %d on %s) now mints its tokens, %s", field_value(room.job),
                             self._pid, self._host, room.rate)  # fmt: skip
                    await self._mint(room, lambda: lock.held)
                    if not self._stop.is_set():
                        log.warning("job=%s: stopped minting its tokens (connection lost); another worker takes over",
                                    field_value(room.job))  # fmt: skip
            except BusyError:  # another process mints them: at our rate? (looked at now and then)
                if time.monotonic() >= room.look_at_minter:
                    room.look_at_minter = time.monotonic() + MINTER_LOOK_EVERY
                    await self._compare_rates(room)
            except AmqpJobsError as exc:
                log.debug("job %s: emitter lock not taken (%s)", field_value(room.job), exc)
            except Exception as exc:  # one failure unforeseen here must not end the job's minting for good
                log.warning("job=%s: trying its emitter lock failed (%s: %s); trying again in %gs",
                            field_value(room.job), type(exc).__name__, exc, TAKEOVER_EVERY, exc_info=True)  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), TAKEOVER_EVERY)

    async def _compare_rates(self, room: Room) -> None:
        """Warn when the job's minter mints at another rate than this worker's: once per minter and rate.

        A minter is its lock's holder (host, pid, since; its rate rides along), so a take-over by
        another process at another rate is said again, even at a rate said before.
        """
        _, holder = await lock_holder(self._settings, room.names.emitter)
        theirs = None if holder is None else holder.detail("rate")
        if holder is None or theirs is None or theirs == str(room.rate) or holder in room.minters_warned:
            return
        room.minters_warned.add(holder)
        log.warning(
            "job=%s: its tokens are minted at %s by %s, not at this worker's %s: the minter's rate applies until "
            "another worker takes over minting (README \"Rate limits\": changing a rate)", field_value(room.job),
            logfmt_value(theirs), holder, room.rate,
        )  # fmt: skip

    async def _mint(self, room: Room, held: Callable[[], bool]) -> None:
        """Mint tokens on the rate's grid while ``held()`` (the lock) and the worker runs."""
        minter = await TokenMinter.open(self._publishing, room.names.tokens)
        gauge = None if self._metrics is None else self._metrics.rate_emitter.labels(room.job)
        minted = None if self._metrics is None else self._metrics.rate_tokens.labels(room.job)
        if gauge is not None:
            gauge.set(1)
        rate = room.rate
        k = first_tick(rate, time.time())
        try:
            while held() and minter.open_ and not self._stop.is_set():
                delay = tick_time(rate, k) - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                expires = token_expiration(rate, k, time.time())
                if minter.returned:  # the broker had nowhere to put a token: its queue was deleted
                    minter.returned = False
                    await self.declare_again(room, "a token had no queue to go to")
                if expires >= 0.001:
                    await minter.mint(k, expires)
                    if minted is not None:
                        minted.inc()
                k = next_tick(rate, k, time.time())
        except AmqpJobsError as exc:
            log.warning("job=%s: minting tokens failed (%s)", field_value(room.job), exc)
        finally:
            if gauge is not None:
                gauge.set(0)
            await minter.close()
