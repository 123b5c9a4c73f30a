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
  exit 0 and a line. Nothing was taken from the broker yet, so there is nothing to drain.

A second signal exits at once with ``128 + signal`` (the first one's exit was caught, or it is
still held), as a second signal does once the loop runs. A process that never called
:func:`hold` (a ``Worker`` in your own program, a ``--processes`` child) is not affected.
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
_exiting = False  # a first signal's exit is under way
_previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}  # the handlers hold() replaced


def hold() -> None:
    """Hold SIGTERM and SIGINT from now on.

    A signal ignored when the process started (``SIG_IGN``: SIGINT for a job a
    non-interactive shell put in the background, ``nohup``) stays ignored. Off the main
    thread (where no handler can be set) this does nothing.
    """
    global _mode, _exiting
    _held.clear()
    _previous.clear()
    _mode, _exiting = "hold", False
    for sig in SIGNALS:
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue
        try:
            _previous[sig] = signal.signal(sig, _on_signal)
        except ValueError:  # not the main thread
            _mode = "off"
            return


def _say(line: str) -> None:
    """Write ``line`` to stderr as our log lines go, when logging is set up (exit mode), else plainly."""
    if _mode == "exit" and (logging := sys.modules.get("logging")) is not None:
        logging.getLogger("amqpjobs.signals").warning("%s", line)
        return
    try:  # noqa: SIM105  (contextlib is one import more before the hold)
        os.write(2, f"{line}\n".encode())
    except OSError:  # stderr closed or full: the exit still comes
        pass


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if _held or _exiting:  # a second one: nothing was taken from the broker, nothing to wait for
        _say(f"second signal {signum} while starting: exiting now")
        os._exit(128 + signum)
    if _mode == "exit":
        _exit_now(signum)
    _held.append(signum)


def _exit_now(signum: int) -> None:
    global _exiting
    _exiting = True
    logging = sys.modules.get("logging")  # set up by then (exit_on_signal comes after the command's logging)
    if logging is not None:
        logging.getLogger("amqpjobs.signals").info(
            "signal %d while starting: exiting (nothing was taken from the broker yet)", signum
        )
    raise SystemExit(0)


def exit_on_signal() -> None:
    """From now until :func:`end`, a signal ends the process at once: ``SystemExit(0)``, after an INFO line.

    Raises:
        SystemExit: with code 0, at once when a signal is held already, else from the
            signal's handler (wherever the main thread is then: importing the app, connecting).
    """
    global _mode
    if _mode != "hold":
        return
    _mode = "exit"
    if _held:
        _exit_now(_held.pop())


def end() -> None:
    """Stop; call it once your own handlers replaced ours (``loop.add_signal_handler`` for both signals)."""
    global _mode
    _mode = "off"


def release() -> int | None:
    """Stop holding and put the handlers back (Python's); the signal held, if any, for the caller to act on.

    ``signal.raise_signal`` of it ends the process as it would have ended (by SIGTERM; a
    ``KeyboardInterrupt`` for SIGINT).
    """
    global _mode
    if _mode != "hold":
        return None
    _mode = "off"
    for sig, handler in _previous.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    return _held.pop() if _held else None


del TYPE_CHECKING
