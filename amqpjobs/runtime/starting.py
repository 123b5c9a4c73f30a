"""A start that a stop request cuts short: a worker's and a scheduler replica's (README "Workers").

A long-running process may be asked to stop while it still starts: while its first connect
is retried (up to ``--connect-timeout``, default 30 s), while it declares or checks. It then
gives the start up at once, instead of finishing it only to stop. (Before its loop's signal
handlers, a signal ends the process at once: :mod:`amqpjobs.runtime.held_signals`.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from amqpjobs.errors import ConfigurationError
from amqpjobs.wire.connection import CHANNEL_LOGGERS, CLIENT_LOGGERS, quiet_client_loggers


async def start_unless_stopped(start: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Run ``start`` until it ends or ``stop`` is set, whichever comes first; whether it ended.

    Args:
        start: The start (its own ``except``/``finally`` close what it opened when it is
            cancelled).
        stop: Set by the stop request, and by nothing else: an event that ``start``'s own clean-up
            after a failure sets too would hide that failure (cancelled as if stopped, exit 0).

    Returns:
        True when ``start`` ended (``stop`` may be set by then too); False when ``stop`` was
        set first: ``start`` was cancelled and has ended. The AMQP client's lines about the
        calls the cancellation cut short (``Closing channel ... because RPC call ... cancelled``,
        a WARNING) are not logged then, unless at DEBUG.

    Raises:
        What ``start`` raised, when it ended first.
    """
    starting = asyncio.ensure_future(start)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # our caller was cancelled: so is the start (it closes what it opened)
        stopping.cancel()
        starting.cancel()
        raise
    stopping.cancel()
    if not starting.done():
        with quiet_client_loggers((*CLIENT_LOGGERS, *CHANNEL_LOGGERS)):
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
        return False
    starting.result()
    return True


async def start_again(start_over: asyncio.Event, ready: asyncio.Event, stop: asyncio.Event) -> None:
    """A second ``start()`` of one worker: wait for the first (``start_over``), return once it is ``ready``.

    Nothing is opened again (as ``asyncio.Server.start_serving`` called twice).

    Raises:
        ConfigurationError: the first start failed, or the worker was stopped (``stop`` set) since.
    """
    await start_over.wait()
    if not ready.is_set() or stop.is_set():
        raise ConfigurationError(
            "this Worker was started before, and that start failed or the worker stopped since: a Worker starts "
            "once; create a new Worker(app, settings, options) to start again"
        )
