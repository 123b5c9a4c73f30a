"""The broker objects a topology expands into: exchanges, queues and bindings to declare.

Plain frozen pydantic models without I/O, built by
:meth:`amqpjobs.topology.models.Topology.declarations` and declared by
:mod:`amqpjobs.wire.declare` (or exported by :mod:`amqpjobs.wire.definitions`). Settings are in
our own units (seconds); milliseconds appear only in :mod:`amqpjobs.wire.arguments`.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

#: Exchange types we declare ourselves: the file's types and RabbitMQ 4.3's core ``x-modulus-hash``.
DeclaredExchangeType = Literal["direct", "topic", "fanout", "headers", "x-consistent-hash", "x-modulus-hash"]
#: ``x-queue-type`` of a queue we declare.
QueueType = Literal["classic", "quorum"]
#: ``x-overflow`` of a queue we declare (RabbitMQ "Queue Length Limit" -> "Overflow Behaviour").
Overflow = Literal["reject-publish", "drop-head"]
#: The largest integer an AMQP argument carries: a field table's signed 64-bit long (the client
#: refuses more). RabbitMQ takes any non-negative one for ``x-max-length`` and ``x-delivery-limit``.
AMQP_INT_MAX: Final = 2**63 - 1
#: An integer argument of a queue: 0 to :data:`AMQP_INT_MAX`.
AmqpInt = Annotated[int, Field(ge=0, le=AMQP_INT_MAX)]
#: A queue's part: of a job queue, or ``ledger``, an app's ledger marker (:mod:`amqpjobs.topology.ledger_marker`).
QueueRole = Literal["work", "tier", "quarantine", "suspects", "parked", "waiting", "tokens", "ledger"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExchangeDecl(_Frozen):
    """A durable exchange to declare."""

    name: str
    type: DeclaredExchangeType
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False


class QueueDecl(_Frozen):
    """A durable queue to declare, with its settings in our own units (seconds).

    Attributes:
        name: Queue name.
        role: ``work``, ``tier`` (a delay queue), ``quarantine``, ``suspects``, ``parked``, or a rate-limited
            job's ``waiting`` room or ``tokens`` queue (:mod:`amqpjobs.topology.rate_queues`).
        job_queue: Name of the job queue it belongs to.
        queue_type: ``classic`` or ``quorum``.
        max_priority: ``x-max-priority`` or None.
        message_ttl: Queue-level TTL in seconds, or None.
        dead_letter_exchange: ``x-dead-letter-exchange`` (``""`` is the default exchange).
        dead_letter_routing_key: ``x-dead-letter-routing-key`` or None.
        dead_letter_strategy: Quorum only, ``at-least-once`` or None.
        delivery_limit: Quorum only, ``x-delivery-limit`` or None.
        max_length: ``x-max-length`` or None.
        overflow: ``x-overflow`` or None.
        legacy_note: Non-empty when an earlier amqpjobs declared this quorum queue classic
            (:meth:`legacy_shape`) and that shape is still accepted as it is: what it lacks
            and how to move on (:mod:`amqpjobs.topology.holding_queues`,
            :mod:`amqpjobs.topology.ledger_marker`).

    """

    name: str
    role: QueueRole
    job_queue: str
    queue_type: QueueType = "classic"
    max_priority: AmqpInt | None = None
    message_ttl: float | None = None
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    dead_letter_strategy: Literal["at-least-once"] | None = None
    delivery_limit: AmqpInt | None = None
    max_length: AmqpInt | None = None
    overflow: Overflow | None = None
    legacy_note: str = ""

    def legacy_shape(self) -> QueueDecl | None:
        """The classic shape an earlier amqpjobs declared this queue in, accepted as it is; None without a legacy note.

        The one rule of a legacy shape: the same queue, classic, without the settings only
        a quorum queue takes (``x-delivery-limit``, ``x-dead-letter-strategy``).
        """
        if not self.legacy_note:
            return None
        return self.model_copy(update={"queue_type": "classic", "delivery_limit": None,
                                       "dead_letter_strategy": None, "legacy_note": ""})  # fmt: skip


class BindingDecl(_Frozen):
    """A binding to declare: ``source`` exchange → ``destination`` with ``routing_key``."""

    source: str
    destination: str
    destination_type: Literal["queue", "exchange"] = "queue"
    routing_key: str = ""


class Declarations(_Frozen):
    """Broker objects in dependency order: exchanges, then queues, then bindings."""

    exchanges: tuple[ExchangeDecl, ...]
    queues: tuple[QueueDecl, ...]
    bindings: tuple[BindingDecl, ...]
