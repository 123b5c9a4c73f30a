"""Cron schedules of an app: ``@app.cron`` registers them (README "Schedules")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pydantic import ValidationError

from amqpjobs.durations import parse_duration
from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.cron import CronRule, MissedPolicy, OverlapPolicy, Schedule
from amqpjobs.jobs.registry import JobRegistry
from amqpjobs.runtime.overlap import GUARD_ATTRIBUTE, overlap_guarded

if TYPE_CHECKING:
    from amqpjobs.runtime.overlap import GuardedApp

C = TypeVar("C", bound=Callable[..., Any])


class CronSchedules(JobRegistry):
    """The ``@app.cron`` decorator and the schedules it registered (a part of :class:`~amqpjobs.App`).

    The schedules are read by ``amqpjobs schedule run`` (:mod:`amqpjobs.runtime.scheduler`);
    next-fire and DST rules live in :mod:`amqpjobs.jobs.cron`.
    """

    _schedules: dict[str, Schedule]

    def cron(
        self,
        expression: str,
        *,
        name: str | None = None,
        tz: str = "UTC",
        payload: Any = None,
        missed: MissedPolicy = "catch-up-once",
        overlap: OverlapPolicy = "allow",
        grace: float | str = 60.0,
    ) -> Callable[[C], C]:
        """Schedule the decorated job; put ``@app.cron`` above ``@app.job``.

        ``amqpjobs schedule run module:app`` then enqueues the job on every tick, with job
        id ``cron:<name>:<tick in UTC>`` (README "Schedules"; next-fire and DST rules in
        :mod:`amqpjobs.jobs.cron`).

        Args:
            expression: croniter expression: 5 fields (``"0 8 * * *"``), 6 with seconds
                last (``"* * * * * */10"``), or an alias such as ``"@daily"``.
            name: Schedule name (``A-Za-z0-9._-``, at most 100); default the job's name.
                Give one when a job has several schedules.
            tz: IANA zone the expression is read in (``"Europe/Paris"``); default UTC.
            payload: The job's payload on every tick (dict or model instance), validated
                now; default ``{}``.
            missed: ``"catch-up-once"`` (one job for ticks missed while no scheduler ran)
                or ``"skip"`` (none). Missed ticks are never replayed one by one.
            overlap: ``"allow"``, or ``"skip"``: skip a tick while the previous run of this
                schedule still runs (needs an ``async def`` handler).
            grace: Seconds (or ``"5m"``) after its time within which a tick still fires as
                on time; default 60.

        Returns:
            A decorator that registers the schedule and returns the handler (the overlap
            guard's wrapper with ``overlap="skip"``).

        Raises:
            ConfigurationError: a bad expression, zone, name, policy, grace or payload; a
                schedule of that name exists; the function is not a registered job; or
                ``overlap="skip"`` on a plain-function handler.

        """
        rule = CronRule(expression, tz)
        try:
            grace_seconds = parse_duration(grace)
        except ValueError as exc:
            raise ConfigurationError(f"cron {expression!r}: grace: {exc}") from None

        def register(handler: C) -> C:
            jobdef = next((j for j in self if j.handler is handler), None)
            if jobdef is None:
                raise ConfigurationError(
                    f"cron {expression!r}: {getattr(handler, '__name__', handler)!r} is not a registered job; "
                    "put @app.cron above @app.job"
                )
            try:
                body = jobdef.to_json({} if payload is None else payload)
            except ValidationError as exc:
                raise ConfigurationError(f"cron {expression!r}: payload for job {jobdef.name!r}: {exc}") from None
            except ConfigurationError as exc:  # the model's JSON too deep (:meth:`JobDef.to_json`): the schedule's
                said = str(exc).removeprefix(f"job {jobdef.name!r}: ")
                raise ConfigurationError(f"schedule {name or jobdef.name!r}: {said}") from None
            schedule = Schedule(name or jobdef.name, jobdef.name, rule, body, missed, overlap, grace_seconds)
            if schedule.name in self._schedules:
                raise ConfigurationError(f"schedule {schedule.name!r} is registered twice; give each a name=")
            result: Callable[..., Any] = handler
            if overlap == "skip" and not getattr(handler, GUARD_ATTRIBUTE, False):
                if not jobdef.is_async:
                    raise ConfigurationError(
                        f"schedule {schedule.name!r}: overlap='skip' needs an async def handler (the guard holds "
                        f"its marker from the event loop); job {jobdef.name!r} has a plain function"
                    )
                result = overlap_guarded(cast("GuardedApp", self), handler)  # self is an App
                self._jobs[jobdef.name] = dataclasses.replace(jobdef, handler=result)
            self._schedules[schedule.name] = schedule
            return cast(C, result)

        return register

    def schedules(self) -> list[Schedule]:
        """The app's cron schedules, sorted by name."""
        return [self._schedules[name] for name in sorted(self._schedules)]
