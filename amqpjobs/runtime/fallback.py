"""A delivery whose copy could not be published: held until the copy goes, or rejected once into quarantine.

A worker settles a delivery by publishing a copy (a delay tier, the quarantine, the suspects
queue, its work queue) and then acking the original (:mod:`amqpjobs.runtime.deliveries`).
When that publish fails:

* a failure a wait can cure (a missing queue or exchange, a nack, no confirm in time): the
  delivery is held unacked until its copy goes (:mod:`amqpjobs.runtime.holding`), then acked;
* a copy that can never go (headers over ``frame_max``, a bug of ours), whatever the
  decision: once the quarantine exists and is bound to its exchange (bound again first:
  a dead-letter into an exchange that routes nowhere is dropped), the delivery is rejected and the broker
  dead-letters it into the quarantine as it is (``x-death`` reason ``rejected``). Never a
  requeue, not even for a registered start or a hand-back: the same delivery would come
  straight back, ``redelivered``, to the same refusal, forever (README "Bad messages"). Unless its
  ``x-death`` is one RabbitMQ 3.10 can't count (a publisher's forgery:
  :func:`~amqpjobs.jobs.header_values.broker_cant_dead_letter`), whose dead-lettering crashes the
  queue: then the message goes into the quarantine as it came, the broker's ``x-`` headers
  removed (so it fits the frame it came in), without evidence, and is acked;
* its channel closed meanwhile: the broker has the message back and redelivers it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from amqpjobs.jobs.header_values import broker_cant_dead_letter
from amqpjobs.jobs.outcome import Outcome, Quarantine
from amqpjobs.jobs.quarantine import NO_EVIDENCE
from amqpjobs.runtime.holding import Holding, needs_of
from amqpjobs.runtime.logs import field_value
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.wire.abc import Received
from amqpjobs.wire.acks import DeliveryChannelClosed

log = logging.getLogger("amqpjobs.worker")

#: The reason a delivery rejected into quarantine is reported with (the quarantine lists it so).
REJECTED = "x-death:rejected"


async def ack(delivery: Received, job_id: str, copied: bool = True) -> bool:
    """Ack ``delivery``; False when its channel has closed (the broker redelivers it).

    ``copied``: its copy is confirmed, so the ack goes at once, not batched: until the broker
    has it, a worker that dies leaves the job two lives (README "When a job crashes").
    """
    try:
        await delivery.ack(at_once=copied)
    except DeliveryChannelClosed:
        what = (
            "the copy already published makes this a duplicate the handler must tolerate"
            if copied
            else "no copy was made: it is handled again, unless its queue was deleted"
        )
        log.warning(
            "job %s: its channel closed before the ack; the broker redelivers it (%s)", field_value(job_id), what
        )
        return False
    return True


async def fall_back(
    holding: Holding,
    layout: JobQueueLayout,
    delivery: Received,
    outcome: Outcome,
    error: Exception,
    publish: Callable[[], Awaitable[None]],
    as_it_came: Callable[[], Awaitable[None]] | None = None,
) -> bool:
    """Settle ``delivery`` after publishing the copy ``decision`` needs failed with ``error``.

    Args:
        holding: The worker's holds (waits for missing broker objects).
        layout: The delivery's job queue.
        delivery: The delivery, unacked.
        outcome: What the worker decided (its copy is what failed): once rejected into
            quarantine, marked :attr:`~amqpjobs.jobs.outcome.Outcome.rejected` with decision
            ``Quarantine("x-death:rejected")`` (reported ``quarantined``, README "Workers").
        error: Why the first publish failed.
        publish: Publishes the copy again (raises on failure).
        as_it_came: Publishes the message into the quarantine as it came, the broker's ``x-``
            headers removed (raises on failure): instead of the reject when the broker can't
            dead-letter it.

    Returns:
        Whether the delivery was acked (False when rejected or its channel closed).
    """
    decision, job_id = outcome.decision, outcome.job_id
    settled = await holding.settle(
        delivery.queue, needs_of(layout, delivery.queue, decision), publish, error, lambda: delivery.settleable,
        route=(layout.quarantine_queue, layout.quarantine_exchange),
    )  # fmt: skip
    if settled == "published":
        return await ack(delivery, job_id)
    if settled == "gone":
        return False
    forged = broker_cant_dead_letter(delivery.headers, delivery.queue, "rejected") if as_it_came else None
    if forged and as_it_came is not None:  # a reject would crash the queue, at every redelivery (3.10.8)
        try:
            await as_it_came()
            settled = "published"
        except Exception as exc:  # a missing quarantine, a nack...: held until it goes, as any copy
            settled = await holding.settle(
                delivery.queue, needs_of(layout, delivery.queue, Quarantine(NO_EVIDENCE)), as_it_came, exc,
                lambda: delivery.settleable, route=(layout.quarantine_queue, layout.quarantine_exchange),
            )  # fmt: skip
        if settled == "gone":
            return False
        if settled == "published":
            log.error(
                "job %s: the copy for %s can never be published (%s), and the broker can't dead-letter it (%s: "
                "RabbitMQ 3.10 crashes the queue); published it into %s as it came, without x-death, no evidence",
                field_value(job_id), decision, error, field_value(forged), layout.quarantine_queue,
            )  # fmt: skip
            outcome.decision = Quarantine(NO_EVIDENCE)
            if not outcome.failure[0]:
                outcome.failure = (type(error).__name__, str(error), "")
            return await ack(delivery, job_id)
    try:  # "refused": the quarantine exists (settle waited for it), the copy can never go
        await delivery.reject()
    except DeliveryChannelClosed:
        log.warning("job %s: its copy can't be published (%s) and the channel is gone: the broker redelivers",
                    field_value(job_id), error)  # fmt: skip
        return False
    log.error(
        "job %s: the copy for %s can never be published (%s); rejected the delivery of %s once, so the broker "
        "dead-letters it into %s as it is, with x-death reason 'rejected'", field_value(job_id), decision, error,
        delivery.queue, layout.quarantine_queue,
    )  # fmt: skip
    outcome.decision, outcome.rejected = Quarantine(REJECTED), True
    if not outcome.failure[0]:  # nothing failed in the handler: the copy's refusal is the error reported
        outcome.failure = (type(error).__name__, str(error), "")
    return False
