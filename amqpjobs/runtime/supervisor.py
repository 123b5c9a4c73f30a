"""``amqpjobs consume --processes N``: N worker processes under one supervisor (README "Worker processes").

A worker is one Python process on one core; the supervisor starts N children
(:mod:`amqpjobs.runtime.child`, each with ``--concurrency`` slots per job queue) and:

- kills a child not ready ``start_timeout`` s (``--start-timeout``, default 2 minutes) after its
  start (its app's import hangs): an exit before ready like any other;
- restarts a child that exits, after a backoff that doubles with each exit of that child
  in the last 60 s (0.25 s, 0.5 s, ... at most 30 s);
- stops everything when one child exits before it became ready ``CRASH_LOOP_EXITS`` (5)
  times within ``CRASH_LOOP_WINDOW`` (60 s) — a crash loop (the app module's own error at
  import, a work queue missing on the broker): the error is raised again with the child's
  own message (a poison job that kills a *ready* child is the poison-containment bound's
  business, not this), or at once on an error no restart can change (``AmqpJobsError.final``),
  before ready or after it (the broker refusing a ready child's every reconnect: a user's
  ``max-channels`` set at run time, :mod:`amqpjobs.runtime.hard_closes`);
- on the first SIGTERM/SIGINT sends SIGTERM to every child (each drains as a single worker
  does) and returns 0 when all exited cleanly; a second signal is passed on (the children
  exit at once) and the exit code is then 128 + that signal, as a single worker's (130 for
  Ctrl-C); a child still running ``KILL_AFTER`` (3) s later is killed (SIGKILL: it ignores
  SIGTERM, or its main thread is stuck). Children run in a session of their own, so a
  terminal's Ctrl-C reaches them once, through the supervisor; a child whose supervisor died drains by itself;
- with ``metrics_port``: one ``/metrics`` summing every child's metrics, the exited ones'
  counts included (prometheus-client's multiprocess mode: each child writes its values to
  files in a directory of the supervisor's), and ``/healthz`` and ``/readyz`` that answer
  503 while any child is starting, restarting, or its own endpoint answers 503 (stalled,
  not consuming).

The app is imported by each child; ``consume`` imports and checks it once before it starts
the supervisor (:mod:`amqpjobs.runtime.preflight`), so what every child would refuse at its
start is refused at once, without a crash loop. ``schedule run`` is not multiplied: it stays one
process (replicas elect a leader among themselves).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from amqpjobs.errors import (
    AmqpJobsError,
    BrokerError,
    ConfigurationError,
    LedgerUnavailableError,
    PayloadStoreError,
    ResultsUnavailableError,
)
from amqpjobs.runtime import held_signals
from amqpjobs.runtime.child import STATUS_PREFIX, ChildSpec
from amqpjobs.runtime.metrics import MetricsServer
from amqpjobs.runtime.metrics_folders import new_folder
from amqpjobs.runtime.signals import exit_at_once_on_signals

log = logging.getLogger("amqpjobs.supervisor")

#: Exits before ready, within :data:`CRASH_LOOP_WINDOW` seconds, that make a crash loop.
CRASH_LOOP_EXITS = 5
#: Seconds over which exits before ready are counted.
CRASH_LOOP_WINDOW = 60.0
#: Seconds before the first restart; doubled for each further exit within the window.
FIRST_BACKOFF = 0.25
#: The longest wait before a restart, seconds.
MAX_BACKOFF = 30.0
#: Seconds after the second signal before a child still running is killed (SIGKILL).
KILL_AFTER = 3.0
#: Seconds a child may take from its start to ready (import, connect with its 30 s retry, checks) before it is killed.
DEFAULT_START_TIMEOUT = 120.0
#: The environment variable that tells a child its number (1..N).
CHILD_ENV = "AMQPJOBS_CHILD"
#: prometheus-client's multiprocess directory variable (read by the children's client at import).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass
class Slot:
    """One child's place: the process now in it and what the supervisor knows of it."""

    index: int
    process: asyncio.subprocess.Process | None = None
    state: str = "starting"  # starting | ready | restarting | stopped
    port: int | None = None
    error: str | None = None
    kind: str | None = None
    final: bool = False  # its error is one no restart can change
    was_ready: bool = False  # its last child had become ready before it exited
    exits: deque[float] = field(default_factory=deque)  # monotonic times of exits within the window
    early_exits: deque[float] = field(default_factory=deque)  # of those, exits before ready

    def stopping_because(self) -> str:
        """Why this child's exit stops every child: an error no restart changes, or a crash loop (before ready)."""
        return _NO_RESTART if self.final else f"{CRASH_LOOP_EXITS} times within {CRASH_LOOP_WINDOW:.0f}s"

    def exited(self) -> str:
        """``exited before it was ready``, or ``stopped`` for a ready child (a final error met at run time)."""
        return "stopped" if self.was_ready else "exited before it was ready"


