"""What the scheduler needs of an app: :class:`ScheduledApp` (an :class:`~amqpjobs.App` is one)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from amqpjobs.jobs import cron
from amqpjobs.topology.models import JobQueueLayout

if TYPE_CHECKING:
    from amqpjobs.runtime.tracing import Tracing

__all__ = ["ScheduledApp"]


class ScheduledApp(Protocol):
    """What the scheduler needs of an :class:`~amqpjobs.App`: its name, schedules and job layouts."""

    @property
    def name(self) -> str:
        """The app's name."""
        ...

    def schedules(self) -> Sequence[cron.Schedule]:
        """The app's schedules."""
        ...

    def layout_of(self, job: str) -> JobQueueLayout:
        """The layout of the job queue of job ``job``."""
        ...

    @property
    def tracing(self) -> Tracing | None:
        """The app's tracing (``App(tracing=True)``), or None: a ``send`` span per tick enqueued."""
        ...

    def note_queued(self, job: str, job_id: str, queue: str, at: float) -> None:
        """Record a committed tick job as ``queued`` in the app's results store (none: nothing)."""
        ...

    async def flush_queued(self) -> None:
        """Write the ``queued`` records still waiting (the scheduler's shutdown)."""
        ...
