"""A worker or a scheduler replica as a process's whole life: run until SIGTERM/SIGINT, then stop well.

What ``amqpjobs consume`` and ``amqpjobs schedule run`` call: the first signal stops
taking work and drains (a worker: in-flight handlers within the grace period; a
scheduler: leadership handed over), a second exits at once (:mod:`amqpjobs.runtime.signals`).
A worker's metrics and health endpoint lives as long as it does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from amqpjobs.errors import BrokerUnavailableError, ConfigurationError
from amqpjobs.runtime.app import App
from amqpjobs.runtime.metrics import MetricsServer, WorkerMetrics
from amqpjobs.runtime.scheduled_app import ScheduledApp
from amqpjobs.runtime.scheduler import Scheduler, SchedulerOptions
from amqpjobs.runtime.signals import stop_on_signals
from amqpjobs.runtime.worker import Worker
from amqpjobs.runtime.worker_config import WorkerOptions
from amqpjobs.wire.cluster import losses
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.worker")
#: Seconds between a start a lost connection cut short and the next one.
START_AGAIN = 1.0


async def run_worker(
    app: App,
    settings: BrokerSettings,
    options: WorkerOptions,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
) -> int:
    """Run a worker until SIGTERM/SIGINT, then drain; a second signal exits at once.

    Args:
        app: The application.
        settings: Broker settings.
        options: Worker options.
        metrics_port: Serve ``/metrics``, ``/healthz``, ``/readyz`` on this port (None: don't).
        metrics_host: Interface for that endpoint (default loopback).

    Returns:
        The process exit code: 0 after a clean drain, 1 when in-flight work was abandoned.
        When a plain-function handler's thread still runs after the grace, the process ends
        (exit 1) before its connection closes, so that the thread can't finish beside its
        redelivery: this never returns then, and the app is not closed
        (:mod:`amqpjobs.runtime.handler_threads`). Else the app is closed last (:func:`close_app`).

    A start that fails because a connection to the broker was lost meanwhile (closed by the
    broker, a node stopping) begins again with a new :class:`Worker`, for up to
    ``settings.connect_timeout`` (:func:`_lost_while_starting`); ``/readyz`` says ``starting``
    meanwhile.

    Raises:
        ConfigurationError: the metrics port can't be bound.
        BrokerUnavailableError: connections were still lost while starting after ``settings.connect_timeout``.
        The other errors of :meth:`Worker.start`.
    """
    metrics = WorkerMetrics() if metrics_port is not None else None
    worker = Worker(app, settings, options, metrics=metrics)
    current = [worker]  # the worker of this start: a start a lost connection cut short begins again with another
    asked: list[int] = []  # a stop was requested
    server = None
    if metrics is not None and metrics_port is not None:
        server = MetricsServer(metrics, lambda: current[0].readiness(), lambda: current[0].heartbeat_at,
                               metrics_host, metrics_port)  # fmt: skip
        try:
            server.start()
        except OSError as exc:
            raise ConfigurationError(f"can't serve metrics on {metrics_host}:{metrics_port}: {exc}") from None
        log.info("metrics and health on http://%s:%d/metrics, /healthz, /readyz", metrics_host, server.port)

    def stop() -> None:
        asked.append(1)
        current[0].request_stop()

    def renew() -> None:
        current[0] = Worker(app, settings, options, metrics=metrics)

    try:
        with stop_on_signals(stop, "no new deliveries; draining", options.grace):
            return await starting_again(  # past the grace, a handler thread still running ends the process
                lambda: current[0].run(own_process=True), renew, lambda: current[0].ready.is_set(), asked, settings,
                "worker stopped while starting: no delivery was taken; exit 0", lambda: current[0].start_cut,
                lambda: current[0].start_cut_code,
            )  # fmt: skip
    finally:
        if server is not None:
            server.stop()
        await close_app(app)


async def starting_again(
    run: Callable[[], Awaitable[int]], renew: Callable[[], None], started: Callable[[], bool], asked: list[int],
    settings: BrokerSettings, stopped: str, consumed: Callable[[], str | None] = lambda: None,
    unclean: Callable[[], int] = lambda: 0,
) -> int:  # fmt: skip
    """``run()``, begun again with ``renew()`` (a new worker or replica) while its start fails on a lost connection.

    Used by ``amqpjobs consume``, each ``--processes`` child (:mod:`amqpjobs.runtime.child`)
    and ``amqpjobs schedule run``.

    ``started()``: the start of the last ``run()`` had ended (a later error stands); ``asked``:
    non-empty once a stop was requested (then ``stopped`` is logged and the result is 0); ``consumed()``:
    what the start that failed had consumed (a worker's :attr:`~amqpjobs.runtime.worker.Worker.start_cut`:
    its first consumers may have taken deliveries before a later step failed), None when nothing;
    ``unclean()``: the exit code of that start's stop, which a stop before the next start returns.

    Raises:
        What ``run()`` raised, unless :func:`_lost_while_starting` begins it again.
    """
    deadline = time.monotonic() + settings.connect_timeout
    while True:
        before = losses()[0]
        try:
            return await run()
        except ConfigurationError:
            raise
        except Exception as exc:
            if not await _lost_while_starting(started(), before, asked, deadline, settings, exc, consumed()):
                if not started() and (cut := consumed()) is not None:  # the error says why; this, what was taken
                    log.warning("the start failed after its first consumers had taken work: %s", cut)
                raise
        await asyncio.sleep(START_AGAIN)
        if asked:
            cut, code = consumed(), unclean()  # some redelivered: no clean stop (README "Workers")
            log.info(stopped if cut is None else f"worker stopped while starting: {cut}; exit {code}")
            return code
        renew()


async def _lost_while_starting(
    started: bool, before: int, asked: list[int], deadline: float, settings: BrokerSettings, exc: Exception,
    consumed: str | None = None,
) -> bool:  # fmt: skip
    """Whether a start failed because a connection was lost meanwhile, and may begin again (said so).

    ``started``: the start (a worker's, a scheduler replica's) had ended before the error; ``consumed``:
    what it had consumed before the error (``2 in-flight job(s) finished, 2 of them not acked ...``), None: nothing.

    A broker that closes a connection in the middle of a start (``rabbitmqctl close_connection``,
    a node stopping between two declares) fails whatever step used it. Such a start begins again
    after :data:`START_AGAIN` s, for up to ``--connect-timeout`` (``settings.connect_timeout``) from
    the first start. A start that was stopped, or that failed with no connection lost, is not
    begun again: False, its error stands.

    Raises:
        BrokerUnavailableError: connections were still lost at ``deadline``: it names the last
            cause and what to do.
    """
    await asyncio.sleep(0.1)  # the client's own close callbacks (the count) run after the call that failed
    count, why = losses()
    if started or asked or count == before:
        return False
    took = "nothing was consumed or ticked" if consumed is None else f"its first consumers had taken work: {consumed}"
    if time.monotonic() >= deadline:
        raise BrokerUnavailableError(
            f"the broker closed or lost a connection of the process while it started{why}, again after "
            f"{settings.connect_timeout:g}s of starting again (--connect-timeout): {took}. Look in the "
            "broker's log for why it closes them (rabbitmqctl close_connection, a node stopping, a connection "
            f"limit), then start it again; the last error: {type(exc).__name__}: {exc}"
        ) from exc
    left = deadline - time.monotonic()
    log.warning("a connection to the broker was lost while starting%s: %s; starting again in %gs (for up to %.0fs "
                "more, --connect-timeout)", why, took, START_AGAIN, left)  # fmt: skip
    return True


async def close_app(app: App) -> None:
    """A worker process's last step, once its last handler has ended: :meth:`App.close`, on the loop that opened it.

    Its ``queued`` records, ledger, results and payload stores, and the publishing connection
    with its enqueue gate's management API client that handlers' ``await app.enqueue(...)``
    opened (else the process's exit drops that connection: ``connection ... lost`` after the
    stop line, and an unclosed socket). A :class:`~amqpjobs.runtime.worker.Worker` awaited in
    your own program leaves the app to you (README "Workers").

    Raises:
        ConfigurationError: the app connected on another thread's loop, still running.
    """
    await app.close()


async def run_scheduler(app: ScheduledApp, settings: BrokerSettings, options: SchedulerOptions) -> int:
    """Run a scheduler replica until SIGTERM/SIGINT; a second signal exits at once.

    Returns:
        The process exit code, 0.

    """
    current = [Scheduler(app, settings, options)]
    asked: list[int] = []

    def stop() -> None:
        asked.append(1)
        current[0].request_stop()

    def renew() -> None:
        current[0] = Scheduler(app, settings, options)

    with stop_on_signals(stop, "handing leadership over and stopping"):
        return await starting_again(
            lambda: current[0].run(), renew, lambda: current[0].ready.is_set(), asked, settings,
            f"scheduler replica {current[0].replica} stopped while starting; exit 0",
        )  # fmt: skip
