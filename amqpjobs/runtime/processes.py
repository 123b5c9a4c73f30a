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

    try:
        with stop_on_signals(stop, "no new deliveries; draining", options.grace):
            deadline = time.monotonic() + settings.connect_timeout
            while True:
                before = losses()[0]
                try:  # past the grace, a handler thread still running ends the process
                    return await current[0].run(own_process=True)
                except ConfigurationError:
                    raise
                except Exception as exc:
                    if not await _lost_while_starting(current[0], before, asked, deadline, settings, exc):
                        raise
                await asyncio.sleep(START_AGAIN)
                if asked:
                    log.info("worker stopped while starting: no delivery was taken; exit 0")
                    return 0
                current[0] = Worker(app, settings, options, metrics=metrics)
    finally:
        if server is not None:
            server.stop()
        await close_app(app)


async def _lost_while_starting(
    worker: Worker, before: int, asked: list[int], deadline: float, settings: BrokerSettings, exc: Exception
) -> bool:
    """Whether ``worker``'s start failed because a connection was lost meanwhile, and may begin again (said so).

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
    if worker.ready.is_set() or asked or count == before:
        return False
    if time.monotonic() >= deadline:
        raise BrokerUnavailableError(
            f"the broker closed or lost the worker's connection while it started{why}, again after "
            f"{settings.connect_timeout:g}s of starting again (--connect-timeout): nothing was consumed. Look in the "
            "broker's log for why it closes them (rabbitmqctl close_connection, a node stopping, a connection "
            f"limit), then start the worker again; the last error: {type(exc).__name__}: {exc}"
        ) from exc
    left = deadline - time.monotonic()
    log.warning("a connection to the broker was lost while the worker was starting%s: nothing was consumed; "
                "starting again in %gs (for up to %.0fs more, --connect-timeout)", why, START_AGAIN, left)  # fmt: skip
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
    scheduler = Scheduler(app, settings, options)
    with stop_on_signals(scheduler.request_stop, "handing leadership over and stopping"):
        return await scheduler.run()
