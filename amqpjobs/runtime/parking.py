"""Taking chosen messages out of a quarantine queue: park them, or delete them (a filtered purge).

Parking moves the quarantined jobs an operator knows to be lost causes to the job
queue's parked queue (``<job queue>.parked``, declared by the topology): ``status``
counts them but stays healthy, and ``quarantine list/show/replay/purge`` take the parked
queue like a quarantine queue. A park move is the replay's: publish the copy (every
header and property as received, :mod:`amqpjobs.wire.copies`, evidence kept:
:func:`~amqpjobs.jobs.quarantine.park_headers`) with a publisher confirm and
``mandatory``, then ack the quarantined original. Killed at any point, every message is
in quarantine or parked; only the one in flight can be in both.

Both hold the queue's mover lock (:func:`amqpjobs.runtime.quarantine.mover_lock`), so
they never run beside a replay of the same queue. Messages that do not match are held
unacked until the end, then returned to the queue in their place.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from amqpjobs.errors import (
    AmqpJobsError,
    BrokerBlockedError,
    BrokerError,
    ConfigurationError,
    MessageTooLargeError,
    NotFoundError,
    PublishError,
    UnroutableError,
)
from amqpjobs.jobs import envelope
from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.payload_refs import PayloadRef
from amqpjobs.jobs.replay_plan import in_flight_note, stopped_by_alarm
from amqpjobs.jobs.results import StateRecord
from amqpjobs.runtime.payloads import PayloadStore, open_store, referenced, retire
from amqpjobs.runtime.quarantine import (
    HELD_COPY_WAIT,
    INTERRUPTED,
    browse,
    mover_lock,
    publishing_session,
    resolve_quarantine_queue,
    session,
)
from amqpjobs.runtime.results import ResultsStore, record_quietly
from amqpjobs.topology.naming import parked_queue_name, parse_queue_name, quarantine_queue_name
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.alarms import blocked_by, refuse_while_blocked
from amqpjobs.wire.browse import QueueBrowser, probe_queue
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.publish import ConfirmedPublisher
from amqpjobs.wire.reset import reset
from amqpjobs.wire.settings import BrokerSettings


@dataclass
class TakeReport:
    """What a park or filtered purge did.

    Attributes:
        queue: The queue taken from.
        taken: Messages parked (or deleted).
        kept: Messages looked at that did not match (still in ``queue``).
        left: Messages in ``queue`` at the end.
        target: The parked queue ("" for a purge).
        job_ids: The job id of each message taken, in queue order (its key, a content hash, without one).
        not_moved: One line for each matching message that could not be parked (``job 'mail' id
            'q-1': its copy would be too large: ...``); it stays in ``queue``.
        payloads_marked: Stored payloads of the deleted messages given their done mark (a purge
            with the app's payload store; the sweep deletes them after the store's grace).
        payloads_spared: Stored payloads of deleted messages left as they are: a message left in
            the queue or its quarantine/parked sibling still names them.
        payloads_unmarked: Stored payloads whose mark failed (the store erred; logged): they stay.
        payloads_gone: Stored payloads of deleted messages that were gone already (nothing to mark).

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


async def _take(
    connection: Connection,
    settings: BrokerSettings,
    queue: str,
    selection: q.Selection,
    action: str,
    settle: Callable[[Delivery, q.QuarantinedJob], Awaitable[bool]],
    report: TakeReport,
    census: Census,
) -> None:
    """Under the mover lock, call ``settle`` on each matching message (it acks it, or returns False); hold the rest.

    ``census`` gets the queue, its depth and what every looked-at message holds.
    """
    async with mover_lock(connection, settings, queue, action) as lock:
        _, depth = await resolve_quarantine_queue(connection, queue)  # as the previous mover left it
        census.queue, census.depth = queue, depth
        browser = await QueueBrowser.open(connection)
        try:
            async for delivery in browser.deliveries(queue, depth):
                item = q.describe(delivery.headers, delivery.message_id, delivery.type, delivery.body)
                if not census.matches(item, selection):
                    report.kept += 1
                    continue
                try:
                    lock.check()
                except BrokerError as exc:  # its connection dropped (a broker restart): say what moved before it
                    raise _interrupted(action, queue, report, exc) from exc
                # cancelled (Ctrl-C, SIGTERM) mid-move, the move finishes first: a copy confirmed in the
                # parked queue is acked, so no message is left in both places
                moving = asyncio.ensure_future(settle(delivery, item))
                job_id = delivery.message_id or item.key  # its job id, else its content hash
                try:
                    taken = await asyncio.shield(moving)
                except asyncio.CancelledError:
                    with contextlib.suppress(Exception):
                        taken = await _settled(moving)
                        if taken:
                            report.taken += 1
                            report.job_ids.append(job_id)
                    raise
                except _Cut as cut:  # its copy is confirmed, its ack failed: taken (maybe still in the queue too)
                    report.taken += 1
                    report.job_ids.append(job_id)
                    raise _interrupted(action, queue, report, cut.cause) from cut.cause
                if taken:
                    report.taken += 1
                    report.job_ids.append(job_id)
        except AmqpJobsError as exc:
            if type(exc) is PublishError:  # the channel or connection closed under a copy's publish
                raise _interrupted(action, queue, report, exc) from exc
            raise
        except INTERRUPTED as exc:
            raise _interrupted(action, queue, report, exc) from exc
        finally:
            await browser.close_quietly()  # the messages kept return to the queue, in their place


