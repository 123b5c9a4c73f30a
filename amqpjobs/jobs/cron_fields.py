"""Which field of a cron expression croniter refuses, and which zone names are no fixed IANA zone, in words (no I/O)."""

from __future__ import annotations

from typing import Final

from croniter import croniter

#: Each field of a 5- or 6-field expression (seconds last): its name and the values it takes.
FIELDS: Final = (
    ("minute", "minute: 0-59"),
    ("hour", "hour: 0-23"),
    ("day-of-month", "day of month: 1-31"),
    ("month", "month: 1-12 or jan-dec"),
    ("weekday", "weekday: 0-7 or sun-sat, 0 and 7 are Sunday"),
    ("second", "second: 0-59"),
)

#: What a field may be written as, for messages.
FIELD_FORMS: Final = "each field takes numbers, a list (1,5), a range (1-5), a step (*/15) or *"


def bad_field(fields: list[str]) -> str | None:
    """The first field of ``fields`` (5 or 6) that croniter refuses, as ``its minute field '61' is not taken (...)``.

    Each field is tried alone, every other one ``*``: croniter's own message names no field
    ("[61 * * * *] is not acceptable, out of range"). None when each one alone is taken.
    """
    if len(fields) not in (5, 6):
        return None
    for i, value in enumerate(fields):
        probe = ["*"] * len(fields)
        probe[i] = value
        if not croniter.is_valid(" ".join(probe)):
            name, takes = FIELDS[i]
            return f"its {name} field {value!r} is not taken ({takes})"
    return None


#: Zone keys ``zoneinfo`` opens that are no fixed IANA zone: the host's own zone (``localtime`` is
#: ``/etc/localtime``, so replicas on hosts set to other zones would fire one tick at different instants),
#: Debian's ``posixrules`` (US Eastern), ``Factory`` (no offset of its own), and the ``posix/`` and
#: ``right/`` (leap-second) copies of the database.
_NOT_FIXED: Final = ("localtime", "posixrules", "factory")
_NOT_FIXED_TREES: Final = ("posix/", "right/")


def zone_problem(tz: object) -> str | None:
    """Why ``tz`` can't be a schedule's zone, in words with the fix; None when it may be (if ``zoneinfo`` knows it)."""
    if not isinstance(tz, str):
        return f"time zone must be a str, an IANA name such as 'Europe/Paris' (got {type(tz).__name__} {tz!r})"
    key = tz.strip().lower()
    if key in _NOT_FIXED or key.startswith(_NOT_FIXED_TREES):
        return (
            f"time zone {tz!r} is not a fixed IANA zone name (it depends on the host, or is an alias or copy of "
            "the database): give an IANA name such as 'UTC' or 'Europe/Paris'"
        )
    return None
