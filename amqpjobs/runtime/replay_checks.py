"""What a replay checks before it moves anything (README "Quarantine and replay"), dry run or not.

A ``--to`` whose workers would not handle the jobs that move (they would only come back as
``unknown-job``), and a ``--to`` queue that does not exist, are refused with nothing moved.
Without ``--to``, each message's own target is looked up once (:class:`Targets`): a message for
one that does not exist stays in quarantine, named, and the others go. With the app's results
store, a copy whose job succeeded after the copy failed stays too (:class:`DoneSince`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from amqpjobs.errors import AmqpJobsError, ConfigurationError, MessageTooLargeError, UnaddressableNameError
from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.envelope import iso_utc
from amqpjobs.jobs.replay_plan import ReplayOptions, ReplayReport
from amqpjobs.printable import printable, shell_quote
from amqpjobs.runtime.results import ResultsStore, read_status
from amqpjobs.runtime.undeliverable_mend import PastUndeliverable
from amqpjobs.topology.naming import parse_queue_name
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.declare import find_missing, is_reply_to
from amqpjobs.wire.delivery import Delivery
from amqpjobs.wire.management import ManagementClient
from amqpjobs.wire.publish import ConfirmedPublisher
from amqpjobs.wire.settings import BrokerSettings

if TYPE_CHECKING:  # replay imports this module
    from amqpjobs.runtime.replay import ReplayMove


async def check_jobs_belong(settings: BrokerSettings, queue_name: str, depth: int, options: ReplayOptions) -> None:
    """Refuse a ``--to`` whose workers do not handle every job that would move (``options.job_queues``).

    A worker quarantines a delivery of a job it does not serve as ``unknown-job``
    (:mod:`amqpjobs.runtime.deliveries`), so such a replay would only put the jobs back in
    quarantine. The matching messages are browsed (and returned) before anything moves.

    Raises:
        ConfigurationError: some would not be handled; names them and the job queue that does.

    """
    assert options.to is not None
    assert options.job_queues is not None
    target = parse_queue_name(options.to).job_queue
    strays: dict[str, int] = {}
    browsed = PastUndeliverable(settings, queue_name, depth)  # on its own connection: one 0-9-1 can't carry is mended
    try:
        async for delivery in browsed.deliveries():
            item = q.describe(delivery.headers, delivery.message_id, delivery.type, delivery.body)
            if moves_to_unserved(item, options, target):
                strays[item.job] = strays.get(item.job, 0) + 1
    finally:
        await browsed.close()  # waited for: the replay that follows browses every one again
    if strays:
        raise ConfigurationError(strays_refusal(options.to, strays, options.job_queues))


def moves_to_unserved(item: q.QuarantinedJob, options: ReplayOptions, target: str) -> bool:
    """Whether quarantined ``item`` would move to job queue ``target``, whose workers don't serve its job.

    It moves when it matches ``options.selection``; ``options.job_queues`` (the app's: job name ->
    job queue) says who serves it. The one rule of :func:`check_jobs_belong` and the test double's replay.
    """
    return Census().matches(item, options.selection) and (options.job_queues or {}).get(item.job) != target


def strays_refusal(to: str, strays: Mapping[str, int], job_queues: Mapping[str, str]) -> str:
    """Why a replay ``--to`` can't move ``strays`` (job name -> messages) there: the job queues that serve them."""
    owners = "; ".join(
        f"{printable(repr(job))} ({count} message(s)): "
        + (
            f"job queue {printable(repr(job_queues[job]))} does"
            if job in job_queues
            else "no job queue of the app does"
        )
        for job, count in sorted(strays.items())
    )
    return (
        f"--to {printable(repr(to))}: {printable(repr(parse_queue_name(to).job_queue))} workers do not handle job(s) "
        f"{owners}; they would land back in quarantine as unknown-job. Nothing was moved: leave --to out (each job "
        "goes back to the queue it failed on), or narrow the replay with --job"
    )


def missing_targets_refusal(missing: Iterable[str]) -> str:
    """The error of a replay whose ``--to`` queue(s) do not exist (nothing moved)."""
    return (
        f"target queue(s) {', '.join(printable(repr(t)) for t in missing)} do not exist; nothing was "
        "moved (check --to, or apply the topology: amqpjobs topology apply)"
    )