class _Cut(Exception):
    """A move whose copy is confirmed but whose ack failed (``cause``): it counts as taken."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


async def _settled(moving: Awaitable[bool]) -> bool:
    """Whether the move took its message: True also for one cut off after its copy was confirmed (:class:`_Cut`)."""
    try:
        return await moving
    except _Cut:
        return True


def _interrupted(action: str, queue: str, report: TakeReport, exc: BaseException) -> BrokerError:
    """The error of a park or purge the broker cut short, saying how many were taken before it."""
    done = {"park": "parked", "purge": "deleted"}.get(action, "taken")
    in_flight = f" ({in_flight_note(1)})" if action == "park" else ""  # a park moves one at a time
    return BrokerError(f"{action} of {queue!r} interrupted after {report.taken} {done}{in_flight}: {exc}")


async def park(
    settings: BrokerSettings,
    name: str,
    selection: q.Selection | None = None,
    census: Census | None = None,
    *,
    report: TakeReport | None = None,
    results: ResultsStore | None = None,
) -> TakeReport:
    """Move the messages of quarantine queue ``name`` that match ``selection`` to its job queue's parked queue.

    Args:
        settings: Broker settings.
        name: A quarantine queue, or the job queue whose quarantine it is.
        selection: Filters (None: every message).
        census: Filled with what every looked-at message holds (to show what is there
            when the filters matched none).
        report: Filled as the run goes (and returned): a caller keeps it to report a run
            cut short (Ctrl-C, SIGTERM). Cancelled, the park settles the move under way,
            returns the held messages and sets ``left`` before the cancellation propagates.
        results: The app's results store: each parked job is recorded ``parked`` (with its
            quarantine reason) once moved, best effort (:func:`~amqpjobs.runtime.results.record_quietly`).

    Raises:
        ConfigurationError: no such quarantine queue, ``name`` is a parked queue already, or
            the parked queue does not exist (apply the topology); nothing was moved.
        BusyError: another mover (a replay, a purge ...) works on the queue; nothing was moved.
        BrokerError, BrokerUnavailableError: the broker failed; nothing unconfirmed was acked.

    """
    selection = selection or q.Selection()
    async with session(settings) as connection, AsyncExitStack() as stack:
        queue, depth = await resolve_quarantine_queue(connection, name)
        parsed = parse_queue_name(queue)
        if parsed.kind == "parked":
            raise ConfigurationError(f"{queue!r} is a parked queue already: park takes from a quarantine queue")
        target = parked_queue_name(parsed.job_queue)
        try:
            await probe_queue(connection, target)
        except NotFoundError:
            raise ConfigurationError(
                f"parked queue {target!r} does not exist: apply the topology (amqpjobs topology apply) to declare "
                "it; nothing was moved"
            ) from None
        if depth:  # a copy's publish would be held, the park with it, without a word
            await refuse_while_blocked(settings, f"park of {queue!r}")
        report = report if report is not None else TakeReport(queue)
        report.queue, report.target = queue, target
        publishing = await stack.enter_async_context(publishing_session(settings, "park"))
        publisher = ConfirmedPublisher(publishing, give_up_blocked=HELD_COPY_WAIT)
        parked_at = envelope.iso_utc()
        blocked: BrokerBlockedError | None = None  # its copy held by a resource alarm stopped the park

        async def move(delivery: Delivery, item: q.QuarantinedJob) -> bool:
            job_id = delivery.message_id or item.job_id or ""
            at = time.time()
            copy = delivery.copy(
                q.park_headers(delivery.headers, item, parked_at, timestamp=delivery.timestamp), job_id
            )
            try:
                await publisher.check("", target, copy)  # a copy can't be sent: it stays, and the others go
                await publisher.publish("", target, copy)
            except MessageTooLargeError as exc:
                report.not_moved.append(item.too_large(exc.reason or str(exc)))
                return False
            except UnroutableError:
                raise ConfigurationError(
                    f"parked queue {target!r} went missing; {report.taken} parked before it (if it was deleted, "
                    f"they went with it), the rest stay in {queue}, the one in hand too: declare it again "
                    "(amqpjobs topology apply), then park again"
                ) from None
            # the copy is confirmed: it is parked, whatever becomes of the ack (a failed one leaves the
            # original in quarantine too, a duplicate, never a loss)
            moved.append(StateRecord(job_id, item.job, "parked", item.attempts, at, detail=item.reason,
                                     error=f"{item.error_type}: {item.error_message}" if item.error_type else "",
                                     where=target))  # fmt: skip
            try:
                await delivery.ack()
            except INTERRUPTED as exc:
                raise _Cut(exc) from exc
            return True

        moved: list[StateRecord] = []
        try:
            await _take(connection, settings, queue, selection, "park", move, report, census or Census())
        except BrokerBlockedError as exc:  # said once its held copy is dropped and what stays is counted
            blocked = exc
        except asyncio.CancelledError:  # the held messages are back: count them for the caller's summary
            with contextlib.suppress(Exception):
                _, report.left = await resolve_quarantine_queue(connection, queue)
            raise
        finally:
            if (
                blocked is not None or blocked_by(publishing) is not None
            ):  # its copy held unread is dropped: the original stays
                await reset(publishing)
            await publisher.close()
            await record_quietly(results, moved)
        _, report.left = await resolve_quarantine_queue(connection, queue)
    if blocked is not None:  # one copy at a time: the one held
        raise BrokerBlockedError(
            stopped_by_alarm("park", "parked", queue, report.taken, report.left, blocked.alarm, 1), alarm=blocked.alarm
        ) from blocked
    return report


async def purge_matching(
    settings: BrokerSettings,
    name: str,
    selection: q.Selection,
    census: Census | None = None,
    payloads: PayloadStore | None = None,
    *,
    report: TakeReport | None = None,
) -> TakeReport:
    """Delete the messages of quarantine (or parked) queue ``name`` that match ``selection``; keep the rest.

    ``census`` is filled as :func:`park` fills it. ``payloads``: the app's payload store: the
    stored payload of each deleted message gets its done mark once the purge is over, so the
    workers' sweep deletes it after the store's grace; a payload that a message left in this
    queue or its sibling (the job queue's quarantine or parked queue) still names is left as it
    is (README "Large payloads").
    ``report``: filled as the run goes (and returned), as :func:`park`'s.

    Raises:
        ConfigurationError: no such quarantine or parked queue.
        BusyError: a mover (say, a replay) works on the queue; nothing was deleted.
        PayloadStoreError: ``payloads`` can't be opened; nothing was deleted.

    """
    if payloads is not None:  # before any message goes: a purged message's payload would never be marked
        await open_store(payloads, "nothing was purged")
    async with session(settings) as connection:
        queue, _ = await resolve_quarantine_queue(connection, name)
        report = report if report is not None else TakeReport(queue)
        report.queue = queue

        purged: set[PayloadRef] = set()

        async def delete(delivery: Delivery, item: q.QuarantinedJob) -> bool:
            await delivery.ack()
            if payloads is not None and (ref := referenced(payloads, delivery.headers)) is not None:
                purged.add(ref)
            return True

        await _take(connection, settings, queue, selection, "purge", delete, report, census or Census())
        _, report.left = await resolve_quarantine_queue(connection, queue)
    if payloads is not None and purged:
        held = await _still_named(settings, queue, payloads)
        for ref in sorted(purged - held, key=str):
            marked = await retire(payloads, ref)
            if marked is None:
                report.payloads_gone += 1
            elif marked:
                report.payloads_marked += 1
            else:
                report.payloads_unmarked += 1
        report.payloads_spared = len(purged & held)
    return report


async def _still_named(settings: BrokerSettings, queue: str, payloads: PayloadStore) -> set[PayloadRef]:
    """The references to ``payloads`` that messages in ``queue`` and its quarantine/parked sibling hold."""
    parsed = parse_queue_name(queue)
    sibling = (parked_queue_name if parsed.kind == "quarantine" else quarantine_queue_name)(parsed.job_queue)
    held: set[PayloadRef] = set()
    for name in (queue, sibling):
        try:
            _, messages = await browse(settings, name, keep_bodies=0)  # the references are headers
        except ConfigurationError:  # no such queue
            continue
        held.update(ref for m in messages if (ref := referenced(payloads, m.delivery.headers)) is not None)
    return held
