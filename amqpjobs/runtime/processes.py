"""A worker or a scheduler replica as a process's whole life: run until SIGTERM/SIGINT, then stop well.

What ``amqpjobs consume`` and ``amqpjobs schedule run`` call: the first signal stops
taking work and drains (a worker: in-flight handlers within the grace period; a
scheduler: leadership handed over), a second exits at once (:mod:`amqpjobs.runtime.signals`).
A worker's metrics and health endpoint lives as long as it does.
"""

from __future__ import annotations

import logging

from amqpjobs.errors import ConfigurationError
from amqpjobs.runtime.app import App
from amqpjobs.runtime.metrics import MetricsServer, WorkerMetrics
from amqpjobs.runtime.scheduled_app import ScheduledApp
from amqpjobs.runtime.scheduler import Scheduler, SchedulerOptions
from amqpjobs.runtime.signals import stop_on_signals
from amqpjobs.runtime.worker import Worker
from amqpjobs.runtime.worker_config import WorkerOptions
from amqpjobs.wire.settings import BrokerSettings

log = logging.getLogger("amqpjobs.worker")


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

    Raises:
        ConfigurationError: the metrics port can't be bound.
    """
    metrics = WorkerMetrics() if metrics_port is not None else None
    worker = Worker(app, settings, options, metrics=metrics)
    server = None
    if metrics is not None and metrics_port is not None:
        server = MetricsServer(metrics, worker.readiness, lambda: worker.heartbeat_at, metrics_host, metrics_port)
        try:
            server.start()
        except OSError as exc:
            raise ConfigurationError(f"can't serve metrics on {metrics_host}:{metrics_port}: {exc}") from None
        log.info("metrics and health on http://%s:%d/metrics, /healthz, /readyz", metrics_host, server.port)
    try:
        with stop_on_signals(worker.request_stop, "no new deliveries; draining", options.grace):
            return await worker.run(own_process=True)  # past the grace, a handler thread still running ends it
    finally:
        if server is not None:
            server.stop()
        await close_app(app)


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
