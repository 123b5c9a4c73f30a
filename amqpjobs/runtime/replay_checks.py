"""What a replay checks before it moves anything (README "Quarantine and replay"), dry run or not.

A ``--to`` whose workers would not handle the jobs that move (they would only come back as
``unknown-job``), and a ``--to`` queue that does not exist, are refused with nothing moved.
Without ``--to``, each message's own target is looked up once (:class:`Targets`): a message for
one that does not exist stays in quarantine, named, and the others go.
"""

from __future__ import annotations

from amqpjobs.errors import ConfigurationError, UnaddressableNameError
from amqpjobs.jobs import quarantine as q
from amqpjobs.jobs.census import Census
from amqpjobs.jobs.replay_plan import ReplayOptions
from amqpjobs.printable import printable
from amqpjobs.runtime.undeliverable_mend import PastUndeliverable
from amqpjobs.topology.naming import parse_queue_name
from amqpjobs.wire.abc import Connection
from amqpjobs.wire.declare import find_missing
from amqpjobs.wire.settings import BrokerSettings


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
            if Census().matches(item, options.selection) and options.job_queues.get(item.job) != target:
                strays[item.job] = strays.get(item.job, 0) + 1
    finally:
        await browsed.close(quietly=True)
    if strays:
        owners = "; ".join(
            f"{printable(repr(job))} ({count} message(s)): "
            + (f"job queue {printable(repr(options.job_queues[job]))} does" if job in options.job_queues
               else "no job queue of the app does")
            for job, count in sorted(strays.items())
        )  # fmt: skip
        raise ConfigurationError(
            f"--to {printable(repr(options.to))}: {printable(repr(target))} workers do not handle job(s) {owners}; "
            "they would land back in quarantine as unknown-job. Nothing was moved: leave --to out (each job goes "
            "back to the queue it failed on), or narrow the replay with --job"
        )


async def check_targets(connection: Connection, targets: list[str]) -> None:
    """Refuse a ``--to`` queue that does not exist: every message would stay; checked before anything moves."""
    missing, _ = await find_missing(connection, targets)
    if missing:
        raise ConfigurationError(
            f"target queue(s) {', '.join(printable(repr(t)) for t in sorted(missing))} do not exist; nothing was "
            "moved (check --to, or apply the topology: amqpjobs topology apply)"
        )


class Targets:
    """Which target queues of a replay exist: each looked up once (a passive declare), then remembered.

    A message whose target does not exist stays in quarantine, named
    (:meth:`~amqpjobs.jobs.replay_plan.ReplayReport.target_missing`); one missing never blocks the
    others. A target deleted under the run is found by its publish, returned unroutable (:meth:`gone`).
    """

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._exists: dict[str, bool] = {}

    async def exists(self, queue: str) -> bool:
        """Whether queue ``queue`` exists (asked of the broker the first time only).

        A name the AMQP client won't declare (RabbitMQ takes any UTF-8, pamqp fewer characters:
        :class:`~amqpjobs.errors.UnaddressableNameError`) can't be looked up, yet a publish's routing
        key can name it: True, so its publish decides (returned unroutable when it is missing).
        """
        if queue not in self._exists:
            try:
                missing, _ = await find_missing(self._connection, [queue])
            except UnaddressableNameError:
                missing = set()
            self._exists[queue] = queue not in missing
        return self._exists[queue]

    def gone(self, queue: str) -> None:
        """Remember that ``queue`` went missing (a publish to it came back unroutable): later messages for it stay."""
        self._exists[queue] = False
