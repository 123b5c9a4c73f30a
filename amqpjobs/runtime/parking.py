"""Taking chosen messages out of a quarantine queue: park them (and unpark them), or delete them (a filtered purge).

Parking moves the quarantined jobs an operator knows to be lost causes to the job
queue's parked queue (``<job queue>.parked``, declared by the topology): ``status``
counts them but stays healthy, and ``quarantine list/show/replay/purge`` take the parked
queue like a quarantine queue. A park move is the replay's: publish the copy (every
header and property as received, :mod:`amqpjobs.wire.copies`, evidence kept:
:func:`~amqpjobs.jobs.quarantine.park_headers`) with a publisher confirm and
``mandatory``, then ack the quarantined original. Killed at any point, every message is
in quarantine or parked; only the one in flight can be in both. Unparking (:func:`unpark`)
is the same move the other way, parked jobs back to quarantine without running them.

Each holds the queue's mover lock (:func:`amqpjobs.runtime.quarantine.mover_lock`), so
they never run beside a replay of the same queue; a park or unpark holds its target's
too. Messages that do not match are held unacked until the end, then returned to the
queue in their place (:func:`amqpjobs.runtime.taking.take`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from amqpjobs.errors import (
    BrokerBlockedError,
    ConfigurationError,
    MessageTooLargeError,
    NotFoundError,
    UnroutableError,
)
from amqpjobs.jobs import envelope
from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.holding_moves import DONE, MoveOptions, unpark_headers, unpark_source
from amqpjobs.jobs.payload_refs import PayloadRef
from amqpjobs.jobs.replay_plan import stopped_by_alarm
from amqpjobs.jobs.results import StateRecord
from amqpjobs.runtime.payloads import PayloadStore, open_store, referenced, retire
from amqpjobs.runtime.quarantine import (
    HELD_COPY_WAIT,
    INTERRUPTED,
    browse,
    publishing_session,
    resolve_quarantine_queue,
    session,
)
from amqpjobs.runtime.results import ResultsStore, record_quietly
from amqpjobs.runtime.taking import Cut, TakeReport, take
from amqpjobs.topology.naming import parked_queue_name, parse_queue_name, quarantine_queue_name
from amqpjobs.wire.abc import Connection, Received
from amqpjobs.wire.alarms import blocked_by, refuse_while_blocked
from amqpjobs.wire.browse import probe_queue
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.publish import ConfirmedPublisher
from amqpjobs.wire.reset import reset
from amqpjobs.wire.settings import BrokerSettings

__all__ = ["TakeReport", "park", "purge_matching", "unpark"]


async def park(
    settings: BrokerSettings,
    name: str,
    selection: q.Selection | None = None,
    census: Census | None = None,
    *,
    report: TakeReport | None = None,
    results: ResultsStore | None = None,
    options: MoveOptions | None = None,
) -> TakeReport:
    """Move the messages of quarantine queue ``name`` that match ``selection`` to its job queue's parked queue.

    Args:
        settings: Broker settings.
        name: A quarantine queue, or the job queue whose quarantine it is.
        selection: Filters (None: every message; ``options.selection`` when ``options`` is given).
        census: Filled with what every looked-at message holds (to show what is there
            when the filters matched none).
        report: Filled as the run goes (and returned): a caller keeps it to report a run
            cut short (Ctrl-C, SIGTERM). Cancelled, the park settles the move under way,
            returns the held messages and sets ``left`` before the cancellation propagates.
        results: The app's results store: each parked job is recorded ``parked`` (with its
            quarantine reason) once moved, best effort (:func:`~amqpjobs.runtime.results.record_quietly`).
        options: ``--limit``, ``--rate`` (moves per second), ``--dry-run``
            (:class:`~amqpjobs.jobs.holding_moves.MoveOptions`).

    Raises:
        ConfigurationError: no such quarantine queue, ``name`` is a parked queue already, or
            the parked queue does not exist (apply the topology); nothing was moved.
        BusyError: another mover (a replay, a purge ...) works on the queue or on its parked
            queue; nothing was moved.
        BrokerError, BrokerUnavailableError: the broker failed; nothing unconfirmed was acked.

    """
    options = options or MoveOptions(selection=selection or q.Selection())
    async with session(settings) as connection:
        queue, _ = await resolve_quarantine_queue(connection, name)
        parsed = parse_queue_name(queue)
        if parsed.kind == "parked":
            raise ConfigurationError(f"{queue!r} is a parked queue already: park takes from a quarantine queue")
        target = parked_queue_name(parsed.job_queue)
        await _check_target(connection, target, "parked queue")

        def park_copy(delivery: Received, item: q.QuarantinedJob, at: str) -> dict[str, Any]:
            return q.park_headers(delivery.headers, item, at, timestamp=delivery.timestamp)

        move = _Move("park", queue, target, park_copy, "parked", "parked queue")
        return await _move(settings, connection, move, options, census, report, results)


async def unpark(
    settings: BrokerSettings,
    name: str,
    options: MoveOptions | None = None,
    census: Census | None = None,
    *,
    report: TakeReport | None = None,
    results: ResultsStore | None = None,
) -> TakeReport:
    """Move the messages of parked queue ``name`` that match ``options`` back to the job queue's quarantine queue.

    The lossless way back from a park: nothing runs the jobs. Each copy keeps every header and
    property as parked (the evidence) but ``amqpjobs-parked-at``
    (:func:`~amqpjobs.jobs.holding_moves.unpark_headers`), and goes with a publisher confirm
    before its original is acked, one at a time, in the parked queue's order, holding the mover
    locks of both queues: the move of :func:`park`, the other way.

    Args:
        settings: Broker settings.
        name: A parked queue, or the job queue whose parked queue it is.
        options: Filters, ``--limit``, ``--rate`` (moves per second), ``--dry-run`` (None: every message).
        census: As :func:`park`'s.
        report: As :func:`park`'s.
        results: The app's results store: each unparked job is recorded ``quarantined`` again
            (best effort, :func:`~amqpjobs.runtime.results.record_quietly`).

    Raises:
        ConfigurationError: ``name`` is a quarantine queue, no such parked queue, or the
            quarantine queue does not exist (apply the topology); nothing was moved.
        BusyError: another mover works on the parked or the quarantine queue; nothing was moved.
        BrokerError, BrokerUnavailableError: the broker failed; nothing unconfirmed was acked.

    """
    options = options or MoveOptions()
    source = unpark_source(name)
    async with session(settings) as connection:
        try:
            queue, _ = await resolve_quarantine_queue(connection, source)
        except ConfigurationError:
            raise ConfigurationError(
                f"no parked queue {source!r} in this vhost: nothing to unpark (check the name: a parked queue is "
                "<job queue>.parked, declared by amqpjobs topology apply)"
            ) from None
        target = quarantine_queue_name(parse_queue_name(queue).job_queue)
        await _check_target(connection, target, "quarantine queue")

        def unpark_copy(delivery: Received, item: q.QuarantinedJob, at: str) -> dict[str, Any]:
            return unpark_headers(delivery.headers, item, timestamp=delivery.timestamp)

        move = _Move("unpark", queue, target, unpark_copy, "quarantined", "quarantine queue")
        return await _move(settings, connection, move, options, census, report, results)


async def _check_target(connection: Connection, target: str, what: str) -> None:
    """Refuse a move whose target queue does not exist (a publish there would come back unroutable)."""
    try:
        await probe_queue(connection, target)
    except NotFoundError:
        raise ConfigurationError(
            f"{what} {target!r} does not exist: apply the topology (amqpjobs topology apply) to declare "
            "it; nothing was moved"
        ) from None


@dataclass(frozen=True)
class _Move:
    """One kind of move between holding queues: ``action`` from ``queue`` to ``target``, copies by ``headers``."""

    action: str
    queue: str
    target: str
    headers: Callable[[Received, q.QuarantinedJob, str], dict[str, Any]]
    state: str  # recorded in the results store for each job moved
    what: str  # what the target is: "parked queue", "quarantine queue"


async def _move(
    settings: BrokerSettings,
    connection: Connection,
    how: _Move,
    options: MoveOptions,
    census: Census | None,
    report: TakeReport | None,
    results: ResultsStore | None,
) -> TakeReport:
    """Publish a copy of each matching message of ``how.queue`` to ``how.target`` (confirmed), then ack it."""
    queue, target, action = how.queue, how.target, how.action
    done = DONE[action]
    _, depth = await resolve_quarantine_queue(connection, queue)
    if depth and not options.dry_run:  # a copy's publish would be held, the move with it, without a word
        await refuse_while_blocked(settings, f"{action} of {queue!r}")
    report = report if report is not None else TakeReport(queue)
    report.queue, report.target, report.dry_run = queue, target, options.dry_run
    async with publishing_session(settings, action) as publishing:
        publisher = ConfirmedPublisher(publishing, give_up_blocked=HELD_COPY_WAIT)
        moved_at = envelope.iso_utc()
        blocked: BrokerBlockedError | None = None  # its copy held by a resource alarm stopped the move

        async def move(delivery: Delivery, item: q.QuarantinedJob) -> bool:
            job_id = delivery.message_id or item.job_id or ""
            at = time.time()
            copy = delivery.copy(how.headers(delivery, item, moved_at), job_id)
            try:
                await publisher.check("", target, copy)  # a copy can't be sent: it stays, and the others go
                if options.dry_run:
                    return True
                await publisher.publish("", target, copy)
            except MessageTooLargeError as exc:
                report.not_moved.append(item.too_large(exc.reason or str(exc)))
                return False
            except UnroutableError:
                raise ConfigurationError(
                    f"{how.what} {target!r} went missing; {report.taken} {done} before it (if it was deleted, they "
                    f"went with it), the rest stay in {queue}, the one in hand too: declare it again (amqpjobs "
                    f"topology apply), then {action} again"
                ) from None
            # the copy is confirmed: it is moved, whatever becomes of the ack (a failed one leaves the
            # original where it was too, a duplicate, never a loss)
            moved.append(StateRecord(job_id, item.job, how.state, item.attempts, at, detail=item.reason,
                                     error=f"{item.error_type}: {item.error_message}" if item.error_type else "",
                                     where=target))  # fmt: skip
            try:
                await delivery.ack()
            except INTERRUPTED as exc:
                raise Cut(exc) from exc
            return True

        moved: list[StateRecord] = []
        try:
            await take(connection, settings, queue, options, action, move, report, census or Census(), target)
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
            stopped_by_alarm(action, done, queue, report.taken, report.left, blocked.alarm, 1), alarm=blocked.alarm
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
    results: ResultsStore | None = None,
    rate: float | None = None,
) -> TakeReport:
    """Delete the messages of quarantine (or parked) queue ``name`` that match ``selection``; keep the rest.

    ``census`` is filled as :func:`park` fills it. ``payloads``: the app's payload store: the
    stored payload of each deleted message gets its done mark once the purge is over, so the
    workers' sweep deletes it after the store's grace; a payload that a message left in this
    queue or its sibling (the job queue's quarantine or parked queue) still names is left as it
    is (README "Large payloads").
    ``report``: filled as the run goes (and returned), as :func:`park`'s.
    ``results``: the app's results store: each deleted job with an id is recorded ``purged`` (its
    quarantine reason and error kept, ``where`` the queue it was deleted from), best effort
    (:func:`~amqpjobs.runtime.results.record_quietly`), also when the run is cut short.
    ``rate``: at most this many deletes per second (None: as fast as the acks go), paced as park's moves
    (:class:`~amqpjobs.jobs.holding_moves.MoveOptions`).

    Raises:
        ConfigurationError: no such quarantine or parked queue; ``rate`` outside replay's bounds.
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
        deleted: list[StateRecord] = []

        async def delete(delivery: Delivery, item: q.QuarantinedJob) -> bool:
            await delivery.ack()
            if payloads is not None and (ref := referenced(payloads, delivery.headers)) is not None:
                purged.add(ref)
            if results is not None and item.job_id:
                deleted.append(
                    StateRecord(
                        item.job_id,
                        item.job,
                        "purged",
                        item.attempts,
                        time.time(),
                        detail=item.reason,
                        where=queue,
                        error=f"{item.error_type}: {item.error_message}" if item.error_type else "",
                    )
                )
            return True

        try:
            await take(connection, settings, queue, MoveOptions(selection, rate=rate), "purge", delete, report,
                       census or Census())  # fmt: skip
        finally:
            await record_quietly(results, deleted)
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
