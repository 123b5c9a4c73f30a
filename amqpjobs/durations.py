"""Duration strings ("30s", "5m", "1h30m", "250ms") and plain seconds.

The Python API and the CLI take durations as seconds (``int``/``float``) or as
duration strings; this module turns both into float seconds. Conversion to the
milliseconds that AMQP arguments use happens in exactly one place:
:func:`amqpjobs.wire.arguments.to_milliseconds`.
"""

from __future__ import annotations

import math
import re

from amqpjobs.errors import ConfigurationError

_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")  # ASCII digits: \d takes any script's
#: An upper-case ``M`` unit (not ``MS``): minutes to us, months to systemd.time and ISO 8601.
_MONTH_OR_MINUTE = re.compile(r"[0-9]M(?![sS])")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: The longest duration taken, in seconds (100 years, ``36500d``): any duration fits a
#: ``timedelta``, a date that far back or ahead, and a thread or event-loop timeout.
MAX_DURATION = 36500 * 86400.0


def parse_duration(value: str | float | int, *, allow_zero: bool = False) -> float:
    """Return a duration in seconds.

    Args:
        value: Seconds as ``int``/``float``, or a string made of one or more
            ``<number><unit>`` parts with units ``ms``, ``s``, ``m``, ``h``, ``d``
            (e.g. ``"30s"``, ``"5m"``, ``"1h30m"``, ``"1.5s"``, ``"250ms"``). A bare
            number string (``"12"``) is read as seconds. Units are read in any case (``"5S"``),
            but an upper-case ``M`` (not ``MS``) is refused: a month in systemd.time and ISO 8601.
        allow_zero: Accept 0 (``0``, ``"0"``, ``"0s"`` ...) too.

    Returns:
        The duration in seconds, a finite float > 0 (>= 0 with ``allow_zero``).

    Raises:
        ValueError: the value is not a duration, or is zero (unless ``allow_zero``), negative,
            NaN or infinite, or has an upper-case ``M`` unit. The message shows the accepted forms.
        DurationTooLongError: (a ValueError) longer than :data:`MAX_DURATION` (100 years).

    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; give seconds or a string like '30s', '5m'")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond any float (10**400): far longer than the longest taken
            raise _too_long(value) from None
    elif isinstance(value, str):
        if _MONTH_OR_MINUTE.search(value):  # units are read in any case, but 'M' means a month to many
            raise ValueError(
                f"{value!r} is ambiguous: an upper-case 'M' is a month in systemd and ISO 8601 (P6M), not a minute; "
                "write minutes as 'm' ('30m') and months as days ('180d')"
            )
        text = value.strip().lower()
        if text.startswith("-") and _is_duration(text[1:]):  # '-1s': a duration, but not a positive one
            raise _not_positive(value, allow_zero)
        if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", text):
            seconds = float(text)
        else:
            pos = 0
            seconds = 0.0
            last_unit = math.inf
            for match in _PART.finditer(text):
                unit = _UNIT_SECONDS[match.group(2)]
                if match.start() != pos or unit >= last_unit:  # each unit once, largest first
                    pos = -1
                    break
                seconds += float(match.group(1)) * unit
                last_unit = unit
                pos = match.end()
            if pos != len(text) or not text:
                raise ValueError(
                    f"{value!r} is not a duration; use forms like '250ms', '30s', '5m', '1h30m' "
                    "(each unit once, largest first)"
                )
        if math.isinf(seconds):  # digits beyond any float ('1' * 400 + 's'): a duration, far too long
            raise _too_long(value)
    else:
        raise ValueError(f"{value!r} is not a duration; give seconds or a string like '30s', '5m'")
    if allow_zero and seconds == 0:
        return 0.0
    if not math.isfinite(seconds) or seconds <= 0:
        raise _not_positive(value, allow_zero)
    if seconds > MAX_DURATION:
        raise _too_long(value)
    return seconds


def _too_long(value: str | float | int) -> DurationTooLongError:
    shown = repr(value) if not isinstance(value, int) or value.bit_length() <= 1024 else "an integer over 1e308"
    if len(shown) > 80:  # hundreds of digits: the start says what it was
        shown = f"{shown[:40]}... ({len(shown)} characters)"
    return DurationTooLongError(f"{shown} is longer than 100 years (36500d), the longest duration taken")


class DurationTooLongError(ValueError):
    """A duration above :data:`MAX_DURATION` (a ``ValueError``: a duration, but not one taken)."""


def _not_positive(value: object, allow_zero: bool) -> ValueError:
    zero = "0 or " if allow_zero else ""
    return ValueError(f"{value!r} must be {zero}a positive, finite duration (e.g. '5s')")


def _is_duration(text: str) -> bool:
    try:
        parse_duration(text, allow_zero=True)
    except ValueError:
        return False
    return True


def duration_argument(argument: str, value: str | float | int, *, zero_means: str | None = None) -> float:
    """:func:`parse_duration` for a named argument of the library: seconds, or ConfigurationError.

    Args:
        argument: How the message names the argument (``"App(blocked_timeout=...)"``).
        value: What the caller gave.
        zero_means: Accept 0, which means this (``"refuse at once"``); None: refuse 0.

    Raises:
        ConfigurationError: not a duration, negative, NaN, infinite (or 0 without
            ``zero_means``): names ``argument``, what was wrong and what is allowed.

    """
    try:
        return parse_duration(value, allow_zero=zero_means is not None)
    except ValueError as exc:
        zero = f"0 ({zero_means}), or " if zero_means is not None else ""
        raise ConfigurationError(
            f"{argument}: {exc}; allowed: {zero}seconds > 0 (int or float) or a duration string such as '250ms', "
            "'30s', '5m', '1h30m'"
        ) from None


def format_duration(seconds: float) -> str:
    """Format seconds as the shortest duration string that states them exactly.

    Used for retry tier names (``5.0`` → ``"5s"``, ``90`` → ``"90s"``, ``600`` → ``"10m"``,
    ``0.25`` → ``"250ms"``, ``3600`` → ``"1h"``).

    Args:
        seconds: A positive duration in seconds.

    Returns:
        A string that :func:`parse_duration` reads back to the same number of
        milliseconds.

    """
    ms = round(seconds * 1000)
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
