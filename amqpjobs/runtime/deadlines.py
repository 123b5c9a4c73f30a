"""Handler timeouts on one loop timer per time limit, instead of ``asyncio.timeout``'s one timer per run.

``asyncio.timeout`` arms a loop timer for every run and cancels it at the end: a timer
handle, a heap push and a cancelled handle left for the loop to sweep, per job (about
5 µs of CPU per job in the worker, issue 22). Runs with the same limit end their time in
the order they started (the loop's clock never goes back), so :class:`Deadlines` keeps
the runs of each limit in that order with one timer, armed for the earliest. When it
fires, every run of that limit past its deadline is cancelled (``task.cancel()``, as
``asyncio.timeout`` does), and the timer is armed again for the earliest run left. A run
that ends leaves its place at once; the timer stays as it is (when it fires, it finds
nothing due and is armed for the next run).

A :class:`Deadline` ends as ``asyncio.Timeout`` does (Python 3.11): the cancellation it
caused is taken back (``uncancel``), and a ``CancelledError`` is the run's timeout only if
no other cancellation came meanwhile (the worker stopping past its grace).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class Deadline:
    """One run's deadline (:meth:`Deadlines.start`); :meth:`end` it exactly once, when the run ends.

    Attributes:
        at: The loop time (seconds) the run is cancelled at.
        expired: Whether it was cancelled for its deadline.
    """

    __slots__ = ("_cancelling", "_lane", "_task", "at", "counted", "ended", "expired", "what")

    def __init__(self, task: asyncio.Task[Any], at: float, lane: dict[Deadline, None], what: Any) -> None:
        self._task = task
        self._cancelling = task.cancelling()
        self._lane = lane
        self.at = at
        self.expired = False
        self.ended = False
        #: What the caller said the run is (:meth:`Deadlines.start`), for ``on_expired``.
        self.what = what
        #: Free for ``on_expired``'s owner: it counted the run as going on past its cancellation.
        self.counted = False

    @property
    def task(self) -> asyncio.Task[Any]:
        """The task the deadline cancels (the run's)."""
        return self._task

    def _expire(self) -> None:
        self.expired = True
        self._task.cancel()

    def end(self, exc: BaseException | None) -> bool:
        """The run ended with ``exc`` (None: it returned). Returns whether that is its timeout.

        True when the deadline cancelled the run, ``exc`` is the ``CancelledError`` and no
        other cancellation of the task is pending: the caller raises its ``TimeoutError``.
        """
        self._lane.pop(self, None)
        self.ended = True
        if not self.expired:
            return False
        return self._task.uncancel() <= self._cancelling and isinstance(exc, asyncio.CancelledError)


class _Lane:
    """The runs of one time limit on one loop, in deadline order, and the timer for the earliest."""

    __slots__ = ("loop", "on_expired", "runs", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_expired: Callable[[Deadline], None] | None) -> None:
        self.loop = loop
        self.on_expired = on_expired
        self.runs: dict[Deadline, None] = {}  # insertion order = deadline order
        self.timer: asyncio.TimerHandle | None = None

    def fire(self, when: float) -> None:
        """The timer armed for ``when`` is due: cancel each run due by then, arm it for the next."""
        self.timer = None
        runs = self.runs
        while runs:
            first = next(iter(runs))
            if first.at > when:
                self.timer = self.loop.call_at(first.at, self.fire, first.at)
                return
            del runs[first]
            first._expire()
            if self.on_expired is not None:
                self.on_expired(first)


class Deadlines:
    """The time limits of the handler runs on one event loop (a worker's)."""

    def __init__(self, on_expired: Callable[[Deadline], None] | None = None) -> None:
        """``on_expired``: called with each deadline that cancelled its run, right after the cancel."""
        self._lanes: dict[float, _Lane] = {}
        self._on_expired = on_expired

    def start(self, limit: float, task: asyncio.Task[Any] | None = None, what: Any = None) -> Deadline:
        """Cancel the current task ``limit`` seconds from now unless its :class:`Deadline` ends first.

        ``task``: the current task, when the caller has it already (else looked up here).
        ``what``: kept on the deadline for ``on_expired`` (:attr:`Deadline.what`).

        Raises:
            RuntimeError: not called from a task on a running loop.
        """
        loop = asyncio.get_running_loop()
        if task is None:
            task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("a deadline is for code running in a task")
        lane = self._lanes.get(limit)
        if lane is None or lane.loop is not loop:
            lane = self._lanes[limit] = _Lane(loop, self._on_expired)
        at = loop.time() + limit
        deadline = Deadline(task, at, lane.runs, what)
        lane.runs[deadline] = None
        if lane.timer is None:
            lane.timer = loop.call_at(at, lane.fire, at)
        return deadline
