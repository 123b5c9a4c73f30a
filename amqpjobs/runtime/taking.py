"""The one loop every taker of a quarantine or parked queue's messages runs: park, unpark, a filtered purge.

:func:`take` holds the mover lock(s), looks at each message of the queue once (its depth at the
start), hands the ones that match to the taker's ``settle`` (paced, up to a limit) and holds
the rest, returning them in their place at the end. A move under way when the command is
cancelled is finished first (its copy confirmed means its original is acked), and what was
taken before a broker failure is said (:func:`interrupted`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from amqpjobs.errors import AmqpJobsError, BrokerError, PublishError
from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.holding_moves import DONE, MoveOptions
from amqpjobs.jobs.pacing import Pace
from amqpjobs.jobs.replay_plan import in_flight_note
from amqpjobs.printable import printable
from amqpjobs.runtime.quarantine import INTERRUPTED, mover_lock, resolve_quarantine_queue
from amqpjobs.runtime.undeliverable_mend import PastUndeliverable
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.lock import HeldLock
from amqpjobs.wire.settings import BrokerSettings


@dataclass
class TakeReport:
    """What a park, unpark or filtered purge did.

    Attributes:
        queue: The queue taken from.
        taken: Messages parked, unparked (or deleted).
        kept: Messages looked at that did not match (still in ``queue``).
        left: Messages in ``queue`` at the end.
        target: The parked queue (a park), the quarantine queue (an unpark), "" for a purge.
        job_ids: The job id of each message taken, in queue order (its key, a content hash, without one).
        not_moved: One line for each matching message that could not be moved (``job 'mail' id
            'q-1': its copy would be too large: ...``); it stays in ``queue``.
        payloads_marked: Stored payloads of the deleted messages given their done mark (a purge
            with the app's payload store; the sweep deletes them after the store's grace).
        payloads_spared: Stored payloads of deleted messages left as they are: a message left in
            the queue or its quarantine/parked sibling still names them.
        payloads_unmarked: Stored payloads whose mark failed (the store erred; logged): they stay.
        payloads_gone: Stored payloads of deleted messages that were gone already (nothing to mark).
        limit_reached: The ``--limit`` that stopped the run with messages still to look at, else None.
        dry_run: Nothing moved: ``taken`` and ``job_ids`` say what would have.

    """

    queue: str
    taken: int = 0
    kept: int = 0
    left: int = 0
    target: str = ""
    job_ids: list[str] = field(default_factory=list)
    not_moved: list[str] = field(default_factory=list)
    payloads_marked: int = 0
    payloads_spared: int = 0
    payloads_unmarked: int = 0
    payloads_gone: int = 0
    limit_reached: int | None = None
    dry_run: bool = False

    def summary(self, action: str) -> str:
        """The line a park or unpark (``action``) that ended prints, the console's page too.

        ``unparked 4 message(s) from urgent.parked in urgent.quarantine; 3 left in urgent.parked``,
        then ``; stopped at --limit N (the rest were not looked at)`` when a limit stopped it.
        """
        limited = "" if self.limit_reached is None else (
            f"; stopped at --limit {self.limit_reached} (the rest were not looked at)"
        )  # fmt: skip
        return (f"{DONE[action]} {self.taken} message(s) from {printable(self.queue)} in {printable(self.target)}; "
                f"{self.left} left in {printable(self.queue)}{limited}")  # fmt: skip


async def take(
    connection: Connection,
    settings: BrokerSettings,
    queue: str,
    options: MoveOptions,
    action: str,
    settle: Callable[[Delivery, q.QuarantinedJob], Awaitable[bool]],
    report: TakeReport,
    census: Census,
    also_lock: str | None = None,
) -> None:
    """Under the mover lock, call ``settle`` on each matching message (it acks it, or returns False); hold the rest.

    ``options``: the filters, ``--limit`` and ``--rate`` (a dry run's ``settle`` acks nothing).
    ``also_lock``: a second queue whose mover lock is held too (a park's or unpark's target).
    ``census`` gets the queue, its depth and what every looked-at message holds.

    Raises:
        BusyError: another mover holds ``queue``'s (or ``also_lock``'s) lock, named (exit 4).
        ConfigurationError: ``queue`` (nor a quarantine of that job queue) does not exist.
        BrokerError: the connection dropped mid-run; its words say what moved before it
            (:func:`interrupted`).
    """
    async with AsyncExitStack() as locks:
        held: list[HeldLock] = []
        for name in (queue, also_lock) if also_lock else (queue,):
            held.append(await locks.enter_async_context(mover_lock(connection, settings, name, action)))
        _, depth = await resolve_quarantine_queue(connection, queue)  # as the previous mover left it
        census.queue, census.depth = queue, depth
        pace, tried = Pace(options.rate), 0
        # on a connection of its own: a message no 0-9-1 client receives is mended there, the locks stay
        browsed = PastUndeliverable(settings, queue, depth)
        try:
            async for delivery in browsed.deliveries():
                if options.limit is not None and tried >= options.limit:
                    report.limit_reached = options.limit
                    break
                item = q.describe(delivery.headers, delivery.message_id, delivery.type, delivery.body)
                if not census.matches(item, options.selection):
                    report.kept += 1
                    continue
                if not options.dry_run and (wait := pace.wait(time.monotonic())) > 0:
                    await asyncio.sleep(wait)
                tried += 1
                try:
                    for lock in held:
                        lock.check()
                except BrokerError as exc:  # its connection dropped (a broker restart): say what moved before it
                    raise interrupted(action, queue, report, exc) from exc
                # cancelled (Ctrl-C, SIGTERM) mid-move, the move finishes first: a copy confirmed in the
                # target queue is acked, so no message is left in both places
                moving = asyncio.ensure_future(settle(delivery, item))
                job_id = delivery.message_id or item.key  # its job id, else its content hash
                try:
                    taken = await asyncio.shield(moving)
                except asyncio.CancelledError:
                    with contextlib.suppress(Exception):
                        taken = await settled(moving)
                        if taken:
                            report.taken += 1
                            report.job_ids.append(job_id)
                    raise
                except Cut as cut:  # its copy is confirmed, its ack failed: taken (maybe still in the queue too)
                    report.taken += 1
                    report.job_ids.append(job_id)
                    raise interrupted(action, queue, report, cut.cause) from cut.cause
                if taken:
                    report.taken += 1
                    report.job_ids.append(job_id)
        except AmqpJobsError as exc:
            if type(exc) is PublishError:  # the channel or connection closed under a copy's publish
                raise interrupted(action, queue, report, exc) from exc
            raise
        except INTERRUPTED as exc:
            raise interrupted(action, queue, report, exc) from exc
        finally:
            await browsed.close()  # the messages kept return to the queue, in their place (then counted)


class Cut(Exception):
    """A move whose copy is confirmed but whose ack failed (``cause``): it counts as taken."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


async def settled(moving: Awaitable[bool]) -> bool:
    """Whether the move took its message: True also for one cut off after its copy was confirmed (:class:`Cut`)."""
    try:
        return await moving
    except Cut:
        return True


def interrupted(action: str, queue: str, report: TakeReport, exc: BaseException) -> BrokerError:
    """The error of a park or purge the broker cut short, saying how many were taken before it."""
    done = DONE.get(action, "taken")
    in_flight = f" ({in_flight_note(1)})" if action != "purge" else ""  # a park or unpark moves one at a time
    return BrokerError(f"{action} of {queue!r} interrupted after {report.taken} {done}{in_flight}: {exc}")