#: A target queue that does not exist (a message for it stays: :meth:`ReplayReport.target_missing`).
MISSING: Final = "does not exist"
#: Why a target queue that exists can't keep the jobs a replay moves there.
_REPLY_TO: Final = "is RabbitMQ's direct reply-to pseudo-queue: no message can wait in it"
_EXCLUSIVE: Final = (
    "is exclusive to another connection: the broker deletes it with that connection, and every job moved there"
)
_AUTO_DELETE: Final = "is auto-delete: the broker deletes it with its last consumer, and every job moved there"
_TRANSIENT: Final = "is not durable: the jobs moved there would not survive a restart of the broker"


async def target_problem(connection: Connection, settings: BrokerSettings | None, queue: str) -> str | None:
    """Why queue ``queue`` can't keep replayed jobs (:data:`MISSING`, or it would lose them), or None.

    A replay's copy is confirmed once the queue has it, and its original is acked then: a queue
    the broker deletes with a connection or a consumer (exclusive, auto-delete: RabbitMQ "Queues"
    -> "Exclusive Queues", "Temporary Queues"), a transient one, or the direct reply-to pseudo-queue
    would take the jobs with it. Exclusivity is seen over AMQP (``RESOURCE_LOCKED``); durability
    and auto-delete through the management API of ``settings`` (not checked without its answer).
    A name the AMQP client won't declare (RabbitMQ takes any UTF-8, pamqp fewer characters:
    :class:`~amqpjobs.errors.UnaddressableNameError`) is looked up there only; without an
    answer, None: a publish's routing key can name it, so its publish decides (unroutable when missing).

    Raises:
        BrokerUnavailableError: not connected; BrokerError: the broker refused the look for another reason.
    """
    if is_reply_to(queue):
        return _REPLY_TO
    locked: set[str] = set()
    looked = True  # over AMQP
    try:
        missing, _ = await find_missing(connection, [queue], locked=locked)
    except UnaddressableNameError:
        missing, looked = set(), False
    if queue in missing:
        return MISSING
    if queue in locked:
        return _EXCLUSIVE
    shape = await _by_management(settings, queue)
    if not shape:  # no answer (what AMQP said stands), or none of it there: missing when AMQP could not look
        return MISSING if shape is not None and not looked else None
    if shape.get("exclusive") or shape.get("owner_pid_details"):
        return _EXCLUSIVE
    if shape.get("auto_delete"):
        return _AUTO_DELETE
    return None if shape.get("durable", True) else _TRANSIENT


async def _by_management(settings: BrokerSettings | None, queue: str) -> dict[str, Any] | None:
    """The management API's view of queue ``queue`` ({} when it has none), or None when it can't be asked."""
    if settings is None:
        return None

    def ask() -> dict[str, Any]:
        with ManagementClient(settings) as mgmt:
            found = mgmt.queue(settings.vhost, queue)
            if found is None:  # a wrong path answers 404 too: no API there raises (its /overview is 404 as well)
                mgmt.overview()
            return found or {}

    try:
        return await asyncio.to_thread(ask)
    except AmqpJobsError as exc:
        log.debug("looking up queue %s through the management API failed: %s", printable(repr(queue)), exc)
        return None


async def check_targets(connection: Connection, targets: list[str], settings: BrokerSettings | None = None) -> None:
    """Refuse a ``--to`` queue that does not exist or can't keep jobs (:func:`target_problem`), before any move.

    Raises:
        ConfigurationError: a queue of ``targets`` is one (named, with why and the fix).
        BrokerError: the broker refused a look (as :func:`target_problem`).
    """
    problems = {t: await target_problem(connection, settings, t) for t in targets}
    if missing := sorted(t for t, why in problems.items() if why == MISSING):
        raise ConfigurationError(missing_targets_refusal(missing))
    if bad := next(((t, why) for t, why in problems.items() if why), None):
        raise ConfigurationError(
            f"--to {printable(repr(bad[0]))} {bad[1]}; nothing was moved (give a job queue's work queue)"
        )


