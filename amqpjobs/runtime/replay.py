"""Rate-limited replay: quarantined jobs back to their work queues, each with a fresh attempt budget.

A replay move is: publish the copy to the work queue with a publisher confirm, then ack
the quarantined original. Killed at any point, every message is in quarantine or in its
work queue; only the one in flight can be in both. A replay holds the queue's mover lock
(:func:`amqpjobs.runtime.quarantine.mover_lock`) throughout; ``--canary`` is
:mod:`amqpjobs.runtime.canary`. The options and report are pure
(:class:`~amqpjobs.jobs.replay_plan.ReplayOptions`, :class:`~amqpjobs.jobs.replay_plan.ReplayReport`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from amqpjobs.errors import (
    AmqpJobsError,
    BrokerBlockedError,
    BrokerError,
    ConfigurationError,
    MessageTooLargeError,
    NotFoundError,
    UnroutableError,
)
from amqpjobs.jobs import envelope
from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.envelope import OutgoingMessage, tenant_in
from amqpjobs.jobs.message_key import generated_job_id
from amqpjobs.jobs.pacing import Pace
from amqpjobs.jobs.replay_plan import (
    ReplayOptions,
    ReplayReport,
    check_rate,
    check_replay_target,
    destination,
    replay_window,
    unserved,
)
from amqpjobs.jobs.results import StateRecord
from amqpjobs.runtime.canary import watch_canary
from amqpjobs.runtime.quarantine import (
    HELD_COPY_WAIT,
    INTERRUPTED,
    mover_lock,
    publishing_session,
    resolve_quarantine_queue,
    session,
)
from amqpjobs.runtime.replay_checks import (
    DoneSince,
    Targets,
    check_jobs_belong,
    check_targets,
    copy_fits,
    too_large_copy,
)
from amqpjobs.runtime.results import ResultsStore, record_quietly
from amqpjobs.runtime.undeliverable_mend import PastUndeliverable
from amqpjobs.topology.naming import parse_queue_name, quarantine_exchange_name
from amqpjobs.topology.orphans import Route
from amqpjobs.wire.abc import Connection, Received
from amqpjobs.wire.alarms import blocked_by, refuse_while_blocked
from amqpjobs.wire.browse import Watch, watch_exchange
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.errors import internal_error_hint
from amqpjobs.wire.publish import ConfirmedPublisher
from amqpjobs.wire.reset import reset
from amqpjobs.wire.settings import BrokerSettings


async def _watch_returns(connection: Connection, quarantine_queue: str, replay_id: str, report: ReplayReport) -> Watch:
    """Count replayed jobs coming back: an exclusive queue bound to the (fanout) quarantine exchange."""

    def on_headers(headers: Mapping[str, Any], message_id: str) -> None:
        if q.header_text(headers.get(q.REPLAY_ID)) == replay_id:
            report.returned += 1

    exchange = quarantine_exchange_name(parse_queue_name(quarantine_queue).job_queue)  # also from a parked queue
    try:
        return await watch_exchange(connection, exchange, on_headers)
    except NotFoundError:
        raise ConfigurationError(
            f"exchange {exchange!r} not found: --stop-after-failures needs the quarantine exchange of the naming scheme"
        ) from None


@dataclass(frozen=True)
class ReplayMove:
    """Where replay sends one quarantined message, and the copy it publishes there.

    ``target`` is the queue shown (or the modulus-hash exchange, where the broker picks the
    shard), ``route`` where the copy is published, ``rerouted`` why it is not the queue the
    job failed on (``""`` when it is; :func:`~amqpjobs.topology.orphans.replay_route`).
    """

    target: str
    job_id: str
    copy: OutgoingMessage
    route: Route | None = None
    rerouted: str = ""

    @property
    def exchange(self) -> str:
        """The exchange the copy is published to (``""``: the default exchange, routing key ``target``)."""
        return self.route.exchange if self.route is not None else ""

    @property
    def routing_key(self) -> str:
        """The routing key the copy is published with."""
        return self.route.routing_key if self.route is not None else self.target


def replay_move(
    delivery: Received,
    options: ReplayOptions,
    replay_id: str,
    census: Census | None = None,
    report: ReplayReport | None = None,
) -> ReplayMove | None:
    """The move of one quarantined message in a replay run ``replay_id``, or None: it is skipped.

    Where it goes is :func:`~amqpjobs.jobs.replay_plan.destination` (the one home of the rule).
    Skipped: it came back failing from this run (it carries ``replay_id``), ``options.selection``
    leaves it out, the app (``options.job_queues``) does not serve its job from the job queue it would
    go back to (``report.unserved``, named in ``report.not_moved``: :func:`~amqpjobs.jobs.replay_plan.unserved`),
    or it has no destination: it names no queue to go back to (counted in
    ``report.no_origin``, so the summary says why), one over 255 bytes, which no publish can
    address (``report.far_origin``), or a queue of ours that holds no jobs (``report.misdirected``,
    named in ``report.not_moved``).
    The copy starts at attempt 1 with the replay provenance (:func:`amqpjobs.jobs.quarantine.replay_headers`).
    Used by :func:`replay` and by the in-memory double (:mod:`amqpjobs.testing`). ``census``
    counts the message (and whether the filters matched it).
    """
    item = q.describe(delivery.headers, delivery.message_id, delivery.type, delivery.body)
    ours = q.header_text(delivery.headers.get(q.REPLAY_ID)) == replay_id  # it came back failing
    matched = (census or Census()).matches(item, options.selection)
    if ours or not matched:
        return None
    job_id = delivery.message_id or item.job_id or generated_job_id()
    goes = destination(item.original_queue, tenant_in(delivery.headers) or job_id, options.to, options.layouts)
    if goes.route is None:  # it stays: counted by why, so the summary says it with the fix
        if report is not None and goes.skip == "no-work-queue":
            report.misdirected += 1
            report.not_moved.append(item.stays(goes.problem))
        elif report is not None:
            report.far_origin += goes.skip == "far"
            report.no_origin += goes.skip == "no-origin"
        return None
    if (why := unserved(item.job, parse_queue_name(item.original_queue).job_queue, options)) is not None:
        if report is not None:  # its workers would only quarantine it again: it stays, named with the fix
            report.unserved += 1
            report.not_moved.append(item.stays(why))
        return None
    headers = q.replay_headers(delivery.headers, item, replay_id, timestamp=delivery.timestamp)
    # ready in the work queue on its publish, now: max_age and status count its age from then
    copy = delivery.copy(headers, job_id, envelope.ready_at(time.time()))
    if options.to:
        return ReplayMove(goes.route.target, job_id, copy)
    return ReplayMove(goes.route.target, job_id, copy, goes.route, goes.why)


async def replay(
    settings: BrokerSettings,
    name: str,
    options: ReplayOptions,
    progress: Callable[[ReplayReport], None] | None = None,
    *,
    report: ReplayReport | None = None,
    census: Census | None = None,
    results: ResultsStore | None = None,
) -> ReplayReport:
    """Move quarantined messages back to their work queues at no more than ``options.rate`` per second.

    Each message is looked at once (the queue's depth at the start bounds the run), and a
    job this run replayed that came back failing is never moved again by it (it carries
    this run's replay id; a browser holding a message mid-run lets the run reach it).
    Non-matching messages are held unacked and released at the end, keeping their place
    in the queue.

    Holds the queue's :func:`mover_lock` throughout. A dry run moves nothing but checks
    what a real run checks: it takes the lock too (exit 4 while another mover runs), and
    a message whose target queue does not exist is skipped, named, as a real run skips it
    (:class:`~amqpjobs.runtime.replay_checks.Targets`): one message never blocks the others.

    Args:
        settings: Broker settings.
        name: Quarantine queue, or the job queue whose quarantine it is.
        options: Rate, filters, target, limits.
        progress: Called with the report after each move.
        report: Filled as the run goes (and returned): a caller keeps it to report a run
            cut short, e.g. by Ctrl-C. Cancelled, the run settles the moves under way,
            returns held messages and sets ``left`` before the cancellation propagates.
        census: Filled with what every looked-at message holds (to show what is there
            when the filters matched none).
        results: The app's results store: each moved job is recorded ``replayed`` (best effort,
            at the end of the run, :func:`~amqpjobs.runtime.results.record_quietly`).

    Raises:
        ConfigurationError: no such quarantine queue, a bad option, or a ``--to`` queue that does
            not exist (nothing was moved).
        BusyError: another mover (a replay, a purge ...) works on the queue; nothing was moved.
        BrokerError, BrokerUnavailableError: the broker failed; nothing unconfirmed was acked.

    """
    check_rate(options.rate)
    check_replay_target(options.to)
    replay_id = str(uuid.uuid4())
    report = report if report is not None else ReplayReport(queue=name)
    census = census if census is not None else Census()
    async with session(settings) as connection, AsyncExitStack() as stack:
        queue_name, depth = await resolve_quarantine_queue(connection, name)
        lock = await stack.enter_async_context(mover_lock(connection, settings, queue_name, "replay"))
        _, depth = await resolve_quarantine_queue(connection, queue_name)  # as the previous mover left it
        report.queue, report.left = census.queue, census.depth = queue_name, depth
        if depth and not options.dry_run:  # a copy's publish would be held, the run with it, without a word
            await refuse_while_blocked(settings, f"replay of {queue_name!r}")
        if options.to is not None:  # a typo fails at once, also when nothing would move
            await check_targets(connection, [options.to], settings)
            if options.job_queues is not None:  # before any move: the target's workers must handle every job
                await check_jobs_belong(settings, queue_name, depth, options)
        watch = None
        if options.stop_after_failures is not None:
            watch = await _watch_returns(connection, queue_name, replay_id, report)
        canary = None
        if options.canary is not None and not options.dry_run:  # subscribed before the first move: no race
            canary = await stack.enter_async_context(
                watch_canary(connection, replay_id, options.canary, options.canary_timeout, queue_name)
            )
            report.phase = "canary"
            if progress is not None:  # checked and subscribed: the caller may now say what the canary does
                progress(report)
        publishing = await stack.enter_async_context(publishing_session(settings, "replay"))
        publisher = ConfirmedPublisher(publishing, give_up_blocked=HELD_COPY_WAIT)
        browsed = PastUndeliverable(settings, queue_name, depth)  # mends one no 0-9-1 client receives
        targets, done = Targets(connection, settings), DoneSince(results, options.idempotent)
        started: float | None = None
        interrupted = False
        launched = 0
        window = asyncio.Semaphore(replay_window(options.rate))
        pace = Pace(options.rate)
        moving: set[asyncio.Task[None]] = set()
        failures: list[BaseException] = []
        moved: list[StateRecord] = []
        proven = 0  # the largest body confirmed in this run: a larger copy is sent alone (see _alone)
        blocked: BrokerBlockedError | None = None  # a copy held by a resource alarm stopped the run

        async def move(delivery: Delivery, planned: ReplayMove, started: float) -> None:
            """Publish the copy, and ack the quarantined message only once the copy is confirmed."""
            nonlocal proven
            at = time.time()  # before the publish: a worker may run the copy before the ack below
            target, copy = planned.target, planned.copy
            try:
                try:
                    await publisher.publish(planned.exchange, planned.routing_key, copy)
                except MessageTooLargeError as exc:  # over the broker's max_message_size: it stays (see _alone)
                    too_large_copy(delivery, exc, report)
                    return
                except UnroutableError:  # deleted under the run: this one stays, named, and the run goes on
                    targets.gone(target)
                    if canary is not None:  # not moved: no outcome to wait for
                        canary.drop(planned.job_id)
                    report.target_missing(q.describe(delivery.headers, delivery.message_id, delivery.type), target)
                    return
                proven = max(proven, len(copy.body))
                report.moves.append((copy.message_id or "", target))  # confirmed: it moved, whatever the ack does
                was = q.describe(delivery.headers, delivery.message_id, delivery.type)
                moved.append(StateRecord(copy.message_id or "", was.job, "replayed", was.attempts, at,
                                         detail=f"replay run {replay_id}", where=target))  # fmt: skip
                report.replayed += 1
                report.elapsed = time.monotonic() - started
                await browsed.ack(delivery)  # one cut is taken when browsed again (PastUndeliverable.ack)
                if progress is not None:
                    progress(report)
            except Exception as exc:  # raised by replay() once the moves under way are settled
                failures.append(exc)
            finally:
                window.release()

        def came_back() -> bool:
            """Whether ``stop_after_failures`` replayed jobs came back: no more moves (``stopped_early``)."""
            if watch is not None and report.returned >= (options.stop_after_failures or 0):
                report.stopped_early = True
            return report.stopped_early

        try:
            async for delivery in browsed.deliveries():
                if options.limit is not None and launched >= options.limit:
                    report.limit_reached = options.limit
                    break
                if failures or came_back():
                    break
                planned = replay_move(delivery, options, replay_id, census, report)
                if planned is None:
                    report.skipped += 1
                    continue
                if not await copy_fits(publisher, delivery, planned, report):
                    continue
                if await done.stays(planned.job_id, delivery, report):  # its job succeeded since it failed
                    continue
                if not planned.exchange and not await targets.takes(planned.target, report, delivery):  # stays, named
                    continue
                if canary is not None and canary.due(launched) and not await canary.judge(moving, failures, report):
                    break
                target = planned.target
                if canary is not None and launched < canary.size:
                    job = q.describe(delivery.headers, delivery.message_id, delivery.type).job
                    canary.expect(planned.job_id, job, target)
                if planned.rerouted:
                    report.rerouted[planned.job_id] = planned.rerouted
                if options.dry_run:
                    report.moves.append((planned.job_id, target))
                    report.replayed += 1
                    launched += 1
                    continue
                now = time.monotonic()
                started = now if started is None else started
                if (wait := pace.wait(now)) > 0:  # at options.rate, no burst after a stall
                    await asyncio.sleep(wait)
                await window.acquire()
                if failures or came_back():  # one may have come back while this move waited its turn
                    window.release()
                    break
                try:
                    lock.check()
                except BrokerError as exc:  # its connection dropped (a broker restart): say what moved before it
                    window.release()
                    await asyncio.gather(*moving, return_exceptions=True)  # each ends at its confirm (or its failure)
                    raise BrokerError(
                        report.cut_short(options.rate, f"{exc}{internal_error_hint(exc)}", options.dry_run)
                    ) from exc
                alone = len(planned.copy.body) > proven
                if alone:
                    await _alone(moving)
                task = asyncio.create_task(move(delivery, planned, started))
                moving.add(task)
                task.add_done_callback(moving.discard)
                launched += 1
                if alone:
                    await _alone(moving)
            if canary is not None and not canary.judged and canary.expected:  # fewer than K matched
                await canary.judge(moving, failures, report)
            await asyncio.gather(*moving, return_exceptions=True)
            if failures:
                raise failures[0]
        except asyncio.CancelledError:
            interrupted = True
            raise
        except BrokerBlockedError as exc:  # said once the held copies are dropped and what stays is counted
            blocked = exc
        except AmqpJobsError:
            raise
        except INTERRUPTED as exc:
            await asyncio.gather(*moving, return_exceptions=True)  # each ends at its confirm (or its failure)
            raise BrokerError(
                report.cut_short(options.rate, f"{exc}{internal_error_hint(exc)}", options.dry_run)
            ) from exc
        finally:
            for task in moving if interrupted else ():  # Ctrl-C cuts them short; else each ends at its confirm
                task.cancel()
            await asyncio.gather(*moving, return_exceptions=True)
            if (
                blocked is not None or blocked_by(publishing) is not None
            ):  # its copies held unread are dropped: their originals stay
                await reset(publishing)
            await browsed.close()  # held (skipped) messages return to quarantine, waited for: then counted
            await publisher.close()
            await record_quietly(results, moved)
            if watch is not None and not watch.is_closed:
                await watch.close()
            if interrupted:  # the held messages are back: count them for the caller's summary
                with contextlib.suppress(Exception):
                    _, report.left = await resolve_quarantine_queue(connection, queue_name)
        _, report.left = await resolve_quarantine_queue(connection, queue_name)
    if blocked is not None:
        held = sum(isinstance(exc, BrokerBlockedError) for exc in failures)
        raise BrokerBlockedError(report.stopped_by_alarm(blocked.alarm, held), alarm=blocked.alarm) from blocked
    return report


async def _alone(moving: set[asyncio.Task[None]]) -> None:
    """Let the moves under way settle: a copy larger than any confirmed so far is published with none beside it.

    The broker's ``max_message_size`` can't be read (not in ``connection.tune``); a body over it
    closes the channel (406), failing every publish in flight on it (stored or not). Alone, only
    that copy is refused and stays, named (:func:`~amqpjobs.runtime.replay_checks.too_large_copy`); the
    refusal tells the limit, so later copies over it are skipped before sending
    (:func:`~amqpjobs.runtime.replay_checks.copy_fits`), and the run goes on.
    """
    await asyncio.gather(*moving, return_exceptions=True)
