"""One worker process under the ``consume --processes N`` supervisor (``python -m amqpjobs.runtime.child``).

The supervisor (:mod:`amqpjobs.runtime.supervisor`) starts this module with one JSON
line on stdin (:class:`ChildSpec`: the app reference, the worker options, the broker
settings — credentials travel on the pipe, never on a command line), and keeps stdin
open: its end (the supervisor is gone, even by SIGKILL) stops this worker as SIGTERM
would, or, while the app still loads, ends the process at once. The child answers on
stdout with status lines, ``STATUS_PREFIX`` + a JSON object:

- ``{"port": N}``: its own ``/metrics``, ``/healthz``, ``/readyz`` (loopback, port 0), which
  the supervisor asks for health; metrics go to ``$PROMETHEUS_MULTIPROC_DIR`` (prometheus
  client's multiprocess mode), where the supervisor sums every child's;
- ``{"ready": true}``: consuming every assigned queue (a later exit is no crash loop);
- ``{"error": "...", "kind": "ConfigurationError", "final": false}``: why it could not start
  (the supervisor's crash-loop error repeats it; ``final``: no restart can change it, the
  supervisor stops at once, :attr:`~amqpjobs.errors.AmqpJobsError.final`).

Other stdout lines (a handler's ``print``) are the app's; the supervisor passes them on.
Every log line names the child (``[child N]``; ``"child": N`` in JSON lines).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from amqpjobs.errors import AmqpJobsError, BrokerError
from amqpjobs.exit_codes import exit_code
from amqpjobs.runtime.handler_threads import bound_the_exit
from amqpjobs.runtime.loading import load_app, loop_factory
from amqpjobs.runtime.logs import configure_logging
from amqpjobs.runtime.metrics import MetricsServer, WorkerMetrics
from amqpjobs.runtime.processes import close_app, starting_again
from amqpjobs.runtime.signals import stop_on_signals
from amqpjobs.runtime.sqlite_open import no_new_files
from amqpjobs.runtime.worker import Worker
from amqpjobs.runtime.worker_config import WorkerOptions
from amqpjobs.wire.channel_room import channel_limit, with_limit_fix
from amqpjobs.wire.errors import LIBRARY_ERRORS, library_error
from amqpjobs.wire.settings import BrokerSettings
from amqpjobs.wire.urls import redact_text

#: What starts a status line on a child's stdout (a line of the app's own never does by chance).
STATUS_PREFIX = "\x1eamqpjobs-child "

log = logging.getLogger("amqpjobs.worker")


@dataclasses.dataclass(frozen=True)
class ChildSpec:
    """What a child runs, as the supervisor sends it (one JSON object).

    Attributes:
        app_ref: ``module:attribute`` of the App.
        index: The child's number, 1..N (in its log lines and ``$AMQPJOBS_CHILD``).
        options: The worker options (every child gets the same).
        settings: The broker settings (with credentials: sent over the stdin pipe only).
        metrics: Serve metrics and health on a loopback port of its own (the supervisor
            serves ``--metrics-port``).
        log_level: Level of amqpjobs loggers (``logging.INFO``, ``logging.DEBUG``).
        log_json: One JSON object per log line.
        loop: The event loop (:data:`~amqpjobs.runtime.loading.LOOPS`).
        stores_opened: The supervisor loaded the app, so its SQLite stores' files were opened (created)
            first: the child's first opens never create one (:func:`~amqpjobs.runtime.sqlite_open.no_new_files`).
    """

    app_ref: str
    index: int
    options: WorkerOptions
    settings: BrokerSettings
    metrics: bool = False
    log_level: int = logging.INFO
    log_json: bool = False
    loop: str = "asyncio"
    stores_opened: bool = False

    def to_json(self) -> str:
        """The spec as one JSON line (no newline inside)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ChildSpec:
        """Read :meth:`to_json`'s output back (lists become the tuples the dataclasses hold)."""
        doc = json.loads(text)

        def tuples(fields: dict[str, Any]) -> dict[str, Any]:
            return {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}

        doc["options"] = WorkerOptions(**tuples(doc["options"]))
        doc["settings"] = BrokerSettings(**tuples(doc["settings"]))
        return cls(**doc)


def status(**fields: Any) -> None:
    """Write one status line for the supervisor to stdout."""
    sys.stdout.write(STATUS_PREFIX + json.dumps(fields) + "\n")
    sys.stdout.flush()


