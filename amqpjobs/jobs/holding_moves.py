"""Moves between a job queue's quarantine and parked queue (park, unpark): options, headers, pacing (no I/O).

``quarantine park`` moves quarantined jobs to ``<job queue>.parked``; ``quarantine unpark``
moves parked jobs back to ``<job queue>.quarantine`` without running them. Both are one
mover (:mod:`amqpjobs.runtime.parking`); what differs is said here: which queue each takes
from and sends to, and the headers of the copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.quarantine import PARKED_AT, QuarantinedJob, Selection, park_headers
from amqpjobs.jobs.replay_plan import check_rate
from amqpjobs.printable import printable
from amqpjobs.topology.naming import PARKED_SUFFIX, QUARANTINE_SUFFIX, own_queue_words, parse_queue_name

#: What each move's summary calls a moved message.
DONE: Final = {"park": "parked", "unpark": "unparked", "purge": "deleted"}


@dataclass(frozen=True)
class MoveOptions:
    """How a park or unpark (or a filtered purge) goes.

    Attributes:
        selection: Filters; the messages that do not match stay, in their place.
        limit: Take at most this many matching messages (None: every one); at least 1.
        rate: At most this many moves per second (None: as fast as the confirms come); within
            replay's bounds (:func:`~amqpjobs.jobs.replay_plan.check_rate`); paced by
            :class:`~amqpjobs.jobs.pacing.Pace`.
        dry_run: Take the lock, check each copy, move nothing.

    Raises:
        ConfigurationError: ``limit`` below 1, or ``rate`` not as above (naming the option).

    """

    selection: Selection = field(default_factory=Selection)
    limit: int | None = None
    rate: float | None = None
    dry_run: bool = False

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ConfigurationError(f"--limit must be a whole number of messages, at least 1 (got {self.limit})")
        if self.rate is not None:
            check_rate(self.rate)


def other_queue_problem(name: str) -> str | None:
    """What queue of ours ``name`` is when it is none a holding command takes (a job queue, its quarantine or parked).

    ``'work.retry.5s' is retry tier 5s of work queue work (job queue work), not a quarantine or parked
    queue: give its job queue, work``; the ledger marker and the scheduler's queues name no job queue:
    ``give a job queue's name``. By the name alone (the one parser of our names): None for any name
    read as a job queue's (a typo included: its look-up then says it is missing).
    """
    role = parse_queue_name(name)
    if role.kind in ("work", "quarantine", "parked"):
        return None
    fix = f"its job queue, {printable(role.job_queue)}" if role.job_queue else "a job queue's name"
    return f"{printable(repr(name))} is {own_queue_words(role)}, not a quarantine or parked queue: give {fix}"


def unpark_source(name: str) -> str:
    """The parked queue ``quarantine unpark NAME`` takes from: ``NAME`` when parked, else ``<NAME>.parked``.

    Raises:
        ConfigurationError: ``name`` is a quarantine queue (unpark moves into it, never out of it), or
            another queue of ours (:func:`other_queue_problem`).

    """
    if problem := other_queue_problem(name):
        raise ConfigurationError(problem)
    if name.endswith(PARKED_SUFFIX):
        return name
    if name.endswith(QUARANTINE_SUFFIX):
        job_queue = name.removesuffix(QUARANTINE_SUFFIX)
        raise ConfigurationError(
            f"{name!r} is a quarantine queue: unpark takes from a parked queue: give {job_queue}{PARKED_SUFFIX} "
            f"(or {job_queue}); nothing was moved"
        )
    return name + PARKED_SUFFIX


def unpark_headers(headers: Mapping[str, Any], item: QuarantinedJob, *, timestamp: Any) -> dict[str, Any]:
    """Headers of an unparked copy: the parked message's, evidence and all, without ``amqpjobs-parked-at``.

    The evidence a park kept goes back as it is, so the job is listed, filtered and replayed
    from quarantine as it was before its park. A parked message whose only evidence is the
    broker's ``x-death`` (parked by an amqpjobs that copied it as is, or put there by other
    means) gets it written as our evidence headers, as a park does
    (:func:`~amqpjobs.jobs.quarantine.park_headers`): the copy can't carry ``x-death``.
    ``timestamp``: the received ``timestamp`` property (:func:`~amqpjobs.jobs.copy_headers.copy_headers`).
    """
    return {k: v for k, v in park_headers(headers, item, "", timestamp=timestamp).items() if k != PARKED_AT}
