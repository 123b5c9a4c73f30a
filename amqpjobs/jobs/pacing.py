"""Pacing of an operator's moves (replay, park, unpark, purge) at ``--rate``: no burst after a stall (no I/O).

``--rate`` exists so a replay does not flood the work queue's consumers or a third party
they call. A schedule kept from the run's start (move ``n`` at ``start + n / rate``) keeps
the average but makes up lost time: after a stall of the mover (a slow confirm, a loaded
machine, a laptop's sleep, SIGSTOP) every move owed goes at once, as fast as the confirms
come. :class:`Pace` is a token bucket instead: at most :data:`CATCH_UP` seconds of moves
may still go at once; the time lost beyond that is not made up.
"""

from __future__ import annotations

from typing import Final

#: Seconds of moves owed that may still start at once after a stall: enough to absorb the
#: event loop's sleep overshoot (a millisecond or so a move) so the average stays at the rate.
CATCH_UP: Final = 0.1


class Pace:
    """When each move of a run at ``rate`` moves per second may start.

    Over any stretch of ``T`` seconds at most ``rate * (T + CATCH_UP) + 1`` moves start, however
    long the mover stalled before it; with no stall the moves start ``1 / rate`` s apart from
    the first one.

    Args:
        rate: Moves per second, checked by the caller (e.g.
            :func:`~amqpjobs.jobs.replay_plan.check_rate`); None: no pacing.

    """

    def __init__(self, rate: float | None) -> None:
        self._interval = None if rate is None else 1.0 / rate
        self._next: float | None = None  # the start time of the next move (None: none started yet)

    def wait(self, now: float) -> float:
        """Seconds from ``now`` (``time.monotonic()``) until the next move may start; counts that move as started.

        The caller sleeps that long (0.0: start at once), then starts the move.
        """
        if self._interval is None:
            return 0.0
        slot = now if self._next is None else max(self._next, now - CATCH_UP)
        self._next = slot + self._interval
        return max(0.0, slot - now)
