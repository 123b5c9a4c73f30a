"""Writing one job message for ``enqueue``: the enqueue gate, the claim-check, and what a refusal means.

README "Backpressure" (the gate: resource alarms, queue bounds) and "Large payloads" (a
body over the store's threshold is stored and the message carries a reference).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, nullcontext, suppress
from typing import TYPE_CHECKING, Any

from amqpjobs.errors import (
    ConfigurationError,
    MessageTooLargeError,
    PublishNackedError,
    QueueFullError,
    UnroutableError,
)
from amqpjobs.jobs.envelope import OutgoingMessage, job_message
from amqpjobs.jobs.registry import JobDef
from amqpjobs.runtime.backpressure import EnqueueGate, full_at_max_length
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.wire.abc import Connection, Publisher
from amqpjobs.wire.publish import ConfirmedPublisher

if TYPE_CHECKING:
    from amqpjobs.runtime.payloads import PayloadStore

#: A publish the broker definitely did not take: nacked (a queue at max_length with reject-publish),
#: returned (mandatory, no queue bound), its exchange missing (a 404 naming it) or refused before sending
#: (too large). A payload stored for it is deleted; after any other failure (no confirm in time, the
#: channel or connection closed under it) it is kept.
REFUSED = (PublishNackedError, UnroutableError, MessageTooLargeError)
_UNGATED: AbstractAsyncContextManager[None] = nullcontext()


def new_message(
    jobdef: JobDef, body: dict[str, Any], job_id: str, now: float, priority: int | None, tenant: str | None,
    headers: Mapping[str, Any] | None,
) -> OutgoingMessage:  # fmt: skip
    """An enqueue's message (:func:`~amqpjobs.jobs.envelope.job_message`; ``now``: epoch seconds).

    Raises:
        ConfigurationError: headers that can't be sent (the message names the job and the header).
    """
    try:
        return job_message(jobdef.name, body, job_id=job_id, now=now, priority=priority, tenant=tenant, headers=headers)
    except ValueError as exc:
        raise ConfigurationError(f"job {jobdef.name!r}: {exc}") from None


async def send(
    publisher: Publisher, gate: EnqueueGate | None, connection: Connection | None, store: PayloadStore | None,
    layout: JobQueueLayout, exchange: str, routing_key: str, message: OutgoingMessage, job_id: str,
) -> None:  # fmt: skip
    """Publish job ``job_id``'s ``message`` through the gate (a real broker's publisher only) and the store.

    Raises:
        BrokerBlockedError, QueueFullError: the gate refused it, or the broker nacked it at the
            work queue's ``max_length`` (``reject-publish``); nothing sent.
        PayloadStoreError: the store could not keep a large body; nothing sent.
        PublishNackedError, UnroutableError, MessageTooLargeError: refused by the broker; its
            stored payload, if any, was deleted.
        PublishError: the outcome is uncertain; a stored payload is kept.
        BrokerError: no channel to publish on (nothing sent); a stored payload is kept.

    """
    gated: AbstractAsyncContextManager[None] = _UNGATED
    if gate is not None and connection is not None and isinstance(publisher, ConfirmedPublisher):  # not a double's
        if layout.bounds.checked:
            gated = gate.admitted(connection, layout.work_queue_for(routing_key), layout.bounds)
        elif not gate.clear(connection):  # no bounds to count against: only the alarm check, awaited when it may wait
            await gate.unblocked(connection)
    try:
        async with gated:  # counted against max_depth from here until published (README "Backpressure")
            ref = None
            if store is not None:  # claim-check: a large body goes to the store
                from amqpjobs.runtime.payloads import check_in, forget  # loaded only by an app with a store

                message, ref = await check_in(store, message)
            try:
                await publisher.publish(exchange, routing_key, message)
            except REFUSED as exc:
                if ref is not None:  # a definite refusal: the message is not in any queue, so neither is its payload
                    assert store is not None
                    await forget(store, ref)  # best effort: a failure is logged
                if (full := full_refusal(exc, layout, routing_key, job_id)) is None:
                    raise
                raise full from exc

    finally:
        if gate is not None:  # its read ahead, if this enqueue found one due, begins only now (EARLY_REFRESH)
            gate.read_ahead_if_due()


def full_refusal(exc: BaseException, layout: JobQueueLayout, routing_key: str, job_id: str) -> QueueFullError | None:
    """The :class:`QueueFullError` a nack of job ``job_id``'s publish means (its work queue at ``max_length``).

    None when ``exc`` is not a plain nack, or the work queue has no ``max_length`` with
    ``reject-publish``: the error stands as it is.
    """
    if not isinstance(exc, PublishNackedError) or isinstance(exc, QueueFullError):
        return None
    return full_at_max_length(layout, routing_key, job_id)


async def get_ready(
    publisher: Publisher, gate: EnqueueGate, connection: Connection,
    layout_of: Callable[[JobDef], JobQueueLayout], jobs: Iterable[JobDef],
) -> None:  # fmt: skip
    """Do what the first enqueues would wait for, at once: alarms read, publishing channel open, exchanges checked.

    ``layout_of`` gives each of ``jobs`` its job queue (``ConfigurationError`` for an undeclared
    one: that job is left to its enqueue, which says so); the exchange each publishes to (its
    ``x-modulus-hash`` exchange, if any) is seen to exist
    (:meth:`~amqpjobs.wire.exchange_checks.ExchangeChecks.known`). Raises nothing: a missing
    exchange or an alarm is each enqueue's error, as before.
    """
    if not isinstance(publisher, ConfirmedPublisher):  # a double's: nothing to get ready
        return
    exchanges = set()
    for job in jobs:
        with suppress(ConfigurationError):
            layout = layout_of(job)
            exchanges.add(layout.shards_exchange or layout.exchange)
    await asyncio.gather(
        gate.read_ahead(connection), publisher.ready(), *(publisher.exchanges.known(name) for name in exchanges)
    )
