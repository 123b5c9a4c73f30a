"""SIGTERM and SIGINT held from a process's first moment until its event loop's handlers take over.

``amqpjobs consume`` and ``amqpjobs schedule run`` import the CLI (aio-pika, pydantic, ...:
0.5 s on a quiet machine, over 1 s under load), then the app's module (as long as its code
takes), before :func:`amqpjobs.runtime.signals.stop_on_signals` (or the ``--processes``
supervisor) puts its loop's handlers in place. Python's own handling would end a SIGTERM
there with no line (exit by the signal), and a SIGINT with a ``KeyboardInterrupt`` traceback,
where the README promises a stop with exit 0 "also while it is still starting".

The console script (:mod:`amqpjobs.__main__`) calls :func:`hold` before it imports anything
else; a signal is then noted, not acted on. Later, one of two:

- :func:`take`, once the loop's handlers are in place: the held signal is handed over, and the
  caller acts on it as on one that came then (a worker starts already stopping);
- :func:`release`, for every other command: Python's handling is back, and the held signal, if
  any, is returned for the caller to raise (it ends the command as it would have).

A second signal while held exits at once with ``128 + signal``, as a second signal does once
the loop runs. Nothing is held in a process that never called :func:`hold` (a ``Worker`` in
your own program, a ``--processes`` child): :func:`take` then returns ``()``.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

#: The signals held.
SIGNALS = (signal.SIGTERM, signal.SIGINT)

_held: list[int] = []
_holding = False
_previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}  # the handlers before hold()


def hold() -> None:
    """Hold SIGTERM and SIGINT from now on (the main thread only: elsewhere this does nothing)."""
    global _holding
    if threading.current_thread() is not threading.main_thread():
        return
    _held.clear()
    _holding = True
    for sig in SIGNALS:
        _previous[sig] = signal.signal(sig, _note)


def _note(signum: int, frame: FrameType | None) -> None:
    if _held:  # a second one: no loop runs yet to stop gracefully, nothing was taken from the broker
        os.write(2, f"second signal {signum} while starting: exiting now\n".encode())
        os._exit(128 + signum)
    _held.append(signum)


def take() -> tuple[int, ...]:
    """Stop holding; the signal held, if any (``()`` or one signal number).

    Call it once your own handlers replaced ours (``loop.add_signal_handler`` for both
    signals): a signal between the two would otherwise be lost.
    """
    global _holding
    if not _holding:
        return ()
    _holding = False
    taken = tuple(_held)
    _held.clear()
    return taken


def release() -> int | None:
    """Stop holding and put the handlers back (Python's); the signal held, if any, for the caller to act on.

    ``signal.raise_signal`` of it ends the process as it would have ended (by SIGTERM; a
    ``KeyboardInterrupt`` for SIGINT).
    """
    global _holding
    if not _holding:
        return None
    _holding = False
    for sig, handler in _previous.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    return _held.pop() if _held else None
