"""Where a job's message is now, for ``amqpjobs job show``: from its recorded state, browsing where it rests.

A quarantined or parked job, and one with no record at all, is looked for by browsing
(:func:`amqpjobs.runtime.quarantine.browse`: nothing removed, each queue read once): its job
queue's quarantine and parked queues when its record names the job, else every job queue's
of the app's topology. Work and tier queues are never browsed (that would take deliveries
from the workers): for them the answer is the recorded one.
"""

from __future__ import annotations

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.envelope import iso_utc
from amqpjobs.jobs.results import JobStatus
from amqpjobs.runtime.app import App
from amqpjobs.runtime.quarantine import browse
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.naming import parked_queue_name
from amqpjobs.wire.settings import BrokerSettings

#: How :func:`where_now`'s line starts for a job with no record found in no queue browsed.
NO_TRACE = "unknown: no record"


async def where_now(settings: BrokerSettings, app: App, status: JobStatus) -> str:
    """One line saying where ``status``'s job is: work queue, tier, quarantine or parked queue, or done.

    Raises:
        BrokerError, BrokerUnavailableError: browsing failed.
        TopologyValidationError: the app's topology files are invalid (no record: every queue is browsed).
    """
    cur = status.current
    if cur is None:
        layouts = app.topology().layouts()
        found = await _browse(settings, layouts, status.job_id)
        if found:
            return f"{found} (found by browsing; no record to go by)"
        return (
            f"{NO_TRACE}, and not in any quarantine or parked queue of the app ({len(layouts)} job "
            "queue(s) browsed); work and tier queues are not browsed"
        )
    if status.state == "succeeded":
        done = "nowhere: it succeeded and was acked"
        last = status.history[-1] if status.history else cur
        if not any(r.state in ("quarantined", "parked", "purged") for r in status.history):
            return done
        # an older copy, quarantined before the success (status_of: one quarantined by a run after it reads
        # quarantined), may still be in quarantine or parked
        found = await _browse(settings, _layouts(app, cur.job), status.job_id)
        older = "; an older copy, quarantined before the success,"
        if found:
            return f"{done}{older} is in {found} (found by browsing)"
        if last.state in ("parked", "quarantined", "purged"):  # a park, unpark or purge after the success
            moved = {"parked": "parked in", "quarantined": "put back in", "purged": "purged from"}[last.state]
            return f"{done}{older} was {moved} {last.where}, not there now (browsed)"
        return done
    if status.state == "purged":  # the same id may have been quarantined again since: look
        found = await _browse(settings, _layouts(app, cur.job), status.job_id)
        purge = f"deleted by a purge of {cur.where} at {iso_utc(cur.at)}"
        return f"{found} (found by browsing; a copy was {purge})" if found else f"nowhere: {purge}"
    if status.state == "skipped":
        return f"nowhere: its run was skipped ({cur.detail}) and acked"
    if status.state == "duplicate":
        return "nowhere: it was already done (its effect committed by an earlier run) and was acked without running"
    if status.state in ("queued", "replayed"):
        return f"work queue {cur.where} (waiting; by its record, work queues are not browsed)"
    if cur.state == "running":  # running, or unknown once its lease passed
        return (
            f"last started by a worker at {iso_utc(cur.at)} from work queue {cur.where}; may be back in its "
            "queue after a worker loss (by its record, work queues are not browsed)"
        )
    if status.state == "retrying":
        return f"delay tier {cur.where} ({cur.detail}; by its record, tier queues are not browsed)"
    layouts = _layouts(app, cur.job)
    found = await _browse(settings, layouts, status.job_id)
    if found:
        return f"{found} (found by browsing)"
    names = " nor ".join(f"{lay.quarantine_queue} nor {parked_queue_name(lay.name)}" for lay in layouts)
    return f"not in {names} (browsed); last recorded in {cur.where}"


async def _browse(settings: BrokerSettings, layouts: tuple[JobQueueLayout, ...], job_id: str) -> str | None:
    """The first quarantine or parked queue of ``layouts`` that holds ``job_id``, or None."""
    for layout in layouts:
        for queue in (layout.quarantine_queue, parked_queue_name(layout.name)):
            try:
                name, found = await browse(settings, queue, keep_bodies=0)  # ids only
            except ConfigurationError:  # that queue does not exist (no parked queue declared)
                continue
            if any((m.delivery.message_id or m.item.job_id) == job_id for m in found):
                return name
    return None


def _layouts(app: App, job: str) -> tuple[JobQueueLayout, ...]:
    """The job queue of ``job``, or every job queue of the app when the job is not in it."""
    try:
        return (app.layout_of(job),)
    except ConfigurationError:
        return app.topology().layouts()
