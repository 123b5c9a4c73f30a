"""Running a one-shot command's coroutine so that Ctrl-C ends the process at once.

Management API requests run in threads (``asyncio.to_thread``: httpx blocks) for up to their
timeout (5 s for a one-shot command). A thread can't be stopped: on Ctrl-C, ``asyncio.run``
cancels the command's task (its connections close), then waits for the default executor's
threads, and Python joins them again at exit. Against a silent management API, Ctrl-C took
up to 5 s to end the command. :func:`run_command` exits 130 once the task has ended instead,
at once when a thread is still busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import click

from amqpjobs.cli._common import EXIT_INTERRUPTED
from amqpjobs.runtime.logs import flush_logs

T = TypeVar("T")


def run_command(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, except that Ctrl-C does not wait for requests still in threads.

    The loop's default executor is one of ours: on Ctrl-C it is shut down, and when its threads
    have not all ended within :data:`_JOIN` seconds (a request still waiting for its answer),
    ``interrupted`` is printed and the process ends at once with 130 (``os._exit``: Python
    would join them at exit).

    Returns:
        What ``main`` returns.

    Raises:
        KeyboardInterrupt: Ctrl-C once no thread is busy (the command's wrapper,
            :func:`~amqpjobs.cli._common.errors_to_exit_codes`, prints ``interrupted`` and exits 130).
        What ``main`` raises.
    """
    runner = asyncio.Runner()
    executor = ThreadPoolExecutor(thread_name_prefix="amqpjobs-cli")
    runner.get_loop().set_default_executor(executor)
    try:
        return runner.run(main)
    except KeyboardInterrupt:
        _interrupted(executor)
        raise
    finally:
        try:
            runner.close()  # joins the executor's threads: a request still waiting holds it up
        except KeyboardInterrupt:  # Ctrl-C during that join (the command had ended): as during the run
            _interrupted(executor)
            raise


def _interrupted(executor: ThreadPoolExecutor) -> None:
    """On Ctrl-C: return when ``executor``'s threads all end within :data:`_JOIN`, else end the process (130)."""
    if not _threads_end(executor):
        _exit_interrupted_now()


#: Seconds Ctrl-C waits for the executor's threads to end (idle ones end at once).
_JOIN = 0.2


def _threads_end(executor: ThreadPoolExecutor) -> bool:
    """Shut ``executor`` down; whether its threads all ended within :data:`_JOIN` seconds."""
    done = threading.Event()

    def shutdown() -> None:
        executor.shutdown(wait=True)
        done.set()

    threading.Thread(target=shutdown, daemon=True).start()
    return done.wait(_JOIN)


def _exit_interrupted_now() -> None:
    """Print ``interrupted`` and end the process with 130 without joining the threads (``os._exit``)."""
    click.echo("interrupted", err=True)
    flush_logs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a reader gone: nothing more to say
            stream.flush()
    os._exit(EXIT_INTERRUPTED)
