"""Worker metrics (prometheus-client) and the HTTP endpoint serving them with health checks.

Metrics (README "Metrics and health"); label sets stay bounded: job name, job queue,
outcome — never job ids or tenants.

============================================  =========  ==========================================
name                                          type       meaning
============================================  =========  ==========================================
``amqpjobs_jobs_total{job,queue,outcome}``    counter    deliveries by outcome (``Outcome.kind``):
                                                         succeeded, retried, deferred (waited for a
                                                         claim), duplicate (already done),
                                                         quarantined, ack_uncertain (ack maybe
                                                         lost), redelivered (came back without an
                                                         outcome), handed_back (not started while
                                                         a suspect ran alone), skipped (the overlap
                                                         guard left it unrun), abandoned (left for
                                                         redelivery)
``amqpjobs_timeouts_total{job,queue}``        counter    handler runs that hit their timeout
``amqpjobs_job_duration_seconds{job,queue}``  histogram  handler run time, every run
``amqpjobs_queue_latency_seconds{job,queue}`` histogram  enqueue → first start (attempt 1 only; the
                                                         waits of retries are deliberate tier delays)
``amqpjobs_in_flight{queue}``                 gauge      deliveries being handled now
``amqpjobs_publish_confirm_seconds``          histogram  publish → broker confirm, for retries and
                                                         quarantine copies
``amqpjobs_events_dropped_total``             counter    outcome events not published (events
                                                         exchange missing, channel closed or blocked)
``amqpjobs_results_write_failures_total``     counter    job-state records the results store did not
                                                         take (down, slow, or the write queue full)
``amqpjobs_breaker_state{job}``               gauge      a job's circuit breaker: 0 closed, 1 open,
                                                         2 half-open (jobs with a breaker only)
``amqpjobs_paused{queue,reason}``             gauge      1 while an operator pauses the job queue
                                                         (``amqpjobs pause``, its ``--reason``), else 0
``amqpjobs_paused_since_seconds{queue}``      gauge      when it was paused (Unix time; 0 when not)
============================================  =========  ==========================================

The endpoint (:class:`MetricsServer`) serves ``/metrics``, ``/healthz`` (liveness: the
process answers and its event loop ran within the last few seconds) and ``/readyz``
(readiness: connected to the broker and consuming every assigned queue), from a thread,
so a blocked event loop still gets a truthful "not alive" answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

#: Buckets (seconds) for handler durations and queue latency: 5 ms to 10 min.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
#: Buckets (seconds) for publisher confirm latency: 0.5 ms to 5 s.
CONFIRM_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class WorkerMetrics:
    """The metrics of one worker, in a registry of their own (so tests can run several workers).

    Args:
        registry: Registry to register into; a new one by default.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.jobs = Counter(
            "amqpjobs_jobs", "Deliveries by outcome.", ["job", "queue", "outcome"], registry=self.registry
        )
        self.timeouts = Counter(
            "amqpjobs_timeouts", "Handler runs that hit their timeout.", ["job", "queue"], registry=self.registry
        )
        self.duration = Histogram(
            "amqpjobs_job_duration_seconds", "Handler run time.", ["job", "queue"], buckets=DURATION_BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "amqpjobs_queue_latency_seconds", "Time from enqueue to the first start of a job.", ["job", "queue"],
            buckets=DURATION_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.in_flight = Gauge(
            "amqpjobs_in_flight", "Deliveries being handled.", ["queue"], registry=self.registry,
            multiprocess_mode="livesum",  # consume --processes N: the live children's sum
        )  # fmt: skip
        self.confirm = Histogram(
            "amqpjobs_publish_confirm_seconds", "Publish to broker confirm.", buckets=CONFIRM_BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        self.events_dropped = Counter(
            "amqpjobs_events_dropped", "Outcome events not published (exchange missing, channel closed or blocked).",
            registry=self.registry,
        )  # fmt: skip
        self.results_write_failures = Counter(
            "amqpjobs_results_write_failures", "Job-state records not written to the results store.",
            registry=self.registry,
        )  # fmt: skip
        self.breaker_state = Gauge(
            "amqpjobs_breaker_state", "Circuit breaker state: 0 closed, 1 open, 2 half-open.", ["job"],
            registry=self.registry, multiprocess_mode="livemostrecent",  # consume --processes: the latest change
        )  # fmt: skip
        # rate limits (README "Flow control" -> "Rate limits"): summed over the live processes
        self.rate_waiting = Gauge(
            "amqpjobs_rate_limit_waiting", "Deliveries of a rate-limited job held here waiting for a token.", ["job"],
            registry=self.registry, multiprocess_mode="livesum",
        )  # fmt: skip
        self.rate_emitter = Gauge(
            "amqpjobs_rate_limit_emitter", "1 while this process mints the rate-limited job's tokens.", ["job"],
            registry=self.registry, multiprocess_mode="livesum",
        )  # fmt: skip
        self.rate_tokens = Counter(
            "amqpjobs_rate_limit_tokens", "Rate-limit tokens minted.", ["job"], registry=self.registry
        )
        self.paused = Gauge(
            "amqpjobs_paused", "1 while an operator pauses the job queue.", ["queue", "reason"],
            registry=self.registry, multiprocess_mode="livemax",
        )  # fmt: skip
        self.paused_since = Gauge(
            "amqpjobs_paused_since_seconds", "When the job queue was paused (Unix time; 0 when not).", ["queue"],
            registry=self.registry, multiprocess_mode="livemax",
        )  # fmt: skip
        self._pause_reasons: dict[str, str] = {}
        self._in_flight: dict[str, Any] = {}
        self._per_job: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
        self._counted: dict[tuple[str, str, str], Any] = {}

    def events_dropped_one(self) -> None:
        """Count one outcome event not published."""
        self.events_dropped.inc()

    def results_write_failed(self, count: int) -> None:
        """Count ``count`` records the results store did not take."""
        self.results_write_failures.inc(count)

    def paused_as(self, queue: str, reason: str | None, since: float = 0.0) -> None:
        """Job queue ``queue`` is paused for ``reason`` since ``since`` (Unix time), or not (``reason`` None)."""
        old = self._pause_reasons.get(queue)
        if old is not None and old != (reason or ""):
            self.paused.labels(queue, old).set(0)  # multiprocess mode keeps a removed series' last value
            self.paused.remove(queue, old)
        self._pause_reasons[queue] = reason or ""
        self.paused.labels(queue, reason or "").set(0 if reason is None else 1)
        self.paused_since.labels(queue).set(since if reason is not None else 0)

    def in_flight_of(self, queue: str) -> Any:
        """The ``amqpjobs_in_flight`` gauge of job queue ``queue`` (looked up once per queue)."""
        child = self._in_flight.get(queue)
        if child is None:
            child = self._in_flight[queue] = self.in_flight.labels(queue)
        return child

    def observe(self, job: str, queue: str, outcome: str, duration: float | None, latency: float | None,
                timed_out: bool) -> None:  # fmt: skip
        """Record one delivery's outcome.

        Counts it by ``outcome``, observes the handler duration (seconds; None when it did
        not run), the queue latency (seconds; first attempts only, else None) and a timeout.
        Label children are looked up once per label set (``labels()`` costs a lock per call).
        """
        key = (job, queue)
        children = self._per_job.get(key)
        if children is None:
            children = self._per_job[key] = (
                self.duration.labels(job, queue), self.latency.labels(job, queue), self.timeouts.labels(job, queue)
            )  # fmt: skip
        counted = self._counted.get((job, queue, outcome))
        if counted is None:
            counted = self._counted[(job, queue, outcome)] = self.jobs.labels(job, queue, outcome)
        counted.inc()
        if duration is not None:
            children[0].observe(duration)
        if latency is not None:
            children[1].observe(max(0.0, latency))
        if timed_out:
            children[2].inc()

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Current value of one sample (e.g. ``amqpjobs_jobs_total``), 0.0 when absent."""
        value = self.registry.get_sample_value(name, labels or {})
        return 0.0 if value is None else value


class MetricsServer:
    """Serves ``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port`` from a daemon thread.

    Args:
        metrics: The worker's metrics, or a registry to serve (the ``consume --processes N``
            supervisor's, which sums its children's).
        ready: Returns (ready?, reason) for ``/readyz``.
        heartbeat: Returns the ``time.monotonic()`` of the event loop's last heartbeat, or
            (the supervisor) returns (alive?, reason) for ``/healthz`` itself.
        host: Interface to bind (default loopback).
        port: TCP port (0 picks a free one; see :attr:`port` after :meth:`start`).
        stale_after: Seconds without a heartbeat after which ``/healthz`` answers 503.
    """

    def __init__(
        self,
        metrics: WorkerMetrics | CollectorRegistry,
        ready: Callable[[], tuple[bool, str]],
        heartbeat: Callable[[], float] | Callable[[], tuple[bool, str]],
        host: str = "127.0.0.1",
        port: int = 0,
        stale_after: float = 10.0,
    ) -> None:
        self._metrics_app = make_wsgi_app(metrics.registry if isinstance(metrics, WorkerMetrics) else metrics)
        self._ready = ready
        self._heartbeat = heartbeat
        self._host = host
        self._port = port
        self._stale_after = stale_after
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port."""
        return self._server.server_port if self._server is not None else self._port

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            beat = self._heartbeat()
            if isinstance(beat, tuple):
                ok, text = beat
            else:
                age = time.monotonic() - beat
                ok = age <= self._stale_after
                text = f"alive: event loop heartbeat {age:.1f}s ago" if ok else f"event loop stuck for {age:.1f}s"
            return _text(start_response, 200 if ok else 503, text)
        if path == "/readyz":
            ok, reason = self._ready()
            return _text(start_response, 200 if ok else 503, reason)
        if path != "/metrics":
            return _text(start_response, 404, "not found: use /metrics, /healthz or /readyz")
        return self._metrics_app(environ, start_response)  # type: ignore[no-any-return]

    def start(self) -> None:
        """Bind and serve in a daemon thread.

        Raises:
            OSError: the port can't be bound.
        """

        class QuietHandler(WSGIRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = make_server(self._host, self._port, self._app, handler_class=QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="amqpjobs-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _text(start_response: Callable[..., Any], status: int, text: str) -> list[bytes]:
    phrase = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
    body = (text + "\n").encode()
    start_response(
        f"{status} {phrase}", [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
    )
    return [body]
