"""What a worker is told and what it checks before it connects: options, job timeouts, the jobs' fit to their queues."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.outcome import REPORT_LEVELS
from amqpjobs.jobs.registry import JobDef
from amqpjobs.jobs.retry import retry_window
from amqpjobs.printable import listed
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.versions import NODE_CONSUMER_TIMEOUT as DEFAULT_CONSUMER_TIMEOUT

if TYPE_CHECKING:
    from amqpjobs.runtime.app import App

__all__ = ["DEFAULT_CONSUMER_TIMEOUT"]  # RabbitMQ's default, 30 minutes (its home: amqpjobs.topology.versions)


def default_timeout(consumer_timeout: float) -> float:
    """The timeout of a job that sets none: just below the broker's ``consumer_timeout`` (seconds).

    5% (at least 1 s, at most half) below it, so an async handler fails as ``timeout``
    before the broker closes the channel and redelivers (RabbitMQ "Delivery Acknowledgement
    Timeout"): 1710 s for the default 30 min, 4 s for 5 s.
    """
    return consumer_timeout - min(max(1.0, consumer_timeout * 0.05), consumer_timeout / 2)


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker runs.

    Attributes:
        queues: Job queue names to consume; None = every job queue the app's jobs use.
        concurrency: Slots per job queue: an unsharded work queue gets one consumer with
            ``prefetch_count`` = this (one unacked delivery per slot); a sharded job queue's
            shards share this many slots, round-robin, holding no more unacked deliveries
            than that together (:mod:`amqpjobs.runtime.dispatch`).
        grace: Seconds in-flight handlers get to finish after SIGTERM/SIGINT.
        consumer_timeout: The broker's delivery acknowledgement timeout in seconds (RabbitMQ
            ``consumer_timeout``, default 30 min); a job timeout above it is warned about.
        log_outcomes: Which outcomes get their ``job=... outcome=...`` log line: ``all``,
            ``failures`` (not ``succeeded``/``duplicate``) or ``none`` (metrics still count all).
        outcome_events: Which outcomes are published as outcome events, the same levels; an
            event of a replayed job (a canary waits for it) is sent at every level.
        new_ledger: Begin with a new, empty ledger although the app had one before (its file
            lost, another database): the jobs it had marked done may run again. Without it such
            a start is refused (:mod:`amqpjobs.runtime.ledger_origin`; ``consume --new-ledger``).

    Raises:
        ConfigurationError: a level that is not one of :data:`~amqpjobs.jobs.outcome.REPORT_LEVELS`.
    """

    queues: tuple[str, ...] | None = None
    concurrency: int = 1
    grace: float = 30.0
    consumer_timeout: float = DEFAULT_CONSUMER_TIMEOUT
    log_outcomes: str = "all"
    outcome_events: str = "all"
    new_ledger: bool = False

    def __post_init__(self) -> None:
        for name, level in (("log_outcomes", self.log_outcomes), ("outcome_events", self.outcome_events)):
            if level not in REPORT_LEVELS:
                raise ConfigurationError(f"{name}={level!r}: use one of {', '.join(REPORT_LEVELS)}")


#: Seconds a default claim outlives the longest a run may go on (README "Idempotency").
LEASE_MARGIN = 5.0


def longest_run(timeout: float, grace: float) -> float:
    """Seconds a run may go on: its ``timeout``, then a thread past it for the ``grace``, then the stop's ``grace``.

    (:mod:`amqpjobs.runtime.overruns`: a plain function's thread can't be stopped before its process ends.)
    """
    return timeout + 2 * grace


def default_lease(timeout: float, grace: float) -> float:
    """A claim's lease (seconds) for a job without ``lease=``: it never expires under a run still going.

    Twice ``timeout``, at least the :func:`longest_run` plus :data:`LEASE_MARGIN`, at least 60 s.
    """
    return max(60.0, 2 * timeout, longest_run(timeout, grace) + LEASE_MARGIN)


def lease_timeout(lease: float, grace: float, is_async: bool) -> float:
    """The timeout (seconds) of an idempotent job given ``lease`` and no ``timeout``: its claim outlives its run.

    Half the lease; for a plain function, whose thread goes on past its timeout (:func:`longest_run`),
    at most the lease less that and :data:`LEASE_MARGIN`, so :func:`lease_warnings` has nothing to say.
    When that leaves less than a quarter of the lease (a lease too short for the grace), half the
    lease all the same, not a timeout the job never meant: the warning then names the lease needed.
    """
    room = lease - longest_run(0.0, grace) - LEASE_MARGIN
    return lease / 2 if is_async or room < lease / 4 else min(lease / 2, room)


def lease_warnings(app: App, timeouts: dict[str, float], grace: float) -> list[str]:
    """One line per idempotent plain-function job whose own ``lease`` a run past its timeout can outlive."""
    lines = []
    for job in app:
        if not job.idempotent or job.is_async or job.lease is None:  # an async run is cancelled at its timeout
            continue
        timeout = timeouts[job.name]
        if job.lease < (needed := longest_run(timeout, grace) + LEASE_MARGIN):
            lines.append(
                f"job {job.name!r}: its claim (lease {job.lease:g}s) can expire under a run past its timeout "
                f"({timeout:g}s): a plain function's thread goes on for the grace ({grace:g}s), then for the "
                f"stop's grace ({grace:g}s), so another worker could run it beside; give it lease= at least "
                f"{needed:g}s, or a shorter timeout or --grace"
            )
    return lines


def consumed_job_queues(app: App, options: WorkerOptions) -> tuple[str, ...]:
    """The job queues a worker with ``options`` consumes: ``options.queues``, else every one the app's jobs use."""
    return options.queues if options.queues else tuple(app.queues())


def check_worker(app: App, options: WorkerOptions) -> tuple[dict[str, JobQueueLayout], dict[str, float]]:
    """Everything a worker's start checks of the app and its options before it connects; (layouts, timeouts).

    The one home of these rules: a worker's start (:meth:`~amqpjobs.runtime.worker.Worker.start`,
    in ``consume`` and in each ``--processes`` child) and the supervisor's check before it starts
    any child (:mod:`amqpjobs.runtime.preflight`) call it, so both refuse with the same error.
    It reads the topology files and nothing else (no broker, no store).

    Returns:
        What :func:`check_jobs` returns for the job queues consumed (:func:`consumed_job_queues`).

    Raises:
        ConfigurationError: ``concurrency`` below 1, a job queue named in ``options.queues`` that
            is not in the topology (naming it and the topology's job queues), a job's policy
            that can't work with its queue (:func:`check_jobs`), or a job queue named in
            ``options.queues`` that none of the app's jobs use (:func:`check_served`).
        TopologyValidationError: the app's topology files are invalid.
    """
    if options.concurrency < 1:
        raise ConfigurationError(f"concurrency must be >= 1 (got {options.concurrency})")
    checked = check_jobs(app, consumed_job_queues(app, options), options.consumer_timeout, options.grace)
    check_served(app, options)
    return checked


def check_served(app: App, options: WorkerOptions) -> None:
    """Refuse a job queue of ``options.queues`` that none of the app's jobs use: the one rule, CLI and embedded alike.

    Each delivery there would be quarantined ``unknown-job``, also beside the app that serves it.
    An app without any job is left to :func:`require_served` (``consume`` refuses it; a test may
    embed such a worker, to see what it does with a delivery).

    Raises:
        ConfigurationError: names the job queue, the ones the app's jobs use and the fix.
    """
    served = app.queues()
    if served and (idle := [name for name in options.queues or () if name not in served]):
        raise ConfigurationError(
            f"app {app.name!r} serves no job from job queue {idle[0]!r} (its jobs use: {listed(served)}): "
            "a worker consuming it would quarantine each of its jobs as unknown-job; leave it out of --queues, "
            "or run the app whose jobs use it"
        )


def require_served(app: App, options: WorkerOptions) -> None:
    """What ``amqpjobs consume`` refuses beyond :func:`check_worker`: an app without jobs, which could do no good.

    Not asked of a :class:`~amqpjobs.runtime.worker.Worker` embedded in a program (a test may run
    one without jobs, to see what it does with a delivery). A job queue of ``options.queues`` that
    none of its jobs use is :func:`check_served`'s, asked of both.

    Raises:
        ConfigurationError: no ``@app.job`` is registered (its handlers live in a module nobody
            imported: it would consume nothing).
    """
    if not app.queues():
        raise ConfigurationError(
            f"app {app.name!r} has no jobs: no @app.job was registered when its module was imported, so a worker "
            "would consume nothing; import the modules that define its jobs in the app's module"
        )


def job_queue_layout(app: App, name: str) -> JobQueueLayout:
    """The layout of the app's job queue ``name``.

    Raises:
        ConfigurationError: the app's topology has no such job queue (naming where the topology
            came from and its job queues).

    """
    topology = app.topology()
    try:
        return topology.layout(name)
    except KeyError:
        names = [q.name for q in topology.job_queues]
        raise ConfigurationError(
            f"job queue {name!r} is not in the topology ({app.topology_origin}); known: {listed(names)}"
        ) from None


def check_jobs(
    app: App, job_queues: Iterable[str], consumer_timeout: float, grace: float
) -> tuple[dict[str, JobQueueLayout], dict[str, float]]:
    """Check the app's jobs against the topology; (layout by consumed job queue, timeout by job).

    A job given ``lease`` and no ``timeout`` gets :func:`lease_timeout` (``grace``: the worker's, seconds).

    Raises:
        ConfigurationError: a job queue is missing from the topology, or a job's policy
            can't work with its queue (attempts without tiers, an idempotent job without a
            ledger, tiers or a long enough ledger retention).

    """
    layouts: dict[str, JobQueueLayout] = {}
    timeouts: dict[str, float] = {}
    for name in job_queues:
        layouts[name] = job_queue_layout(app, name)
    for job in app:
        layout = app.layout_of(job)  # ConfigurationError naming the topology when it has no such job queue
        attempts = job.retry.attempts_for(layout.tiers)
        if attempts > 1 and not layout.tiers:
            raise ConfigurationError(
                f"job {job.name!r} allows {attempts} attempts but job queue {job.queue!r} has no "
                "retry_tiers; add tiers to the topology or set RetryPolicy(max_attempts=1)"
            )
        if job.idempotent:
            _check_idempotent(app, job, layout)
        if job.breaker is not None and not layout.tiers:  # its deliveries wait in the first tier while open
            raise ConfigurationError(
                f"job {job.name!r} has a breaker but job queue {job.queue!r} has no retry_tiers: deliveries wait "
                "in the first tier while it is open; add tiers to the topology (a short first tier, e.g. '1s', "
                "bounds how late the probe starts)"
            )
        timeouts[job.name] = job.timeout if job.timeout is not None else default_timeout(consumer_timeout)
        if job.timeout is None and job.idempotent and job.lease is not None:
            # its claim must outlive the run, or a second worker takes it over while it still runs
            own = lease_timeout(job.lease, grace, job.is_async)
            timeouts[job.name] = min(timeouts[job.name], own) if timeouts[job.name] > 0 else own
    return layouts, timeouts


def _check_idempotent(app: App, job: JobDef, layout: JobQueueLayout) -> None:
    ledger = app.ledger
    if ledger is None:
        raise ConfigurationError(f"job {job.name!r} is idempotent but the app has no ledger: App(..., ledger=...)")
    if not layout.tiers:
        raise ConfigurationError(
            f"job {job.name!r} is idempotent but job queue {layout.name!r} has no retry_tiers: a delivery whose "
            "job is running elsewhere waits in the first tier"
        )
    attempts = job.retry.attempts_for(layout.tiers)
    window = retry_window(layout.tiers, attempts)
    needed = window + app.quarantine_retention
    if ledger.retention < needed:
        raise ConfigurationError(
            f"job {job.name!r}: the ledger keeps done-markers {ledger.retention:g}s, shorter than the retry "
            f"window ({window:g}s) plus the quarantine retention ({app.quarantine_retention:g}s) = "
            f"{needed:g}s: a job replayed or retried after its marker was pruned would run its effect again. "
            "Raise the ledger's retention or lower App(quarantine_retention=...)"
        )
