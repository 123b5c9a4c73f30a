"""What a handler's run returns, settled: awaited until it is no awaitable, a generator refused, timeouts worded.

Part of :class:`~amqpjobs.runtime.runs.HandlerRuns`. The worker calls ``handler(payload, ctx)``
(README "Jobs"): an ``async def``'s coroutine, or an awaitable a plain function returns from
its thread (a lambda or ``functools.wraps`` wrapper around an ``async def``), is the run and is
awaited within the job's timeout; a generator means none of the handler's body ran.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

from amqpjobs.jobs.failure import qualname
from amqpjobs.jobs.registry import JobDef

#: A run that returned a generator: its body never ran (a generator function wrapped past the registration check).
_GENERATOR = (
    "the handler returned a generator: none of its body ran; fix: return a value, not a generator (as a wrapper "
    "around a generator function does)"
)


def unsettled(value: Any) -> bool:
    """Whether a run's value is an awaitable or a generator (see :func:`settled`), not a result."""
    return inspect.isawaitable(value) or inspect.isgenerator(value) or inspect.isasyncgen(value)


def settled_value(value: Any) -> Any:
    """A run's value, refused when it is a generator (TypeError: nothing ran)."""
    if inspect.isgenerator(value):
        value.close()
    if inspect.isgenerator(value) or inspect.isasyncgen(value):
        raise TypeError(_GENERATOR)
    return value


async def settled(value: Any) -> Any:
    """``value`` awaited until it is no awaitable (an async handler that returned a coroutine runs it too)."""
    while inspect.isawaitable(value):
        value = await value
    return settled_value(value)


async def rest_of_run(job: JobDef, value: Any, limit: float | None, started: float) -> Any:
    """The awaitable a plain-function handler returned, run within what its thread left of ``limit`` (seconds).

    Raises:
        TimeoutError: the limit ran out (in the thread: the awaitable is not started).
    """
    left = None if limit is None else limit - (time.monotonic() - started)
    if left is not None and left <= 0:
        if inspect.iscoroutine(value):
            value.close()
        raise overran(job, limit, "")
    scope = asyncio.timeout(left)
    try:
        async with scope:
            value = await settled(value)
    except BaseException as exc:  # judged as an async handler's run past its deadline (``_run_once``)
        if not scope.expired() or not isinstance(exc, Exception):
            raise
        timeout = isinstance(exc, TimeoutError)
        raise overran(job, limit, "" if timeout else f"then raised {qualname(exc)}") from (None if timeout else exc)
    if scope.expired():  # it caught the cancellation and returned
        raise overran(job, limit, "went on; its result is not used")
    return value


def overran(job: JobDef, limit: float | None, after_cancel: str) -> TimeoutError:
    """The failure of a run of ``job`` past its ``limit`` (seconds); ``after_cancel``: what it did once cancelled."""
    default = "" if job.timeout is not None else " (the default: just below the consumer timeout)"
    caught = f" (it caught the cancellation and {after_cancel})" if after_cancel else ""
    return TimeoutError(f"job {job.name} ran longer than its timeout of {limit:g}s{default}{caught}")
