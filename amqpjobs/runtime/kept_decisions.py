"""Decisions kept past a worker's stop: written at the grace's end, carried out by the next worker (README "Workers").

A delivery whose handler ran and decided (a quarantine, a retry) is held while its copy
can't be published (:mod:`.holding`). Should the stop's grace end first, a plain
redelivery would run the handler again. Instead the decided copy goes into the delivery's
own work queue (the default exchange, routed by the queue's name: it exists as long as the
queue does), marked ``amqpjobs-decided`` (:mod:`amqpjobs.jobs.decided`), confirmed, and then
the original is acked. When even that publish fails (the work queue deleted, a resource
alarm, no confirm within :data:`KEEP_BOUND`), the delivery returns as today: redelivered, and
the next worker runs it again; the stop's lines say which. Under a resource alarm the marked copy
is never left to be stored beside that redelivery: it is not published while the connection is
known blocked, and once held unread the connection is reset, so the broker drops it.

A worker that takes a marked delivery carries its decision out before anything else (rate
limit, crash screening, the ledger, a breaker, a pause): the copy goes to the quarantine or
the named tier as it is, the header dropped; a header it can't carry out is quarantined with
evidence (reason ``invalid-decision``), never published where it names.

Part of the worker's one-delivery path (:mod:`.deliveries`); its state is the worker's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

from amqpjobs.errors import (
    BrokerBlockedError,
    MessageTooLargeError,
    NotFoundError,
    PublisherClosedError,
    PublishNackedError,
    UnroutableError,
)
from amqpjobs.jobs import envelope
from amqpjobs.jobs.copy_headers import copy_headers
from amqpjobs.jobs.decided import INVALID_DECISION, decided_failure, decided_problem, read_decided
from amqpjobs.jobs.evidence import LAST_FAILURE_AT
from amqpjobs.jobs.header_values import read_text
from amqpjobs.jobs.message_key import generated_job_id
from amqpjobs.jobs.outcome import Outcome, Quarantine, RetryLater
from amqpjobs.message import OutgoingMessage
from amqpjobs.runtime.draining import Draining
from amqpjobs.runtime.fallback import ack
from amqpjobs.runtime.logs import field_value
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.wire.abc import Connection, Publisher, Received
from amqpjobs.wire.alarms import blocked_by
from amqpjobs.wire.reset import abort, ending

log = logging.getLogger("amqpjobs.worker")

#: Seconds the grace's end waits for a kept decision's confirm (below the stop's cancel bound of 1 s).
KEEP_BOUND: Final = 0.5
#: Seconds it first waits for a held delivery's own copy still awaiting its confirm (with KEEP_BOUND, under 1 s).
IN_FLIGHT_BOUND: Final = 0.4
#: A copy whose publish failed so was not stored: nothing sent, nacked, returned, its exchange missing.
_NOT_STORED: Final = (MessageTooLargeError, PublishNackedError, UnroutableError, BrokerBlockedError, NotFoundError,
                      PublisherClosedError)  # fmt: skip


def keeps(v: Outcome) -> bool:
    """Whether a delivery still held at the grace's end keeps its decision.

    A quarantine or a retry a handler's run made (here, or before: a decided copy), not a wait for a claim.
    """
    kept = isinstance(v.decision, Quarantine) or (isinstance(v.decision, RetryLater) and not v.decision.wait)
    return kept and (v.ran or v.decided)


async def _settled(in_flight: asyncio.Future[None]) -> bool | None:
    """Whether a copy in flight was stored: True (confirmed), False (refused, not stored), None (not known)."""
    done, _ = await asyncio.wait([in_flight], timeout=IN_FLIGHT_BOUND)
    if not done:
        in_flight.cancel()
        return None
    if in_flight.cancelled():
        return None
    if (exc := in_flight.exception()) is None:
        return True
    return False if isinstance(exc, _NOT_STORED) else None


class KeptDecisions:
    """Kept decisions, for :class:`~amqpjobs.runtime.carrying_out.CarryingOut` (its state is the worker's)."""

    _publisher: Publisher | None
    _quarantiner: Publisher | None
    _draining: Draining
    _publishing: Connection | None  # the copies' connection (an alarm blocks it)

    def _decided_outcome(self, layout: JobQueueLayout, delivery: Received) -> Outcome:
        """The outcome of a delivery marked ``amqpjobs-decided``: its decision, or a quarantine when it can't be had."""
        headers = delivery.headers
        read = read_decided(headers, delivery.queue, layout.tiers)
        job_id = delivery.message_id or generated_job_id()
        attempt = envelope.parse_attempt(headers.get(envelope.ATTEMPT))
        job = envelope.job_name_of(delivery.type, headers) or ""
        if isinstance(read, str):  # a header we did not write: quarantined with evidence, never published elsewhere
            return Outcome(Quarantine(INVALID_DECISION), job, job_id, attempt, 0.0, False, queue=layout.name,
                           failure=decided_problem(headers, read))  # fmt: skip
        self._draining.carried()
        failure = decided_failure(headers) if isinstance(read, Quarantine) else ("", "", "")
        if isinstance(read, RetryLater):  # the copy carries the next attempt: the one that ran is before it
            attempt = max(1, read.next_attempt - 1)
        ran_at = read_text(headers.get(LAST_FAILURE_AT)) or ""  # the run's failure time (its breaker counts it)
        return Outcome(read, job, job_id, attempt, 0.0, False, queue=layout.name, failure=failure, decided=True,
                       reached_at=ran_at)  # fmt: skip

    async def _carry_decided(self, layout: JobQueueLayout, delivery: Received, v: Outcome) -> None:
        """Publish a decided copy where its decision goes, as it came, the header dropped (confirmed).

        Raises:
            AmqpJobsError: the publish failed.
        """
        assert self._publisher is not None
        assert self._quarantiner is not None
        headers = copy_headers(delivery.headers, delivery.timestamp)
        if isinstance(v.decision, RetryLater):
            tier_queue = layout.tier_queues[delivery.queue][v.decision.tier]
            back_at = envelope.ready_at(time.time(), v.decision.delay)
            await self._publisher.publish("", tier_queue, delivery.copy(headers, v.job_id, back_at))
        else:
            copy = delivery.copy(headers, v.job_id)
            await self._quarantiner.publish(layout.quarantine_exchange, delivery.queue, copy)

    def _blocked(self) -> str | None:
        """The resource alarm that blocks the copies' connection now (``"memory"`` ...), or None."""
        return None if self._publishing is None else blocked_by(self._publishing)

    def _dropped(self, what: str) -> str:
        """After a copy's confirm did not come: reset a blocked connection, so that the copy it holds is dropped.

        The broker holds a blocked connection's publishes unread and stores them once the alarm clears;
        a TCP reset drops them (:mod:`amqpjobs.wire.reset`): the delivery then has one outcome, its
        redelivery, never the decision carried out beside a second run. Returns what the ERROR adds
        (``what``: the copy it names).
        """
        if (alarm := self._blocked()) is None:
            return ""
        assert self._publishing is not None
        if ending(self._publishing) or abort(self._publishing):  # in this step (the alarm may clear any moment)
            return (f": a resource alarm ({alarm}) holds {what} unread; the publishing connection was "
                    "reset, so the broker drops it (never stored beside the redelivery)")  # fmt: skip
        return (
            f": a resource alarm ({alarm}) holds {what} unread, and its connection can't be "
            "reset: the broker stores it once the alarm clears, and the decision is carried out beside that run"
        )

    async def _keep(
        self,
        delivery: Received,
        v: Outcome,
        copy: OutgoingMessage | None,
        why: str,
        in_flight: asyncio.Future[None] | None = None,
    ) -> None:
        """At the grace's end: publish ``copy`` (marked with its decision) into the delivery's work queue, then ack.

        ``copy``: None when it could not be made (``why`` says why). ``in_flight``: the delivery's own
        copy, published by its hold and awaiting its confirm when the grace ended: settled first (up to
        :data:`IN_FLIGHT_BOUND` s), so that the decision is never carried out twice: confirmed, the
        original is acked (no marked copy); refused (not stored), the marked copy goes; unsettled (it
        may still be stored), no marked copy goes. Never raises: a copy that can't go leaves the
        delivery to return to its queue (redelivered); the stop's lines count each.
        """
        assert self._publisher is not None
        task = asyncio.current_task()
        error = why
        if in_flight is not None:
            if (landed := await _settled(in_flight)) is True:
                if task is not None and await ack(delivery, v.job_id):
                    log.info(
                        "job %s: its %s copy, published by its hold, was confirmed as the stop's grace ended: "
                        "carried out (the original acked), no marked copy", field_value(v.job_id), v.decision,
                    )  # fmt: skip
                    self._draining.carried_out(task)
                elif task is not None:
                    self._draining.kept(task, False)
                return
            if landed is None:  # it may still be stored, unless a reset drops it
                dropped = self._dropped("that copy") or " and may still be stored"
                copy, error = None, (f"its copy, published by its hold, was not confirmed within {IN_FLIGHT_BOUND:g}s "
                                     f"of the grace's end{dropped}; no marked copy went beside it")  # fmt: skip
        if copy is not None and (alarm := self._blocked()) is not None:  # it would be held unread: not sent
            copy, error = None, (f"a resource alarm ({alarm}) blocks the publishing connection: the marked copy "
                                 "would be held unread and stored once the alarm clears, beside the redelivery, "
                                 "so it was not published")  # fmt: skip
        if copy is not None:
            publishing = asyncio.ensure_future(self._publisher.publish("", delivery.queue, copy))
            done, _ = await asyncio.wait([publishing], timeout=KEEP_BOUND)
            if not done:
                publishing.cancel()
                error = f"no confirm within {KEEP_BOUND:g}s" + self._dropped("the marked copy")
            elif (exc := publishing.exception()) is not None:
                error = f"{type(exc).__name__}: {exc}"[:300]
            elif await ack(delivery, v.job_id):
                log.info(
                    "job %s: its outcome %s still waited when the stop's grace ended; kept in a copy on %s marked "
                    "with it (the original acked): the next worker carries it out without running the job again",
                    field_value(v.job_id), v.decision, delivery.queue,
                )  # fmt: skip
                if task is not None:
                    self._draining.kept(task, True)
                return
            else:  # its channel closed first (said by ack): the broker redelivers it beside the copy
                if task is not None:
                    self._draining.kept(task, False)
                return
        log.error(
            "job %s: its outcome %s could not be kept past the stop (%s); the delivery returns to %s as a "
            "redelivery, and the next worker runs the job again", field_value(v.job_id), v.decision, error,
            delivery.queue,
        )  # fmt: skip
        if task is not None:
            self._draining.kept(task, False)
