"""The overlap guard, worker side: runs of a schedule with ``overlap="skip"`` never overlap.

A run holds an exclusive queue ``amqpjobs.scheduler.<app>.running.<schedule>`` for as long
as its handler runs (declared on the app's connection; the broker deletes it with that
connection, so a killed worker leaves no stale marker). The scheduler's leader passively
declares it before firing (:mod:`amqpjobs.runtime.scheduler`); a run that finds it held
when it starts (it waited in the queue while the previous one ran) is skipped here.

This module knows the app only through :class:`GuardedApp`, so neither it nor the
scheduler imports :mod:`amqpjobs.runtime.app`.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, NoReturn, Protocol

from amqpjobs.errors import BrokerError
from amqpjobs.jobs import cron
from amqpjobs.jobs.outcome import Skipped
from amqpjobs.jobs.registry import JobContext
from amqpjobs.runtime.logs import field_value
from amqpjobs.text import as_text
from amqpjobs.wire.abc import TickWire

log = logging.getLogger("amqpjobs.scheduler")

#: Arguments of a running marker (an exclusive queue: it lives as long as its connection).
RUNNING_QUEUE_ARGUMENTS: Final[Mapping[str, Any]] = {"x-queue-type": "classic"}
#: Attribute set on handlers wrapped by the overlap guard.
GUARD_ATTRIBUTE: Final = "__amqpjobs_overlap_guard__"


class GuardedApp(Protocol):
    """What the guard needs of an :class:`~amqpjobs.App`: its name, schedules and where markers live."""

    @property
    def name(self) -> str:
        """The app's name."""
        ...

    def schedules(self) -> Sequence[cron.Schedule]:
        """The app's schedules."""
        ...

    async def marker_wire(self) -> tuple[TickWire, Any]:
        """The wire and connection running markers are held on (the app's own, connected once)."""
        ...


class _Marker:
    """A schedule's running marker held on the app's connection (see the module docstring)."""

    def __init__(self, wire: TickWire, connection: Any, queue: str) -> None:
        self._wire = wire
        self._connection = connection
        self.queue = queue

    async def acquire(self) -> bool:
        """Declare the exclusive marker queue; False when another connection holds it."""
        return await self._wire.hold_exclusive(self._connection, self.queue, RUNNING_QUEUE_ARGUMENTS)

    async def release(self) -> None:
        """Delete the marker (best effort: it goes with the connection anyway)."""
        try:
            await self._wire.delete_queue(self._connection, self.queue, 10)
        except (BrokerError, TimeoutError) as exc:
            log.warning("running marker %s not deleted (%s); it goes with the connection", self.queue, exc)


#: Set while a guarded handler runs (its tasks inherit it): a guard entered then is not its job's own.
_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("amqpjobs_overlap_inside", default=False)


def overlap_guarded(app: GuardedApp, handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Wrap an async job handler so that runs of a schedule with ``overlap="skip"`` never overlap.

    For a delivery enqueued by such a schedule (header ``amqpjobs-cron-schedule``), the
    wrapper holds the schedule's running marker while ``handler`` runs, and raises
    :class:`~amqpjobs.jobs.outcome.Skipped` without running it when another run holds the
    marker (logged; the worker acks the delivery, outcome ``skipped``).
    Other deliveries run ``handler`` unchanged. The marker lives on the app's own
    connection (``App(url=...)`` or ``$AMQPJOBS_URL``, as for enqueueing from a handler).

    Args:
        app: The application (its schedules and its connection).
        handler: ``async def handler(payload, ctx)``.

    Returns:
        The wrapped handler, marked with :data:`GUARD_ATTRIBUTE`.

    """
    held: set[str] = set()  # markers held by this process: one connection owns them all

    @functools.wraps(handler)
    async def guarded(payload: Any, ctx: JobContext) -> Any:
        raw = ctx.headers.get(cron.SCHEDULE_HEADER)
        name = None if raw is None else as_text(raw)
        schedule = next((s for s in app.schedules() if s.name == name), None)
        if name is None or schedule is None or schedule.overlap != "skip":
            return await handler(payload, ctx)
        outer = not _inside.get()  # the job's own guard, not one a handler's code awaited
        if name in held:
            _skip(ctx, name, outer)
        held.add(name)
        try:
            wire, connection = await app.marker_wire()
            marker = _Marker(wire, connection, cron.running_queue(app.name, name))
            if not await marker.acquire():
                _skip(ctx, name, outer)
            token = _inside.set(True)  # its handler's tasks inherit it
            try:
                return await handler(payload, ctx)
            finally:
                _inside.reset(token)
                await marker.release()
        finally:
            held.discard(name)

    setattr(guarded, GUARD_ATTRIBUTE, True)
    return guarded


def _skip(ctx: JobContext, schedule: str, outer: bool) -> NoReturn:
    """Leave the run out: logged, then :class:`~amqpjobs.jobs.outcome.Skipped` (the worker acks it as ``skipped``).

    ``outer``: the job's own guard (unrun); else a guarded function a running handler
    awaited, whose Skipped is that handler's failure (:func:`amqpjobs.jobs.failure.framework_word`).
    """
    log.info("job=%s id=%s skipped: the previous run of schedule %s is still running",
             field_value(ctx.job), field_value(ctx.job_id), field_value(schedule))  # fmt: skip
    raise Skipped("overlap", f"schedule {schedule}", unrun=outer)