class Supervisor:
    """Runs N children of one spec until stopped (see the module docstring).

    Args:
        spec: What every child runs (its ``index`` is set per child).
        processes: How many children, at least 1.
        metrics_host: Interface for the one metrics and health endpoint.
        metrics_port: Its TCP port (0: a free one, logged); None: no endpoint.
        start_timeout: Seconds from a child's start to ready, after which it is killed (a failed start).
    """

    def __init__(self, spec: ChildSpec, processes: int, metrics_host: str = "127.0.0.1",
                 metrics_port: int | None = None, start_timeout: float = DEFAULT_START_TIMEOUT) -> None:  # fmt: skip
        self._spec = spec
        self._start_timeout = start_timeout
        self._slots = [Slot(i) for i in range(1, processes + 1)]
        self._metrics_host = metrics_host
        self._metrics_port = metrics_port
        self._metrics_dir: str | None = None
        self._stopping = asyncio.Event()
        self._signals = 0
        self._hurried_by: int | None = None  # the second signal, which the exit code reports
        self._fatal: Slot | None = None

    # ------------------------------------------------------------------ running
    async def run(self) -> int:
        """Run until a signal (or a crash loop); the process exit code.

        Returns:
            0 when every child drained cleanly, 1 when one abandoned work or died while draining;
            after a second signal 128 + that signal (130 for SIGINT, 143 for SIGTERM), as a
            single worker's :func:`~amqpjobs.runtime.signals.stop_on_signals`.

        Raises:
            ConfigurationError: a child exited before it was ready 5 times within 60 s, or once (ready
                or not) with an error no restart changes (its own error in the message); BrokerError
                when that error was the broker's.
                Also: the metrics port can't be bound.
        """
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        held_signals.end()  # from here on a signal stops the children (before: the process exits, none started)
        server = None
        try:  # the metrics folder is made inside: its removal below covers a failed bind and a signal
            server = self._serve() if self._metrics_port is not None else None
            codes = await asyncio.gather(*(self._keep(slot) for slot in self._slots))
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            if self._signals:
                exit_at_once_on_signals()
            if server is not None:
                server.stop()
            if self._metrics_dir is not None:
                shutil.rmtree(self._metrics_dir, ignore_errors=True)
        if self._fatal is not None:
            raise self._crash_loop_error(self._fatal)
        clean = all(code in (0, -signal.SIGTERM) for code in codes)  # -SIGTERM: stopped before it took work
        log.info("every child stopped%s", "" if clean else " (some abandoned work or died while draining)")
        if self._hurried_by is not None:
            return 128 + self._hurried_by
        return 0 if clean else 1

    def request_stop(self) -> None:
        """Stop restarting; ask every child to drain (SIGTERM)."""
        if not self._stopping.is_set():
            self._stopping.set()
        for slot in self._slots:
            self._signal_child(slot, signal.SIGTERM)

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info("signal %d: every child drains (a second signal makes them exit at once)", signum)
            self.request_stop()
        else:
            log.warning("second signal %d: children exit now; unacked deliveries return to their queues", signum)
            if self._hurried_by is None:
                self._hurried_by = signum
                asyncio.get_running_loop().call_later(KILL_AFTER, self._kill_the_rest)
            for slot in self._slots:
                self._signal_child(slot, signal.SIGTERM)

    def _kill_the_rest(self) -> None:
        """SIGKILL every child still running :data:`KILL_AFTER` s after the second signal (it can't act on SIGTERM)."""
        for slot in self._slots:
            if slot.process is not None and slot.process.returncode is None:
                log.warning(
                    "killing child %d (pid %d): still running %.0fs after the second signal (SIGTERM ignored or its "
                    "main thread stuck)", slot.index, slot.process.pid, KILL_AFTER,
                )  # fmt: skip
                self._signal_child(slot, signal.SIGKILL)

    @staticmethod
    def _signal_child(slot: Slot, signum: int) -> None:
        if slot.process is not None and slot.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                slot.process.send_signal(signum)

    async def _keep(self, slot: Slot) -> int:
        """Keep a child in ``slot`` until stopped; the last child's exit code."""
        code = 0
        while not self._stopping.is_set():
            code = await self._run_child(slot)
            slot.was_ready = slot.state == "ready"
            if self._stopping.is_set():
                break
            now = time.monotonic()
            for times in (slot.exits, slot.early_exits):
                while times and now - times[0] > CRASH_LOOP_WINDOW:
                    times.popleft()
            slot.exits.append(now)
            if not slot.was_ready:
                slot.early_exits.append(now)
            if slot.final or (not slot.was_ready and len(slot.early_exits) >= CRASH_LOOP_EXITS):
                log.error("child %d %s (exit %s) %s: stopping every child", slot.index, slot.exited(), _exit_text(code),
                          slot.stopping_because())  # fmt: skip
                self._fatal = slot
                self.request_stop()
                break
            delay = min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** (len(slot.exits) - 1))
            slot.state = "restarting"
            log.warning("child %d exited with %s; restarting it in %.2fs", slot.index, _exit_text(code), delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
        slot.state = "stopped"
        return code

    async def _run_child(self, slot: Slot) -> int:
        env = dict(os.environ, **{CHILD_ENV: str(slot.index)})
        if self._metrics_dir is not None:
            env[MULTIPROC_ENV] = self._metrics_dir
        spec = dataclasses.replace(self._spec, index=slot.index, metrics=self._metrics_dir is not None)
        slot.state, slot.port, slot.error, slot.kind, slot.final = "starting", None, None, None, False
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "amqpjobs.runtime.child", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, env=env, start_new_session=True, limit=2**20,
        )  # fmt: skip
        slot.process = process
        log.info("child %d started (pid %d)", slot.index, process.pid)
        overdue = asyncio.get_running_loop().call_later(self._start_timeout, self._start_overdue, slot, process)
        assert process.stdin is not None
        assert process.stdout is not None
        try:
            process.stdin.write(spec.to_json().encode() + b"\n")  # the pipe stays open: its end stops the child
            await process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass
        if self._stopping.is_set():  # stopped while this child was being started
            self._signal_child(slot, signal.SIGTERM)
        async for raw in process.stdout:
            self._on_line(slot, raw.decode("utf-8", "replace"))
        code = await process.wait()
        overdue.cancel()
        process.stdin.close()
        if self._metrics_dir is not None:  # its live gauges go; its counts stay in the sum
            mark_process_dead(process.pid, self._metrics_dir)  # type: ignore[no-untyped-call]
        slot.process = None
        return code

    def _start_overdue(self, slot: Slot, process: asyncio.subprocess.Process) -> None:
        """Kill ``slot``'s child ``process`` when it is still not ready (SIGKILL: it took no work)."""
        if slot.process is process and slot.state == "starting" and process.returncode is None:
            slot.kind = None
            slot.error = f"not ready within {self._start_timeout:g}s of its start {_HANGS}"
            log.warning("child %d (pid %d) %s", slot.index, process.pid, slot.error)
            self._signal_child(slot, signal.SIGKILL)

    def _on_line(self, slot: Slot, line: str) -> None:
        if not line.startswith(STATUS_PREFIX):
            sys.stdout.write(line)  # the app's own output
            sys.stdout.flush()
            return
        doc = json.loads(line[len(STATUS_PREFIX) :])
        if "port" in doc:
            slot.port = int(doc["port"])
        if doc.get("ready"):
            slot.state = "ready"
            log.info("child %d ready", slot.index)
        if "error" in doc:
            slot.error, slot.kind, slot.final = str(doc["error"]), str(doc.get("kind")), doc.get("final") is True

    @staticmethod
    def _crash_loop_error(slot: Slot) -> AmqpJobsError:
        error = slot.error or "no error message (see its log lines above)"
        text = (
            f"worker child {slot.index} {slot.exited()} {slot.stopping_because()}; every child was stopped. "
            f"Its error: {error}"
        )
        return _SERVICE_ERRORS.get(slot.kind or "", ConfigurationError)(text)

    # ------------------------------------------------------------------ metrics and health
    def _serve(self) -> MetricsServer:
        assert self._metrics_port is not None
        self._metrics_dir = new_folder()  # and those killed supervisors left are removed
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self._metrics_dir)  # type: ignore[no-untyped-call]
        server = MetricsServer(registry, self.readiness, self.liveness, self._metrics_host, self._metrics_port)
        try:
            server.start()
        except OSError as exc:
            shutil.rmtree(self._metrics_dir, ignore_errors=True)
            raise ConfigurationError(
                f"can't serve metrics on {self._metrics_host}:{self._metrics_port}: {exc}"
            ) from None
        log.info("metrics and health on http://%s:%d/metrics, /healthz, /readyz", self._metrics_host, server.port)
        return server

    def liveness(self) -> tuple[bool, str]:
        """(alive, reason) for ``/healthz``: every child running and its own ``/healthz`` answering 200."""
        return self._health("/healthz", ("starting", "ready"))

    def readiness(self) -> tuple[bool, str]:
        """(ready, reason) for ``/readyz``: every child ready and its own ``/readyz`` answering 200."""
        return self._health("/readyz", ("ready",))

    def _health(self, path: str, states: tuple[str, ...]) -> tuple[bool, str]:
        if self._stopping.is_set():
            return False, "stopping: every child drains"
        problems: list[str] = []
        good: list[str] = []
        for slot in self._slots:
            port = slot.port
            if slot.process is None or slot.state not in states or port is None:
                problems.append(f"child {slot.index} {slot.state}")
                continue
            status, text = _ask(port, path)
            (good if status == 200 else problems).append(f"child {slot.index}: {text}")
        return (not problems, "; ".join(problems or good))


def _ask(port: int, path: str) -> tuple[int, str]:
    """GET a child's health endpoint: (HTTP status, first line of the answer); 503 when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2.0) as answer:
            return answer.status, answer.read().decode("utf-8", "replace").strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace").strip()
    except OSError as exc:
        return 503, f"does not answer ({exc})"


_NO_RESTART = "with an error no restart can change (an operator must act)"
_HANGS = ("(its app's import or its start hangs): killed; find what it waits for (py-spy dump --pid PID), "
          "or give --start-timeout more")  # fmt: skip
#: A child's error ``kind`` saying a service failed it (exit 3, as in one process), by name; any other is exit 2.
_SERVICE_ERRORS: dict[str, type[AmqpJobsError]] = {
    e.__name__: e for e in (BrokerError, LedgerUnavailableError, ResultsUnavailableError, PayloadStoreError)
}


def _exit_text(code: int) -> str:
    """``code 3`` (the child's exit code, as its stop line says it: ``exit 3``), or ``signal 9``."""
    return f"signal {-code}" if code < 0 else f"code {code}"
