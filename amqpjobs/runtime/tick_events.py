"""What the scheduler's leader did about one tick: :class:`TickEvent` (logs, stats, tests, ``on_event``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from amqpjobs.jobs import cron


@dataclass(frozen=True)
class TickEvent:
    """What the leader did about one tick (for logs, stats and tests).

    Attributes:
        schedule: Schedule name.
        tick: The tick (UTC).
        kind: ``fired`` (on time), ``catch-up`` (one job for a missed window),
            ``skipped-missed`` (a missed window under the ``skip`` policy) or
            ``skipped-overlap`` (the previous run was still running).
        job_id: The enqueued job's id, or None when nothing was enqueued.
        missed_from / missed_until: The missed window, for ``catch-up`` and ``skipped-missed``.
        why: Why the window was not fired on time: None (no scheduler ran, or it could not
            reach the broker), or ``target-missing`` (the ticks waited behind a tick whose
            job the broker returned: its queue or shard was missing).

    """

    schedule: str
    tick: datetime
    kind: cron.TickKind
    job_id: str | None
    missed_from: datetime | None = None
    missed_until: datetime | None = None
    why: str | None = None
