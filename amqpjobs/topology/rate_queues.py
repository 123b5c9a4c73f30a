"""The queues of a rate-limited job, which its workers declare (README "Flow control" -> "Rate limits").

A rate limit is in the app's code (``@app.job(..., rate_limit="10/s")``), not in the
topology file, so each worker declares these at start; declaring is idempotent as long as
the arguments stay the same (RabbitMQ "Queues" -> "Declaration and Property Equivalence"),
so nothing here depends on the rate itself:

* the waiting room, like the job queue's suspects queue: the job queue's type, its
  quarantine exchange as dead-letter exchange (quorum: ``at-least-once``, the job queue's
  delivery limit, ``reject-publish``). It holds jobs, so it is as durable as the work queue;
* the token queue: classic and durable (RabbitMQ 4.3 refuses transient non-exclusive
  queues), ``x-max-length`` 1 with ``x-overflow`` ``drop-head`` (RabbitMQ "Queue Length
  Limit": the oldest is dropped when a new one comes, so a token waiting nowhere piles up);
  each token's own ``expiration`` bounds its age (RabbitMQ "Time-To-Live and Expiration" ->
  "Per-Message TTL in Publishers").
"""

from __future__ import annotations

from amqpjobs.topology.declarations import Declarations, QueueDecl
from amqpjobs.topology.models import DEFAULT_DELIVERY_LIMIT, JobQueueSpec
from amqpjobs.topology.naming import quarantine_exchange_name, rate_queue_names


def rate_declarations(spec: JobQueueSpec, job: str) -> Declarations:
    """The waiting room and the token queue of rate-limited job ``job`` served from job queue ``spec``."""
    names = rate_queue_names(spec.name, job)
    quorum = spec.type == "quorum"
    waiting = QueueDecl(
        name=names.waiting,
        role="waiting",
        job_queue=spec.name,
        queue_type=spec.type,
        dead_letter_exchange=quarantine_exchange_name(spec.name),
        dead_letter_strategy="at-least-once" if quorum else None,
        delivery_limit=(spec.delivery_limit or DEFAULT_DELIVERY_LIMIT) if quorum else None,
        overflow="reject-publish" if quorum else None,
    )
    tokens = QueueDecl(
        name=names.tokens, role="tokens", job_queue=spec.name, queue_type="classic", max_length=1, overflow="drop-head"
    )
    return Declarations(exchanges=(), queues=(waiting, tokens), bindings=())