class _SupervisorWatch:
    """Watches stdin from the child's first moment: its end (the supervisor is gone) stops the worker.

    A worker drains (as on SIGTERM); before there is one (the app still loading, maybe
    forever: a database that does not answer) the process exits at once with
    :data:`EXIT_NO_SUPERVISOR`: nothing was taken from the broker, and nobody would stop it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._stop: Callable[[], None] | None = None
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="amqpjobs-supervisor-watch", daemon=True).start()

    def watch(self, stop: Callable[[], None]) -> None:
        """From now on the supervisor's end calls ``stop`` (the worker's stop request: it drains)."""
        with self._lock:
            self._stop = stop

    def _watch(self) -> None:  # raw reads: a buffered reader's lock would block the interpreter's exit
        while os.read(0, 4096):
            pass
        with self._lock:
            stop = self._stop
            if stop is None:
                log.warning("the supervisor is gone while this child starts: exiting (nothing was taken yet)")
                os._exit(EXIT_NO_SUPERVISOR)
        log.warning("the supervisor is gone: draining")
        self._loop.call_soon_threadsafe(stop)


async def _report_ready(worker: Worker) -> None:
    await worker.ready.wait()
    while not worker.readiness()[0]:  # noqa: ASYNC110 -- a computed state (holding, lanes), no event to wait on
        await asyncio.sleep(0.05)
    status(ready=True)


async def run_child(spec: ChildSpec) -> int:
    """Run one child's worker until SIGTERM/SIGINT or the supervisor's end; the process exit code.

    Returns:
        0 after a clean drain, 1 when in-flight work was abandoned; when the worker could not start,
        or the broker's refusal stopped it, the code of its error (after its ``error`` status line), as
        one ``amqpjobs consume`` exits with (:func:`~amqpjobs.exit_codes.exit_code`: 3 for the broker's).
        A plain-function handler's thread still running after the grace ends the process at once
        instead (exit 1, :mod:`amqpjobs.runtime.handler_threads`).
    """
    supervisor = _SupervisorWatch(asyncio.get_running_loop())
    if spec.stores_opened:  # the supervisor's load of the app opened each SQLite store first: none is created here
        no_new_files()
    try:
        app = load_app(spec.app_ref)
        metrics = WorkerMetrics() if spec.metrics else None
        worker = Worker(app, spec.settings, spec.options, metrics=metrics)
    except AmqpJobsError as exc:
        return _failed(exc)
    current, asked = [worker], []  # a start a lost connection cut short begins again with another worker

    def stop() -> None:
        asked.append(1)
        current[0].request_stop()

    server = None
    if metrics is not None:
        server = MetricsServer(metrics, lambda: current[0].readiness(), lambda: current[0].heartbeat_at,
                               "127.0.0.1", 0)  # fmt: skip
        server.start()
        status(port=server.port)
    supervisor.watch(stop)
    reporter = [asyncio.create_task(_report_ready(worker))]

    def renew() -> None:
        current[0] = Worker(app, spec.settings, spec.options, metrics=metrics)
        reporter[0].cancel()
        reporter[0] = asyncio.create_task(_report_ready(current[0]))

    try:
        with stop_on_signals(stop, "no new deliveries; draining", spec.options.grace):
            return await starting_again(  # past the grace, a handler thread still running ends the process
                lambda: current[0].run(own_process=True), renew, lambda: current[0].ready.is_set(), asked,
                spec.settings, "worker stopped while starting: no delivery was taken; exit 0",
                lambda: current[0].start_cut, lambda: current[0].start_cut_code,
            )  # fmt: skip
    except AmqpJobsError as exc:
        return _failed(exc)
    except LIBRARY_ERRORS as exc:  # a client-library error no wire call translated: the broker's, as `consume` says
        return _failed(library_error(exc))
    finally:
        reporter[0].cancel()
        if server is not None:
            server.stop()
        await close_app(app)


def _failed(exc: AmqpJobsError) -> int:
    """Log and report why the worker stopped (``kind``: ``BrokerError`` for any of the broker's); its exit code.

    ``final`` (the supervisor stops every child at once) when no restart can change it, a channel limit's refusal too.

    The code a single worker exits with for ``exc`` (:func:`~amqpjobs.exit_codes.exit_code`: 3 for the
    broker's, 2 for a configuration error), the one its stop line says.
    """
    kind = "BrokerError" if isinstance(exc, BrokerError) else type(exc).__name__
    message = redact_text(with_limit_fix(str(exc)) if isinstance(exc, BrokerError) else str(exc))
    log.error("%s", message)
    # a channel limit (channel_max, a user's max-channels) refusing it is met by every restart until an operator acts
    status(error=message, kind=kind, final=exc.final or channel_limit(message))
    return exit_code(exc)


#: Exit codes of a child that got no spec: its supervisor is gone (stdin ended first), or it sent a bad line.
EXIT_NO_SUPERVISOR = 1
EXIT_BAD_SPEC = 2


def read_spec(line: bytes) -> ChildSpec:
    """The spec from the supervisor's first stdin line; exits the process when there is none.

    An empty ``line`` (stdin ended before the supervisor wrote it: the supervisor is gone)
    exits :data:`EXIT_NO_SUPERVISOR` quietly; a line that is no spec prints one line to stderr
    and exits :data:`EXIT_BAD_SPEC` (naming the error, not the line: it holds credentials).
    """
    if not line.strip():
        sys.exit(EXIT_NO_SUPERVISOR)
    try:
        return ChildSpec.from_json(line.decode())
    except (ValueError, KeyError, TypeError) as exc:  # JSON and UTF-8 errors are ValueErrors
        problem = " ".join(redact_text(str(exc)).split())
        message = f"amqpjobs child: the supervisor's settings line is not a valid spec: {type(exc).__name__}: {problem}"
        sys.stderr.write(message + "\n")
        status(error=message, kind="ConfigurationError")
        sys.exit(EXIT_BAD_SPEC)


def main() -> None:
    """Entry point: read the spec line from stdin, set up logging, run, exit with the worker's code."""
    line = b""
    while not line.endswith(b"\n") and (chunk := os.read(0, 65536)):
        line += chunk
    spec = read_spec(line)
    configure_logging(spec.log_level, json_lines=spec.log_json, child=spec.index)
    try:
        with asyncio.Runner(loop_factory=loop_factory(spec.loop)) as runner:
            code = runner.run(run_child(spec))
            bound_the_exit(code)  # threads the app left running don't keep the process (nor the Runner's close)
    except BaseException:  # an error of none of ours (run_child maps those to codes): Python's exit 1, bounded too
        bound_the_exit(1)
        raise
    sys.exit(code)


if __name__ == "__main__":
    main()
