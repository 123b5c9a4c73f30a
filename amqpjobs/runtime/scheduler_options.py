"""How a scheduler replica runs: :class:`SchedulerOptions` (README "Schedules")."""

from __future__ import annotations

from dataclasses import dataclass

from amqpjobs.durations import duration_argument


@dataclass(frozen=True)
class SchedulerOptions:
    """How a scheduler replica runs.

    Attributes:
        schedules: Names of the schedules to run; None = every schedule of the app.
            Replicas of one app must run the same set (they share one election).
        reoffer: Seconds between a following replica's offers of a leader token (an
            offer is refused while a token waits; it heals a token lost by a purge).
        max_sleep: Longest sleep in seconds between two looks at the clock while leading;
            bounds how late a wall-clock step or a lost leadership is noticed.
        warn_every: Seconds between two warnings about a schedule that keeps failing (its
            first failure and its recovery are logged at once).
        clock_tolerance: Seconds a schedule's cursor may be ahead of this replica's clock and
            be waited for (a leader whose clock runs behind the previous one's: no tick fires
            twice). A cursor further ahead (a clock stepped forward, then back) is not waited
            for: the schedule fires again from now on, with a warning (README "Clocks").

    """

    schedules: tuple[str, ...] | None = None
    reoffer: float = 5.0
    max_sleep: float = 1.0
    warn_every: float = 60.0
    clock_tolerance: float = 60.0

    def __post_init__(self) -> None:
        """Each seconds field as float seconds (a duration string too), or ConfigurationError naming it."""
        for field in ("reoffer", "max_sleep", "warn_every", "clock_tolerance"):
            zero = "no cursor ahead of the clock is waited for" if field == "clock_tolerance" else None
            seconds = duration_argument(f"SchedulerOptions({field}=...)", getattr(self, field), zero_means=zero)
            object.__setattr__(self, field, seconds)
