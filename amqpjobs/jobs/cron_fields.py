"""Which field of a cron expression croniter refuses, in words (no I/O)."""

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
