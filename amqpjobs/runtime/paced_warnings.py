"""Warnings about something that fails again at every look: one line, then paced, then one when it recovers.

The scheduler's leader looks at its schedules about once a second; a schedule whose
exchange or queue is missing fails at each look. :class:`PacedWarnings` logs the first
failure as it is, then at most one line per ``every`` seconds with the number of failed
looks since the last line, and one line when the thing succeeds again (README "Schedules").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from amqpjobs.durations import format_duration


@dataclass
class _Failing:
    since: float  # monotonic time of the first failure
    logged: float  # monotonic time of the last line
    unlogged: int = 0  # failed looks since the last line
    looks: int = 1  # failed looks in all


class PacedWarnings:
    """Paced warnings on ``log`` per key: what fails, as the line names it (``"scheduler replica h:1: schedule s"``).

    Args:
        log: Where the lines go (level WARNING, the recovery line too, so that a reader of
            warnings sees both ends).
        every: Seconds between two lines about one key that keeps failing (> 0).
        clock: Monotonic seconds (tests may pass another).

    """

    def __init__(self, log: logging.Logger, every: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.every = every
        self._clock = clock
        self._failing: dict[str, _Failing] = {}

    def failed(self, key: str, error: str, suffix: str = "", exc_info: bool = False) -> None:
        """Log a failure of ``key`` unless a line about it was logged less than ``every`` seconds ago.

        The first line is ``"<key>: <error><suffix>; repeated at most every <every> while it
        fails"``; the next ``"<key>: still failing: <n> failed look(s) in <seconds> since the
        last line, failing for <seconds>: <error>"``.

        Args:
            key: What fails.
            error: How (the exception's text).
            suffix: What happens meanwhile (first line only), e.g. ``"; its tick waits"``.
            exc_info: Log the traceback with the line (an unexpected error).

        """
        now = self._clock()
        failing = self._failing.get(key)
        if failing is None:
            self._failing[key] = _Failing(since=now, logged=now)
            every = format_duration(self.every)
            self.log.warning("%s: %s%s; repeated at most every %s while it fails", key, error, suffix, every,
                             exc_info=exc_info)  # fmt: skip
            return
        failing.looks += 1
        failing.unlogged += 1
        if now - failing.logged < self.every:
            return
        self.log.warning("%s: still failing: %d failed look(s) in %s since the last line, failing for %s: %s", key,
                         failing.unlogged, _seconds(now - failing.logged), _seconds(now - failing.since), error,
                         exc_info=exc_info)  # fmt: skip
        failing.logged, failing.unlogged = now, 0

    def succeeded(self, key: str) -> None:
        """Log ``"<key>: recovered after <n> failed look(s) over <seconds>"`` when ``key`` was failing."""
        failing = self._failing.pop(key, None)
        if failing is not None:
            self.log.warning("%s: recovered after %d failed look(s) over %s", key, failing.looks,
                             _seconds(self._clock() - failing.since))  # fmt: skip


def _seconds(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 60 else format_duration(round(seconds))
