"""Running a one-shot command's coroutine so that Ctrl-C ends the process at once.

Management API requests run in threads (``asyncio.to_thread``: httpx blocks) for up to their
timeout (5 s for a one-shot command). A thread can't be stopped: on Ctrl-C, ``asyncio.run``
cancels the command's task (its connections close), then waits for the default executor's
threads, and Python joins them again at exit. Against a silent management API, Ctrl-C took
up to 5 s to end the command. :func:`run_command` exits 130 once the task has ended instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import click

from amqpjobs.cli._common import EXIT_INTERRUPTED
from amqpjobs.runtime.logs import flush_logs

T = TypeVar("T")


def run_command(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)``, except that Ctrl-C does not wait for requests still in threads.

    Returns:
        What ``main`` returns.

    Raises:
        KeyboardInterrupt: Ctrl-C while no other thread runs (the command's wrapper,
            :func:`~amqpjobs.cli._common.errors_to_exit_codes`, prints ``interrupted`` and exits 130).
        What ``main`` raises.
    """
    runner = asyncio.Runner()
    try:
        return runner.run(main)
    except KeyboardInterrupt:
        if _threads_still_running():
            _exit_interrupted_now()
        raise
    finally:
        runner.close()


def _threads_still_running() -> bool:
    main = threading.main_thread()
    return any(t is not main and t.is_alive() and not t.daemon for t in threading.enumerate())


def _exit_interrupted_now() -> None:
    """Print ``interrupted`` and end the process with 130 without joining the threads (``os._exit``)."""
    click.echo("interrupted", err=True)
    flush_logs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a reader gone: nothing more to say
            stream.flush()
    os._exit(EXIT_INTERRUPTED)
