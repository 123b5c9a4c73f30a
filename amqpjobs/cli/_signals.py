"""Running a mover (replay, park) so that Ctrl-C and SIGTERM end it with its summary, not a traceback.

:func:`run_until_signal` runs the coroutine; on SIGINT or SIGTERM it cancels it (the movers
cut the moves under way short and return the held messages when cancelled), and returns the
exit code, 128 + the signal (130, 143), for the caller to print its counts and exit with.
The client library's lines about the calls the cancellation cut short are silenced (our
summary says what happened). :func:`signals_held` keeps a late Ctrl-C from killing the
process while it prints the summary: Python ends a process whose ``KeyboardInterrupt`` is
not handled by re-raising SIGINT on itself (so the shell sees death by signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

from amqpjobs.wire.connection import CHANNEL_LOGGERS, CLIENT_LOGGERS, quiet_client_loggers

#: Exit code of a mover stopped by SIGTERM: 128 + 15, the shell convention.
EXIT_TERMINATED = 143
_CODES = {signal.SIGINT: 130, signal.SIGTERM: EXIT_TERMINATED}


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def run_until_signal(work: Coroutine[Any, Any, object]) -> int | None:
    """Run ``work`` to its end (None), or until SIGINT/SIGTERM cancels it: then 130 or 143.

    Raises:
        Whatever ``work`` raises (our errors); a cancellation not caused by a signal.

    """
    stopped: list[int] = []
    finished: list[bool] = []
    with contextlib.ExitStack() as quiet:

        async def main() -> None:
            loop = asyncio.get_running_loop()
            task = asyncio.current_task()
            assert task is not None

            def on_signal(sig: signal.Signals) -> None:
                # a second signal does not cut the cleanup of the first short; one after the end is ignored
                if not stopped and not finished:
                    stopped.append(_CODES[sig])
                    quiet.enter_context(quiet_client_loggers((*CLIENT_LOGGERS, *CHANNEL_LOGGERS)))
                    task.cancel()

            handled = _CODES if _main_thread() else {}  # signal handlers live in the main thread only
            for sig in handled:
                loop.add_signal_handler(sig, on_signal, sig)
            try:
                await work
            finally:
                finished.append(True)  # the handlers stay (ignoring) until asyncio.run closes the loop

        try:
            asyncio.run(main())
        except asyncio.CancelledError:
            if not stopped:
                raise
        except KeyboardInterrupt:  # a SIGINT before the handlers were in place
            return _CODES[signal.SIGINT]
    return stopped[0] if stopped else None


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ignore SIGINT and SIGTERM for the block (printing a summary), then restore the handlers."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _CODES} if _main_thread() else {}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
