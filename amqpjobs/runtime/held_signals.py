"""SIGTERM and SIGINT from a process's first moment until its event loop's handlers take over.

``amqpjobs consume`` and ``amqpjobs schedule run`` import the CLI (aio-pika, pydantic, ...:
0.5 s on a quiet machine, over 1 s under load), then the app's module (as long as its code
takes, maybe forever: a database that does not answer), before
:func:`amqpjobs.runtime.signals.stop_on_signals` (or the ``--processes`` supervisor) puts its
loop's handlers in place. Python's own handling would end a SIGTERM there with no line (exit
by the signal) and a SIGINT with a ``KeyboardInterrupt`` traceback, where the README promises
a stop with exit 0 "also while it is still starting".

The console script (:mod:`amqpjobs.__main__`) calls :func:`hold` before it imports anything
else: a signal is noted, not acted on, while the command is not known yet. Then one of two:

- :func:`release`, for a one-shot command: the handlers from before are back, and the held
  signal, if any, is returned for the caller to raise (it ends the command as it would have);
- :func:`exit_on_signal`, for a long-running one once its logging is set up: until :func:`end`
  (its loop's handlers are in place), a signal, or the one held, ends the process at once with
  exit 0 and a line. Nothing was taken from the broker yet, so there is nothing to drain, and
  nothing to wait for: the exit is ``os._exit`` from a thread of ours woken by the signal
  (``signal.set_wakeup_fd``), so it comes also while the main thread is blocked in C code
  (a database driver's connect) or a thread the app started would keep the interpreter alive.

A second signal while held exits at once with ``128 + signal``, as a second signal does once
the loop runs. A process that never called :func:`hold` (a ``Worker`` in your own program, a
``--processes`` child) is not affected.
"""

from __future__ import annotations

import os
import signal
import sys

TYPE_CHECKING = False  # typing's idiom without importing typing: this module is the console script's first
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType
    from typing import Any, Literal

#: The signals held.
SIGNALS = (signal.SIGTERM, signal.SIGINT)

_mode: Literal["off", "hold", "exit"] = "off"
_held: list[int] = []
_exit_once = [True]  # taken by the first _exit_now
_previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}  # the handlers hold() replaced


def hold() -> None:
    """Hold SIGTERM and SIGINT from now on.

    A signal ignored when the process started (``SIG_IGN``: SIGINT for a job a
    non-interactive shell put in the background, ``nohup``) stays ignored. Off the main
    thread (where no handler can be set) this does nothing.
    """
    global _mode
    _held.clear()
    _previous.clear()
    _mode = "hold"
    for sig in SIGNALS:
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue
        try:
            _previous[sig] = signal.signal(sig, _on_signal)
        except ValueError:  # not the main thread
            _mode = "off"
            return


def _say(line: str) -> None:
    """Write ``line`` to stderr (while held, logging is not set up yet)."""
    try:  # noqa: SIM105  (contextlib is one import more before the hold)
        os.write(2, f"{line}\n".encode())
    except OSError:  # stderr closed or full: the exit still comes
        pass


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _mode == "exit":  # also the watcher thread, woken by the same signal (if a loop took the wakeup fd: not)
        _exit_now(signum)
    if _held:  # a second one: nothing was taken from the broker, nothing to wait for
        _say(f"second signal {signum} while starting: exiting now")
        os._exit(128 + signum)
    _held.append(signum)


def _exit_now(signum: int) -> None:
    """The line, then exit 0 at once (no interpreter shutdown: it could wait for the app's threads).

    From the main thread's handler or the watcher thread, whichever runs first: the other returns.
    """
    try:
        _exit_once.pop()  # atomic: one caller gets it
    except IndexError:
        return
    logging = sys.modules.get("logging")  # set up by then (exit_on_signal comes after the command's logging)
    if logging is not None:
        logging.getLogger("amqpjobs.signals").info(
            "signal %d while starting: exiting (nothing was taken from the broker yet)", signum
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
    os._exit(0)


def _watch(read_fd: int) -> None:
    """The watcher thread: each signal's number comes as a byte (``set_wakeup_fd``); acted on in exit mode only."""
    while data := os.read(read_fd, 1):
        if _mode == "exit" and data[0] in SIGNALS:  # not a signal the app set a handler of its own for
            _exit_now(data[0])


def exit_on_signal() -> None:
    """From now until :func:`end`, a signal ends the process at once with exit 0, after an INFO line.

    At once when a signal is held already; else a watcher thread (daemon) woken by the signal
    exits, wherever the main thread is then (importing the app, connecting, blocked in C code).
    """
    global _mode
    if _mode != "hold":
        return
    if _held:
        _exit_now(_held.pop())
    import threading

    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # set_wakeup_fd's rule
    signal.set_wakeup_fd(write_fd)
    _mode = "exit"
    threading.Thread(target=_watch, args=(read_fd,), name="amqpjobs-start-signals", daemon=True).start()


def end() -> None:
    """Stop; call it once your own handlers replaced ours (``loop.add_signal_handler`` for both signals).

    The loop's handlers set a wakeup fd of their own (asyncio's and uvloop's); the watcher
    thread's pipe stays open (a closed fd number could be reused by a file the signal would
    then write to), and the watcher ignores what may still come.
    """
    global _mode
    _mode = "off"


def release() -> int | None:
    """Stop and put the handlers back (Python's); the signal held, if any, for the caller to act on.

    ``signal.raise_signal`` of it ends the process as it would have ended (by SIGTERM; a
    ``KeyboardInterrupt`` for SIGINT). After :func:`exit_on_signal` (a long-running command
    that failed before its loop's handlers) the handlers are put back too, so that its error's
    exit code stands.
    """
    global _mode
    if _mode == "off":
        return None
    if _mode == "exit":
        signal.set_wakeup_fd(-1)  # ours: no loop set its own
    _mode = "off"
    for sig, handler in _previous.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    return _held.pop() if _held else None


del TYPE_CHECKING
