"""Graceful stop on SIGTERM/SIGINT for long-running commands (worker, scheduler)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from amqpjobs.jobs.failure import stops_the_run
from amqpjobs.runtime import held_signals

log = logging.getLogger("amqpjobs.signals")

#: Seconds the event loop gets to answer the stop's watch, past the grace, before the process ends (exit 1).
LOOP_ANSWER = 5.0


@contextmanager
def stop_on_signals(request_stop: Callable[[], None], what: str, grace: float | None = None) -> Iterator[None]:
    """Within the block, the first SIGTERM/SIGINT calls ``request_stop``; a second exits at once.

    With ``grace`` (a worker's ``--grace``, seconds), a process whose event loop is blocked
    past it (an ``async def`` handler in ``time.sleep``: the stop's own timer can't fire)
    ends with exit 1 once the loop has not answered for :data:`LOOP_ANSWER` s, from 1 s
    after the grace on (:func:`_watch_the_loop`); a loop that answers is left to stop.

    The immediate exit uses ``os._exit(128 + signum)``: unacked deliveries return to their
    queues by themselves (the broker requeues them when the connection drops). Before, from
    the console script's first moment, :mod:`amqpjobs.runtime.held_signals` answers them.

    Args:
        request_stop: Starts a graceful stop (must not block).
        what: What the graceful stop does, for the log line (e.g. "draining").
        grace: The worker's grace (seconds) for the watch of a blocked loop; None: no watch.
    """
    loop = asyncio.get_running_loop()
    seen = 0

    def on_signal(signum: int) -> None:
        nonlocal seen
        seen += 1
        if seen == 1:
            log.info("signal %d: %s (a second signal exits at once)", signum, what)
            request_stop()
        else:
            log.warning("second signal %d: exiting now; unacked deliveries return to their queues", signum)
            os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    over = threading.Event()  # the block is left: the watch of a blocked loop ends
    _second_exits_without_the_loop(loop, grace, over)
    held_signals.end()
    try:
        yield
    finally:
        over.set()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if seen:
            exit_at_once_on_signals()


def _second_exits_without_the_loop(loop: asyncio.AbstractEventLoop, grace: float | None, over: threading.Event) -> None:
    """Make a second SIGTERM/SIGINT exit at once even while the event loop is blocked.

    The loop's handlers (``loop.add_signal_handler``) run only when the loop turns, and an
    ``async def`` handler that blocks it (``time.sleep(600)``, a CPU-bound loop) would keep a
    second Ctrl-C from ending the process until it returns. The signal module still wakes
    the loop for the first signal (its wakeup fd is written by the C-level handler whatever
    Python handler is set), and Python runs the handler set here in the main thread between
    bytecodes, also while that thread waits in ``time.sleep``: the second signal seen here
    ends the process (``128 + signal``), as the loop's own handler would have. With
    ``grace``, the first starts the watch of :func:`_watch_the_loop`.
    """
    seen = 0

    def counted(signum: int, frame: FrameType | None) -> None:
        nonlocal seen
        seen += 1
        if seen == 1 and grace is not None:
            threading.Thread(
                target=_watch_the_loop, args=(loop, grace, over), name="amqpjobs-stop-watch", daemon=True
            ).start()
        if seen > 1:
            log.warning("second signal %d: exiting now; unacked deliveries return to their queues", signum)
            os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, counted)


def _watch_the_loop(loop: asyncio.AbstractEventLoop, grace: float, over: threading.Event) -> None:
    """From 1 s past ``grace`` on, end the process (exit 1) once ``loop`` leaves a call unanswered ``LOOP_ANSWER`` s.

    Runs in a thread of its own from the first signal. The worker's stop runs on the loop
    (its grace timer, the cancellations after it): a loop that answers is stopping, one that
    does not is blocked by app code, and only the process's end stops that (its unacked
    deliveries return to their queues). The watch ends with the stop's block (``over``): what
    the process does after it (closing the app, waiting for the app's threads) is no stop. The
    line is logged from yet another thread, waited for 1 s at most: a main thread blocked in a
    log handler's write holds that handler's lock.
    """
    if over.wait(grace + 1.0):
        return
    while True:
        answered = threading.Event()
        try:
            loop.call_soon_threadsafe(answered.set)
        except RuntimeError:  # the loop is closed: the process is ending by itself
            return
        if answered.wait(LOOP_ANSWER) or over.is_set():
            if over.wait(1.0):
                return
            continue
        text = (
            "the event loop has not answered for %gs, %gs after the stop began (grace %gs): an async handler blocks "
            "it; exiting now (exit 1), unacked deliveries return to their queues"
        )
        line = threading.Thread(target=log.error, args=(text, LOOP_ANSWER, grace + 1.0 + LOOP_ANSWER, grace),
                                daemon=True)  # fmt: skip
        line.start()
        line.join(1.0)
        os._exit(1)


def exit_at_once_on_signals() -> None:
    """From now on SIGTERM or SIGINT exits at once (``128 + signal``): it is a second signal.

    For what a process still does after its stop's loop handlers are gone (closing the app,
    the loop's thread pool waiting for a management API request), so that a second signal
    there still ends it as the README says (143 or 130), not by Python's default handling.
    """

    def second(signum: int, frame: FrameType | None) -> None:
        log.warning("second signal %d: exiting now", signum)
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, second)


def sigint_raises() -> bool:
    """Whether a SIGINT to this process may now raise ``KeyboardInterrupt`` in its main thread.

    True under Python's own handler (``signal.default_int_handler``), and under
    ``asyncio.Runner``'s (``asyncio.run``: its second Ctrl-C raises). False under a worker's
    :func:`stop_on_signals` (the loop's handler only starts the graceful stop): there, a
    ``KeyboardInterrupt`` can only be a handler's own raise.
    """
    handler = signal.getsignal(signal.SIGINT)
    func = getattr(handler, "func", handler)  # asyncio.Runner installs a functools.partial of its method
    return handler is signal.default_int_handler or isinstance(getattr(func, "__self__", None), asyncio.Runner)


def ends_the_task(exc: BaseException) -> bool:
    """Whether ``exc``, raised by app code on the loop's current task, stops that task instead of failing its job.

    :func:`amqpjobs.jobs.failure.stops_the_run` for the current task: its cancellation (the
    worker's stop past its grace), or a ``KeyboardInterrupt`` that may be a real Ctrl-C.
    """
    task = asyncio.current_task()
    return stops_the_run(exc, task.cancelling() if task is not None else 0, sigint_raises())
