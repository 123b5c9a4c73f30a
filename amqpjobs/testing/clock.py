"""The virtual clock of the in-memory double: retry tiers and cron ticks run on it, never sleeping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from amqpjobs.durations import parse_duration


class VirtualClock:
    """A clock that moves only when told to.

    Args:
        start: Its first reading (aware, any zone; default the real time now). A naive
            datetime is refused: cron zones and DST need to know what it means.

    Raises:
        ValueError: ``start`` is naive.

    """

    def __init__(self, start: datetime | None = None) -> None:
        start = datetime.now(UTC) if start is None else start
        if start.tzinfo is None:
            raise ValueError(f"clock start {start!r} is naive; give a zone, e.g. datetime(..., tzinfo=UTC)")
        self.seconds = start.timestamp()

    def now(self) -> datetime:
        """The clock's reading (UTC, aware)."""
        return datetime.fromtimestamp(self.seconds, UTC)

    def advance(self, by: float | str | timedelta) -> datetime:
        """Move forward ``by`` (seconds, a duration string such as ``"1h"``, or a timedelta); returns the new time.

        Raises:
            ValueError: a negative or unreadable duration.

        """
        seconds = by.total_seconds() if isinstance(by, timedelta) else parse_duration(by)
        if seconds < 0:
            raise ValueError(f"the virtual clock only moves forward (got {by!r})")
        self.seconds += seconds
        return self.now()

    def move_to(self, when: float) -> None:
        """Move to virtual epoch seconds ``when`` (never back)."""
        self.seconds = max(self.seconds, when)
