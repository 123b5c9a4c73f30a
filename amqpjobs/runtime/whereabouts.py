"""Where a job's message is now, for ``amqpjobs job show``: from its recorded state, browsing where it rests.

A quarantined or parked job is looked for in its job queue's quarantine and parked queues
by browsing (:func:`amqpjobs.runtime.quarantine.browse`: nothing removed, each queue read
once, so it costs one pass over those queues). Work and tier queues are never browsed
(that would take deliveries from the workers): for them the answer is the recorded one.
"""

from __future__ import annotations

from amqpjobs.errors import ConfigurationError
from amqpjobs.jobs.results import JobStatus
from amqpjobs.runtime.app import App
from amqpjobs.runtime.quarantine import browse
from amqpjobs.topology.naming import parked_queue_name
from amqpjobs.wire.settings import BrokerSettings


async def where_now(settings: BrokerSettings, app: App, status: JobStatus) -> str:
    """One line saying where ``status``'s job is: work queue, tier, quarantine or parked queue, or done.

    Raises:
        BrokerError, BrokerUnavailableError: browsing failed.
    """
    cur = status.current
    if cur is None:
        return "unknown: no record to go by (quarantine and parked queues not searched without a job name)"
    if status.state == "succeeded":
        return "nowhere: it succeeded and was acked"
    if status.state in ("running", "replayed"):
        what = "held by a worker" if status.state == "running" else "waiting"
        return f"work queue {cur.where} ({what}; by its record, work queues are not browsed)"
    if status.state == "retrying":
        return f"delay tier {cur.where} ({cur.detail}; by its record, tier queues are not browsed)"
    try:
        layout = app.layout_of(cur.job)
    except ConfigurationError:
        return f"{cur.where or 'unknown'} (job {cur.job!r} is not in this app: not browsed)"
    for queue in (layout.quarantine_queue, parked_queue_name(layout.name)):
        try:
            name, found = await browse(settings, queue)
        except ConfigurationError:  # that queue does not exist (no parked queue declared)
            continue
        if any((m.delivery.message_id or m.item.job_id) == status.job_id for m in found):
            return f"{name} (found by browsing)"
    return (
        f"not in {layout.quarantine_queue} nor {parked_queue_name(layout.name)} (browsed); last recorded in {cur.where}"
    )
