"""Rate limits of jobs: ``@app.job(..., rate_limit="10/s")`` (pure: parsing and the token schedule).

A rate limit of N per period is kept with tokens on the broker (:mod:`amqpjobs.runtime.rate_limits`):
one emitter across the app mints a token every ``period / N`` seconds, on absolute times
(:func:`tick_time`), and each start takes one. The broker drops a token half an interval
after the time it was minted for (its ``expiration``, :func:`token_expiration`), and a worker
drops one it held over :data:`HOLD_FRACTION` of an interval before a delivery took it. So a
start comes at most 3/4 of an interval after its token's time (plus the token's trip from
the broker to the worker, well under a millisecond on a LAN), under one interval; token times
are one interval apart, so every window of one period holds at most N + 1 starts (11 in any
second for ``10/s``), however many worker processes take tokens.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

from amqpjobs.errors import ConfigurationError

#: Seconds per period unit of a rate limit.
PERIODS: Final = {"s": 1.0, "m": 60.0, "h": 3600.0}
#: The highest rate supported, in starts per second: one token a message, taken one at a time by
#: each worker process (a round trip each), good for half an interval after its time (5 ms at 100/s).
MAX_PER_SECOND: Final = 100.0
#: The forms a rate limit takes, for messages.
FORMS: Final = (
    "'<count>/s', '<count>/m' or '<count>/h' with a whole count >= 1 in ASCII digits, no leading zero and no "
    "spaces (e.g. '10/s', '30/m', '500/h')"
)
#: A worker drops a token it held longer than this fraction of an interval (a blocked event loop).
HOLD_FRACTION: Final = 0.25
#: Header of a delivery moved to its job's waiting room: the work queue it came from.
WAITING_FROM: Final = "amqpjobs-waiting-from"

#: Strict: ASCII digits without a leading zero, no spaces, nothing after the unit.
_RATE = re.compile(r"([1-9][0-9]*)/([smh])", re.ASCII)
_UNIT_NAMES: Final = {"s": "second", "m": "minute", "h": "hour"}


@dataclass(frozen=True)
class RateLimit:
    """At most ``count`` starts per ``period`` seconds, across every worker process of the app.

    Attributes:
        count: Starts per period (>= 1).
        period: The period in seconds (1, 60 or 3600).
        text: The rate as written, normalised (``10/s``).
    """

    count: int
    period: float
    text: str

    @property
    def interval(self) -> float:
        """Seconds between two tokens: ``period / count``."""
        return self.period / self.count

    @property
    def per_second(self) -> float:
        """Starts per second."""
        return self.count / self.period

    def __str__(self) -> str:
        return self.text


def parse_rate_limit(value: str, job: str = "") -> RateLimit:
    """Read a rate limit such as ``"10/s"``, ``"30/m"`` or ``"500/h"``.

    Args:
        value: ``<count>/<unit>``: a whole count >= 1 per second (``s``), minute (``m``) or hour (``h``),
            strictly: ASCII digits without a leading zero, no spaces.
        job: The job's name, for the message.

    Returns:
        The :class:`RateLimit`.

    Raises:
        ConfigurationError: not such a form (the message names the value and the forms), or
            more than :data:`MAX_PER_SECOND` starts per second.
    """
    who = f"job {job!r}: " if job else ""
    match = _RATE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ConfigurationError(f"{who}rate_limit {value!r} is not a rate; use {FORMS}")
    count, unit = int(match.group(1)), match.group(2)
    rate = RateLimit(count, PERIODS[unit], f"{count}/{unit}")
    if rate.per_second > MAX_PER_SECOND:
        raise ConfigurationError(
            f"{who}rate_limit {value!r} is {_exactly(rate)}; at most {MAX_PER_SECOND:g}/s is "
            f"supported (one token a start, good for half an interval: {500 / MAX_PER_SECOND:g} ms at that rate); "
            "spread the job over several job names or drop the limit"
        )
    return rate


def _exactly(rate: RateLimit) -> str:
    """``101 starts a second``, or ``360001 starts an hour (100.00027777777778 a second)``: never rounded."""
    unit = next(u for u, p in PERIODS.items() if p == rate.period)
    if unit == "s":
        return f"{rate.count} starts a second"
    article = "an" if unit == "h" else "a"
    return f"{rate.count} starts {article} {_UNIT_NAMES[unit]} ({rate.per_second!r} a second)"


def first_tick(rate: RateLimit, now: float) -> int:
    """The index of the first token time at or after ``now`` (seconds since the epoch).

    Token ``k`` is minted for ``k * interval`` seconds since the epoch: every emitter, and the
    one that takes over from it, keeps to the same grid, so a take-over mints no burst.
    """
    return math.ceil(now / rate.interval - 1e-9)


def tick_time(rate: RateLimit, k: int) -> float:
    """When token ``k`` is due, in seconds since the epoch."""
    return k * rate.interval


def token_expiration(rate: RateLimit, k: int, now: float) -> float:
    """Seconds token ``k``, published at ``now``, may still wait: until half an interval after its time.

    0 or less: too late, not worth publishing (the emitter skips it; the rate only drops).
    """
    return tick_time(rate, k) + rate.interval / 2 - now


def next_tick(rate: RateLimit, k: int, now: float) -> int:
    """The token after ``k``, skipping those already too late at ``now`` (:func:`token_expiration`)."""
    return max(k + 1, first_tick(rate, now - rate.interval / 2))
