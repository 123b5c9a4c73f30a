"""Cron schedules without I/O: fire times through DST, missed-tick planning, tick ids and records.

Rules (README "Schedules"):

* An expression is croniter's: 5 fields (``minute hour day month weekday``), 6 fields
  (croniter puts seconds last: ``minute hour day month weekday second``), or an alias
  such as ``@daily``. Day-of-month and day-of-week combine as in Vixie cron (either
  matches), as croniter implements it.
* An expression is matched against the wall clock of the schedule's zone (IANA name,
  :mod:`zoneinfo`; default ``UTC``). A tick is the UTC instant a match stands for, in
  whole seconds.
* Spring-forward gap: a wall time that does not exist fires once, at the first valid
  instant after the gap (the transition itself, e.g. 03:00 in Paris on the last Sunday of
  March). Several matches in one gap collapse into that single tick.
* Repeated hour: a wall time that occurs twice fires once, at its first occurrence
  (``fold=0`` in PEP 495 terms); matches during the second pass never fire. An hourly
  schedule in a local zone therefore waits two real hours across the fall-back; use
  ``tz="UTC"`` for schedules that must keep a fixed real-time rhythm.
* Missed ticks (found after the schedule's ``grace``, or older than a newer due tick) are
  never replayed one by one: ``catch-up-once`` fires one job for the whole missed window,
  ``skip`` fires none (:func:`plan_ticks`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.cron_fields import FIELD_FORMS, bad_field, zone_problem
from amqpjobs.jobs.json_values import json_problem
from amqpjobs.printable import listed

MissedPolicy = Literal["catch-up-once", "skip"]
OverlapPolicy = Literal["allow", "skip"]
TickKind = Literal["fired", "catch-up", "skipped-overlap", "skipped-missed"]

MISSED_POLICIES: Final = ("catch-up-once", "skip")
OVERLAP_POLICIES: Final = ("allow", "skip")

#: Headers the scheduler adds to the jobs it enqueues (beside the usual job headers).
SCHEDULE_HEADER: Final = "amqpjobs-cron-schedule"
TICK_HEADER: Final = "amqpjobs-cron-tick"
KIND_HEADER: Final = "amqpjobs-cron-kind"
MISSED_FROM_HEADER: Final = "amqpjobs-cron-missed-from"
MISSED_UNTIL_HEADER: Final = "amqpjobs-cron-missed-until"
FIRED_BY_HEADER: Final = "amqpjobs-cron-fired-by"

#: Schedule names: they become part of queue names and job ids, so no ``:`` and no spaces.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_ALIASES: Final = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
#: Candidates examined per search; a search crosses at most one repeated hour of matches.
_SEARCH_LIMIT: Final = 200_000
_SECOND: Final = timedelta(seconds=1)


def utc_of(moment: datetime) -> datetime:
    """``moment`` in UTC.

    Raises:
        ValueError: ``moment`` is naive (no time zone): the scheduler never guesses one.
    """
    if moment.tzinfo is None:
        raise ValueError(f"{moment!r} is a naive datetime; give an aware one (e.g. datetime.now(UTC))")
    return moment.astimezone(UTC)


def format_tick(tick: datetime) -> str:
    """Format an aware time as ISO-8601 UTC in whole seconds: ``2026-11-29T08:00:00Z``.

    Raises:
        ValueError: ``tick`` is naive.

    """
    return utc_of(tick).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_tick(text: str) -> datetime:
    """Read a time written by :func:`format_tick` (any ISO-8601 time with a zone is accepted).

    Raises:
        ValueError: not an ISO-8601 time with a zone.

    """
    return utc_of(datetime.fromisoformat(text.replace("Z", "+00:00")))


def tick_id(schedule: str, tick: datetime) -> str:
    """The job id of ``schedule``'s tick: ``cron:<schedule>:<tick in UTC>``.

    Deterministic, so a tick fired twice (e.g. by two leaders during a network partition)
    carries the same id both times and is recognisable downstream.
    Example: ``cron:nightly-report:2026-11-29T07:00:00Z``.

    Raises:
        ValueError: ``tick`` is naive.

    """
    return f"cron:{schedule}:{format_tick(tick)}"


def _wall_toutc_of(wall: datetime, zone: ZoneInfo) -> datetime:
    """The tick a naive wall time of ``zone`` stands for (the DST policy of the module docstring)."""
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if first <= second:
        # unique (equal), or repeated: fold=0 is the first occurrence (PEP 495)
        return first
    # In a gap, fold=0 reads the wall time with the offset before the transition (an
    # instant after it) and fold=1 with the offset after (an instant before it); the
    # transition lies in (second, first]. Find it to the second.
    after_offset = first.astimezone(zone).utcoffset()
    low, high = second, first
    while high - low > _SECOND:
        middle = low + (high - low) / 2
        middle = middle.replace(microsecond=0)
        if middle <= low:
            middle = low + _SECOND
        if middle.astimezone(zone).utcoffset() == after_offset:
            high = middle
        else:
            low = middle
    return high


@dataclass(frozen=True)
class CronRule:
    """A cron expression read in a time zone; computes ticks (UTC, whole seconds).

    Args:
        expression: croniter expression (5 fields, 6 with seconds last, or an alias).
        tz: IANA zone name (``"Europe/Paris"``); default ``"UTC"``.

    Raises:
        ConfigurationError: the expression is not a str, invalid or never fires; or the zone is not a
            str, unknown, or no fixed IANA name (``localtime``, ``posixrules``, ``Factory``, ``posix/...``,
            ``right/...``).

    """

    expression: str
    tz: str = "UTC"
    zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.expression, str):
            raise ConfigurationError(
                f"cron expression must be a str such as '0 8 * * *' (got {type(self.expression).__name__} "
                f"{self.expression!r})"
            )
        if problem := zone_problem(self.tz):
            raise ConfigurationError(problem)
        text = self.expression.strip()
        fields = text.split()
        if not (text in _ALIASES or len(fields) in (5, 6)) or not croniter.is_valid(text):
            if field := bad_field(fields):
                raise ConfigurationError(f"cron expression {self.expression!r} is invalid: {field}; {FIELD_FORMS}")
            raise ConfigurationError(
                f"cron expression {self.expression!r} is invalid: give 5 fields (minute hour day month "
                "weekday), 6 with seconds last, or one of " + ", ".join(_ALIASES)
            )
        try:
            zone = ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigurationError(
                f"time zone {self.tz!r} is unknown: give an IANA name such as 'UTC' or 'Europe/Paris'"
            ) from None
        object.__setattr__(self, "zone", zone)
        try:
            croniter(text, datetime(2000, 1, 1)).get_next(datetime)
        except CroniterBadDateError:
            raise ConfigurationError(f"cron expression {self.expression!r} never fires") from None

    def next_after(self, after: datetime) -> datetime:
        """The first tick strictly after ``after`` (aware), in UTC.

        Raises:
            ConfigurationError: no tick within croniter's search horizon, or before the
                calendar's end (year 9999).
            ValueError: ``after`` is naive.

        """
        after = utc_of(after)
        try:
            wall = after.astimezone(self.zone).replace(tzinfo=None, fold=0)
            # A wall time before ``wall`` never maps past ``after`` (the mapping is monotonic),
            # so scanning from ``wall`` finds the first tick; in a repeated hour's second pass
            # the first-pass matches map before ``after`` and are passed over.
            matches = croniter(self.expression.strip(), wall)
            for _ in range(_SEARCH_LIMIT):
                tick = _wall_toutc_of(matches.get_next(datetime), self.zone)
                if tick > after:
                    return tick
        except CroniterError as exc:
            raise ConfigurationError(f"cron expression {self.expression!r}: no tick after {after}: {exc}") from None
        except (OverflowError, ValueError):  # croniter and datetime past year 9999
            raise ConfigurationError(
                f"cron expression {self.expression!r}: no tick after {format_tick(after)}: the calendar ends at "
                "9999-12-31T23:59:59Z"
            ) from None
        raise ConfigurationError(f"cron expression {self.expression!r}: no tick found after {after}")

    def upcoming(self, after: datetime, count: int) -> list[datetime]:
        """The next ``count`` ticks after ``after`` (aware), in UTC, earliest first.

        Raises:
            ValueError: ``after`` is naive.

        """
        ticks: list[datetime] = []
        moment = after
        for _ in range(count):
            moment = self.next_after(moment)
            ticks.append(moment)
        return ticks

    def latest_at_or_before(self, at: datetime, floor: datetime) -> datetime:
        """The last tick at or before ``at``, given ``floor``, a tick known to be at or before ``at``.

        Searches back from ``at`` over doubling windows, so a long outage costs a few dozen
        steps, not one per missed tick.

        Raises:
            ValueError: ``floor`` is after ``at``, or a time is naive.

        """
        at, floor = utc_of(at), utc_of(floor)
        if floor > at:
            raise ValueError(f"floor {floor} is after {at}")
        window = _SECOND
        while True:
            start = at - window
            if start < floor:
                start = floor - _SECOND
            tick = self.next_after(start)
            if tick <= at:
                while (following := self.next_after(tick)) <= at:
                    tick = following
                return tick
            window *= 2


@dataclass(frozen=True)
class Schedule:
    """A cron schedule: which job to enqueue, when, and what to do about missed ticks and overlaps.

    Attributes:
        name: Schedule name (1-100 of ``A-Za-z0-9._-``); part of job ids and queue names.
        job: Name of the job it enqueues.
        rule: When it fires.
        payload: The job's payload (JSON-ready object), the same on every tick.
        missed: ``"catch-up-once"`` (one job for a missed window) or ``"skip"`` (none).
        overlap: ``"allow"``, or ``"skip"``: a tick is skipped while the previous run of
            this schedule is still running.
        grace: Seconds after its time within which a tick still fires as on time; older
            ticks count as missed. Default 60.

    """

    name: str
    job: str
    rule: CronRule
    payload: Mapping[str, Any] = field(default_factory=dict)
    missed: MissedPolicy = "catch-up-once"
    overlap: OverlapPolicy = "allow"
    grace: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigurationError(f"schedule name must be a str (got {type(self.name).__name__} {self.name!r})")
        if not _NAME.fullmatch(self.name):
            raise ConfigurationError(
                f"schedule name {self.name!r}: use 1-100 characters of A-Z a-z 0-9 . _ - (starting with a "
                "letter or digit)"
            )
        if self.missed not in MISSED_POLICIES:
            raise ConfigurationError(f"schedule {self.name!r}: missed must be one of {listed(MISSED_POLICIES)}")
        if self.overlap not in OVERLAP_POLICIES:
            raise ConfigurationError(f"schedule {self.name!r}: overlap must be one of {listed(OVERLAP_POLICIES)}")
        if not self.grace >= 0:
            raise ConfigurationError(f"schedule {self.name!r}: grace must be >= 0 seconds (got {self.grace!r})")
        problem = json_problem(self.payload)
        if problem is not None:
            raise ConfigurationError(f"schedule {self.name!r}: {problem}")


@dataclass(frozen=True)
class TickPlan:
    """What a schedule should do now (the result of :func:`plan_ticks`).

    Attributes:
        on_time: The tick to fire as on time, or None.
        missed_from / missed_until: First and last missed tick, or None when nothing was missed.
        cursor: The new cursor: every tick at or before it has been dealt with.

    """

    on_time: datetime | None
    missed_from: datetime | None
    missed_until: datetime | None
    cursor: datetime

    @property
    def due(self) -> bool:
        """True when there is something to fire or to skip."""
        return self.on_time is not None or self.missed_from is not None


def plan_ticks(schedule: Schedule, cursor: datetime, now: datetime) -> TickPlan:
    """Decide which ticks after ``cursor`` are due at ``now``.

    The due ticks are those in ``(cursor, now]``. The latest of them is on time when it
    is at most ``schedule.grace`` seconds old; every other due tick is missed. Missed
    ticks form one window (first, last) that the caller fires once or skips, by policy.

    Args:
        schedule: The schedule.
        cursor: The last tick dealt with (or the time the schedule was first seen).
        now: The current time (aware).

    Returns:
        The plan; ``plan.due`` is False when no tick is due yet (the cursor stays).

    """
    cursor, now = utc_of(cursor), utc_of(now)
    first = schedule.rule.next_after(cursor)
    if first > now:
        return TickPlan(None, None, None, cursor)
    latest = schedule.rule.latest_at_or_before(now, floor=first)
    if (now - latest).total_seconds() <= schedule.grace:
        if first == latest:
            return TickPlan(latest, None, None, latest)
        before = schedule.rule.latest_at_or_before(latest - _SECOND, floor=first)
        return TickPlan(latest, first, before, latest)
    return TickPlan(None, first, latest, latest)


def rewound_cursor(cursor: datetime, now: datetime, tolerance: float) -> datetime | None:
    """The cursor a leader starts again from when ``cursor`` is far ahead of its clock, or None.

    A cursor is the last tick dealt with, so it is never ahead of the clock that wrote it.
    One ahead of ``now`` by at most ``tolerance`` seconds is a leader whose clock runs a
    little behind the previous leader's: it waits for the cursor, and no tick fires twice.
    One further ahead was written by a clock stepped forward (then back) or far off; waiting
    would stop the schedule for as long, so, as cron(8) takes a large clock change for a
    correction, the schedule starts again from the second before ``now`` (a tick at ``now``
    fires on time).

    Args:
        cursor: The schedule's cursor.
        now: The leader's clock (aware).
        tolerance: Seconds the cursor may be ahead of ``now`` and be waited for.

    Returns:
        The new cursor, or None to keep ``cursor`` (and wait for it while it is ahead).

    """
    cursor, now = utc_of(cursor), utc_of(now)
    if cursor <= now or (cursor - now).total_seconds() <= tolerance:  # never forward: that would skip ticks
        return None
    return now.replace(microsecond=0) - _SECOND


def leader_queue(app: str) -> str:
    """Queue whose token the leading scheduler replica holds: ``amqpjobs.scheduler.<app>.leader``."""
    return f"amqpjobs.scheduler.{app}.leader"


def tick_queue(app: str, schedule: str) -> str:
    """A schedule's tick store: ``amqpjobs.scheduler.<app>.ticks.<schedule>``."""
    return f"amqpjobs.scheduler.{app}.ticks.{schedule}"


def running_queue(app: str, schedule: str) -> str:
    """A schedule's running marker: ``amqpjobs.scheduler.<app>.running.<schedule>``."""
    return f"amqpjobs.scheduler.{app}.running.{schedule}"
