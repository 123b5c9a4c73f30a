"""Plain-function handlers' threads, and what a stopping worker does about those past its grace (README "Workers").

A thread can't be stopped. The rule: the broker must not get a delivery back (its channel
or connection closed) while that delivery's handler thread may still run, or the
redelivery runs beside it and the side effect is committed twice, at once. So a worker
stopping past its grace, with handler threads still running (their deliveries unacked):

- when it is its process's whole life (``amqpjobs consume``, each ``--processes`` child):
  right at the grace's end (each ms later is one in which a thread may finish its effect
  and still be abandoned), flushes the acks of finished jobs, logs its stop lines, flushes
  logging and ends the process with ``os._exit(1)``. The threads die with the process; only
  then does the OS close the socket and the broker requeue. Nothing after that runs (the
  app's stores are not closed, owed ledger writes are left to their leases: as after a kill);
- awaited in a program of its user's (:meth:`~amqpjobs.runtime.worker.Worker.run`,
  :meth:`~amqpjobs.runtime.worker.Worker.shutdown`): a hard exit would end that program,
  so it cancels their tasks, flushes the acks of finished jobs and closes its publishers
  (their confirms in), and keeps the consumer connection open, the deliveries unacked,
  until the threads end (however long that takes), then closes.

An async handler is cancelled at the grace and ends with its task: it is none of these,
unless it goes on after its cancellation; then :mod:`amqpjobs.runtime.stopping` treats it
the same way once :data:`~amqpjobs.runtime.stopping.CANCEL_BOUND` has passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NoReturn

log = logging.getLogger("amqpjobs.worker")

#: Seconds a worker's own process, its worker stopped, waits for the threads the app left running.
EXIT_BOUND = 5.0


class HandlerThreads:
    """A worker's thread pool for plain-function handlers, and the runs still going in it."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._running: set[Future[Any]] = set()  # submitted, not yet returned (a cancelled task's thread included)
        self._lock = threading.Lock()  # a future's done callback runs in its thread

    def open(self, threads: int, prefix: str) -> None:
        """Make the pool: ``threads`` (at least 1) threads named ``prefix``-N."""
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix=prefix)

    def run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` in a pool thread, counted as running until it returns; its result as an asyncio future.

        Cancelling that future cancels a run not started yet; one started goes on (and counts).

        Raises:
            RuntimeError: :meth:`open` was not called (the worker has not started).
        """
        if self._pool is None:
            raise RuntimeError("the worker has not started: no thread pool for plain-function handlers")
        future = self._pool.submit(fn, *args)
        with self._lock:
            self._running.add(future)
        future.add_done_callback(self._ended)
        return asyncio.wrap_future(future)

    def _ended(self, future: Future[Any]) -> None:
        with self._lock:
            self._running.discard(future)

    @property
    def running(self) -> int:
        """How many handler threads run now."""
        with self._lock:
            return len(self._running)

    async def before_close(self, own_process: bool, stopped: str | None) -> None:
        """The stop's step before the consumer connection closes: past the grace, no delivery back beside its thread.

        With no handler thread running, returns at once. Else, ``own_process``: logs why,
        then ``stopped`` (the worker's last line; None: none to log), flushes logging and
        ends the process (exit 1), never returning. Not ``own_process``: logs why, and
        returns once every handler thread has ended.
        """
        running = self.running
        if not running:
            return
        why = f"{running} plain-function handler thread(s) still running can't be stopped: "
        if own_process:
            log.warning(why + "the process ends at once, before its connection closes, so that no abandoned thread "
                        "finishes beside its redelivery")  # fmt: skip
            if stopped is not None:
                log.info(stopped)
            end_process(1)
        log.warning(why + "the worker keeps its connection (their deliveries unacked) until they end, so that none "
                    "finishes beside its redelivery")  # fmt: skip
        began = time.monotonic()
        with self._lock:
            futures = [asyncio.wrap_future(f) for f in self._running]
        if futures:  # the last may have ended meanwhile
            await asyncio.wait(futures)
        log.info("the handler thread(s) ended after %.1fs; closing the connection", time.monotonic() - began)

    def close(self) -> None:
        """Shut the pool down without waiting (runs not started are cancelled)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def end_process(code: int) -> NoReturn:
    """End this process now with ``code``, its threads with it: logging and stdio flushed first, nothing else runs."""
    logging.shutdown()  # every handler flushed: the stop lines are out
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream: nothing more to say
            stream.flush()
    os._exit(code)


#: Whether this process runs a worker (or a supervisor of some), and whether its exit's bound is armed.
_bound = {"wanted": False, "armed": False}


def want_exit_bound() -> None:
    """Say this process runs a worker (``amqpjobs consume``, a supervisor, a child): its end is bounded.

    However the command ends, its entry point then arms :func:`bound_the_exit` (:func:`bound_if_wanted`),
    so a thread the app left running (at import, or from a job) never keeps the process after an error.
    """
    _bound["wanted"] = True


def bound_if_wanted(code: object) -> None:
    """At a process's entry point, as it exits with ``code`` (a ``SystemExit``'s): :func:`bound_the_exit` if wanted.

    ``code``: None is 0, an int itself, anything else 1 (as Python's own exit). Nothing unless
    :func:`want_exit_bound` was called (a command run in-process, as by click's ``CliRunner``, is no process's end).
    """
    if _bound["wanted"]:
        bound_the_exit(0 if code is None else code if isinstance(code, int) else 1)


def bound_the_exit(code: int, seconds: float = EXIT_BOUND) -> None:
    """Arm the end of a worker's own process whose worker stopped (exit ``code``): at most ``seconds`` from now.

    Python's end waits for every non-daemon thread and ``asyncio.Runner``'s close for the
    loop's default executor: a thread an app's job or its import left running (its own
    ``threading.Thread``, a library's poller, ``asyncio.to_thread`` or ``run_in_executor``
    work that goes on) would keep the process up after the worker stopped, so that SIGTERM
    never ends it. A daemon thread waits ``seconds``; if the process is still there, it logs
    a WARNING naming the threads still running and ends the process (:func:`end_process`,
    the same ``code``). Call it once the worker's run returned, before the Runner closes; an
    error that ends the command arms it at the entry point (:func:`bound_if_wanted`). Armed once.
    """
    if _bound["armed"]:
        return
    _bound["armed"] = True
    main = threading.main_thread()
    there = [t for t in threading.enumerate() if t is not main and not t.daemon]  # the app's (none of ours is)

    def watch() -> None:
        time.sleep(seconds)
        left = [t.name for t in there if t.is_alive()]
        log.warning(
            "%d thread(s) the app left running (%s) still run %gs after the worker stopped: the process ends "
            "without them (exit %d)", len(left), ", ".join(left) or "none: an exit function waits", seconds, code,
        )  # fmt: skip
        end_process(code)

    threading.Thread(target=watch, name="amqpjobs-exit-bound", daemon=True).start()