class Targets:
    """Which target queues of a replay can take its jobs: each looked up once (:func:`target_problem`), remembered.

    A message whose target does not exist stays in quarantine, named
    (:meth:`~amqpjobs.jobs.replay_plan.ReplayReport.target_missing`), as one whose target would lose
    it (named with why); one such target never blocks the others. A target deleted under the run
    is found by its publish, returned unroutable (:meth:`gone`).
    """

    def __init__(self, connection: Connection, settings: BrokerSettings | None = None) -> None:
        self._connection = connection
        self._settings = settings
        self._problems: dict[str, str | None] = {}

    async def takes(self, target: str, report: ReplayReport, delivery: Delivery) -> bool:
        """Whether ``delivery`` may go to queue ``target``; else it is counted as staying, named with why."""
        if target not in self._problems:
            self._problems[target] = await target_problem(self._connection, self._settings, target)
        why = self._problems[target]
        if why is None:
            return True
        item = q.describe(delivery.headers, delivery.message_id, delivery.type)
        if why == MISSING:
            report.target_missing(item, target)
        else:
            report.stays(item.stays(f"its target queue {printable(repr(target))} {why}"))
        return False

    def gone(self, queue: str) -> None:
        """Remember that ``queue`` went missing (a publish to it came back unroutable): later messages for it stay."""
        self._problems[queue] = MISSING


log = logging.getLogger("amqpjobs.replay")


class DoneSince:
    """Whether a quarantined copy's job succeeded after the copy failed, read from the app's results store.

    Such a copy is a stale one (the same id enqueued again and done; a replay's original whose
    ack was lost): replayed, a job that is not idempotent would run its effect once more. Best
    effort: without a store, or a failure time in the copy's evidence, or while the store can't
    be read (said once in a warning), the copy goes as without ``--app``.

    Args:
        results: The app's results store (``--app``), or None.
        idempotent: Job names declared ``idempotent=True``: their copies go (a run acks them as duplicates).
    """

    def __init__(self, results: ResultsStore | None, idempotent: frozenset[str] = frozenset()) -> None:
        self.results = results
        self.idempotent = idempotent
        self._warned = False

    async def stays(self, job_id: str, delivery: Delivery, report: ReplayReport) -> bool:
        """Whether the copy ``delivery`` of job ``job_id`` stays: counted in ``report.done_since``, named why."""
        item = q.describe(delivery.headers, delivery.message_id, delivery.type, delivery.body)
        why = await self.why_not(job_id, item)
        if why is not None:
            report.done_since += 1
            report.stays(item.stays(why))
        return why is not None

    async def why_not(self, job_id: str, item: q.QuarantinedJob) -> str | None:
        """Why the copy ``item`` of job ``job_id`` stays (its job succeeded since it failed), or None: replay it."""
        if self.results is None or item.failed_at is None or not job_id or item.job in self.idempotent:
            return None
        try:
            status = await read_status(self.results, job_id)
        except Exception as exc:  # ResultsUnavailableError, a driver's own: the replay goes on as without --app
            if not self._warned:
                self._warned = True
                log.warning("results store: can't tell whether quarantined jobs were done since they failed; "
                            "replaying them as without --app (%s: %s)", type(exc).__name__, str(exc)[:200])  # fmt: skip
            return None
        failed = item.failed_at.timestamp()
        done = max((r.at for r in status.history if r.state == "succeeded"), default=None)
        if done is None or done <= failed:
            return None
        return (f"it succeeded at {iso_utc(done)} after this copy failed at {iso_utc(failed)} (amqpjobs job show "
                f"{printable(shell_quote(job_id))}): replayed, it would run once more; purge it, or replay it without "
                "--app to run it again")  # fmt: skip


def too_large_copy(delivery: Delivery, exc: MessageTooLargeError, report: ReplayReport) -> None:
    """Count a message whose copy can't be sent as skipped, naming it in ``report.not_moved``; it stays."""
    item = q.describe(delivery.headers, delivery.message_id, delivery.type, delivery.body)
    report.too_large += 1
    report.stays(item.too_large(exc.reason or str(exc)))


async def copy_fits(
    publisher: ConfirmedPublisher, delivery: Delivery, planned: ReplayMove, report: ReplayReport
) -> bool:
    """True when the copy can be sent; else it is skipped (:func:`too_large_copy`), dry run or not.

    A copy is not the message: the replay's headers can push a message that fitted over
    ``frame_max``. One such message stays in quarantine, named; it never stops the others.
    """
    try:
        await publisher.check(planned.exchange, planned.routing_key, planned.copy)
    except MessageTooLargeError as exc:
        too_large_copy(delivery, exc, report)
        return False
    return True
