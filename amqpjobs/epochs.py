"""The one rule for a number of time since the epoch: seconds, milliseconds, microseconds or nanoseconds.

Pure (no I/O, no imports of ours), so that both readers of a time use it: ``jobs/`` (header
values, the management API's ``head_message_timestamp``: :mod:`amqpjobs.jobs.timestamps`,
which re-exports it) and ``wire/`` (an AMQP ``timestamp``, the property or a ``T`` header,
decoded off a frame: :mod:`amqpjobs.wire.header_decoding`). Before, the frame's decoding had a
rule of its own (pamqp's: seconds or milliseconds), and a timestamp in microseconds was an age
to ``status`` but no time at all to the handler.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

#: Values above this are milliseconds (pamqp's rule: seconds this large are past 2106).
MILLISECONDS_ABOVE: Final = 0xFFFFFFFF
#: Values at or above this are microseconds: as milliseconds they would be past ``datetime``'s last year, 9999.
MICROSECONDS_FROM: Final = 253_402_300_800_000
#: Values at or above this are nanoseconds: as microseconds they would be past the year 9999.
NANOSECONDS_FROM: Final = 253_402_300_800_000_000
#: Values at or above this are no time: a negative POSIX ``time_t`` (AMQP's timestamp, signed) sent
#: as the unsigned 64 bits pamqp and the broker read (-1 s is ``2**64 - 1``, which as ns is 2554).
NEGATIVE_FROM: Final = 2**63


def epoch_seconds(value: float) -> float:
    """Seconds since the epoch from an AMQP-style timestamp in seconds, milliseconds, microseconds or nanoseconds.

    Told apart by size, where no two readings fall in years 1970-9999 both: above
    :data:`MILLISECONDS_ABOVE` milliseconds (pamqp's rule; ``Date.now()``), from
    :data:`MICROSECONDS_FROM` microseconds (Go's ``UnixMicro``), from :data:`NANOSECONDS_FROM`
    nanoseconds (``time.time_ns()``, Go's ``UnixNano``): a larger unit is taken only for values
    that the smaller one would put past the year 9999, which no reading accepted before.
    """
    if value <= MILLISECONDS_ABOVE:
        return float(value)
    if value < MICROSECONDS_FROM:
        return value / 1000.0
    return value / 1e6 if value < NANOSECONDS_FROM else value / 1e9


def epoch_datetime(value: float) -> datetime | None:
    """An AMQP-style timestamp (:func:`epoch_seconds`' units) as an aware UTC datetime, None out of range.

    None for a time ``datetime`` can't hold (past the year 9999, e.g. ``10**30``) or the
    platform refuses (``OverflowError``/``OSError``, e.g. before 1970 on some), for NaN, and for
    0: what a publisher leaves in a timestamp it never set (no job was sent at the epoch; read
    as 1970 it made a job 56 years old, to ``status`` and the ``max_age`` gate too); and from
    :data:`NEGATIVE_FROM` (a negative ``time_t`` read unsigned: before 1970, not 2262-2554).
    """
    if value == 0 or value >= NEGATIVE_FROM:
        return None
    try:
        return datetime.fromtimestamp(epoch_seconds(value), UTC)
    except (ValueError, OverflowError, OSError):
        return None
