"""Topology models: what the topology files say, and what the broker must hold.

Two layers, both frozen pydantic models without I/O:

* the *file* models (:class:`ExchangeSpec`, :class:`JobQueueSpec`, :class:`BindingSpec`,
  :class:`TopologyFile`) mirror the TOML files in ``topology/`` key for key; unknown keys
  are errors;
* the *declarations* (:mod:`amqpjobs.topology.declarations`) are the broker objects a
  :class:`Topology` expands into, by the naming scheme of :mod:`amqpjobs.topology.naming`:

  - each job queue's work queue (classic, optional ``x-max-priority``; or quorum with an
    explicit delivery limit, ``at-least-once`` dead-lettering and ``reject-publish``
    overflow, as RabbitMQ's "Quorum Queues → Dead Lettering" section requires);
  - one delay queue per retry tier with a queue-level TTL that dead-letters back to the
    work queue through the default exchange (queue-level, not per-message, TTL: RabbitMQ
    "Time-To-Live and Expiration" → per-message TTL is only applied at the queue head);
  - a fanout quarantine exchange and queue, which is the work queue's dead-letter
    exchange, so every broker-side dead-letter (rejected, expired, maxlen,
    delivery_limit) lands in quarantine instead of being dropped;
  - a parked queue where an operator parks quarantined jobs that are known failures
    (``amqpjobs quarantine park``); it and the quarantine queue are of the job queue's
    type (:mod:`amqpjobs.topology.holding_queues`);
  - once per topology with job queues, the topic exchange of outcome events
    (:data:`~amqpjobs.topology.naming.EVENTS_EXCHANGE`; :mod:`amqpjobs.jobs.events`).

Durations here are seconds (floats); milliseconds appear only in
:mod:`amqpjobs.wire.arguments`.
"""

from __future__ import annotations

import zlib
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, StringConstraints

from amqpjobs.durations import parse_duration
from amqpjobs.topology import naming
from amqpjobs.topology.bounds import QueueBounds
from amqpjobs.topology.declarations import (
    AMQP_INT_MAX,
    BindingDecl,
    Declarations,
    ExchangeDecl,
    Overflow,
    QueueDecl,
    QueueType,
)
from amqpjobs.topology.holding_queues import holding_queues

ExchangeType = Literal["direct", "topic", "fanout", "headers", "x-consistent-hash"]
ShardRouting = Literal["crc32", "modulus-hash"]

#: An AMQP short string name: 1–255 characters (RabbitMQ limits names to 255 bytes).
Name = Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=r"^[^\s]+$")]
#: An integer written as one: not "5", 5.0 or true (pydantic's strict mode).
StrictInt = Annotated[int, Strict()]
#: A count of 1 or more that an AMQP argument can carry (at most
#: :data:`~amqpjobs.topology.declarations.AMQP_INT_MAX`); settings with a tighter bound give their own.
Count = Annotated[int, Strict(), Field(ge=1, le=AMQP_INT_MAX)]
#: Seconds, read from a duration string ("30s", "5m") or a number of seconds.
Seconds = Annotated[float, BeforeValidator(parse_duration)]

#: Delivery limit given to quorum work queues whose file does not set one. Always sent
#: explicitly: RabbitMQ 4.x would otherwise apply its own default of 20.
DEFAULT_DELIVERY_LIMIT = 10
#: Starts without an outcome allowed after the first before a job is quarantined ``crashed``.
DEFAULT_MAX_REDELIVERIES = 5
#: Highest number of shards a job queue may have.
MAX_SHARDS = 64


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExchangeSpec(_Frozen):
    """An ``[[exchange]]`` entry: a durable exchange jobs are published to.

    Attributes:
        name: Exchange name (names starting ``amq.`` are reserved by RabbitMQ).
        type: ``direct`` (default), ``topic``, ``fanout``, ``headers`` or
            ``x-consistent-hash`` (plugin bundled with RabbitMQ).

    """

    name: Name
    type: ExchangeType = "direct"


class BindingSpec(_Frozen):
    """A ``[[binding]]`` entry: an extra binding beyond the ones job queues make.

    Attributes:
        source: A declared exchange.
        destination: A declared queue (any expanded name) or exchange.
        destination_type: ``queue`` (default) or ``exchange``.
        routing_key: Binding key, ``""`` by default.

    """

    source: Name
    destination: Name
    destination_type: Literal["queue", "exchange"] = "queue"
    routing_key: str = ""


class JobQueueSpec(_Frozen):
    """A ``[[job_queue]]`` entry: one queue of jobs with its retry tiers and quarantine.

    Attributes:
        name: Base name; the naming scheme derives every object name from it.
        exchange: The declared exchange jobs are published to.
        routing_keys: Binding keys from ``exchange`` to the work queue; default ``[name]``.
        type: ``classic`` (default) or ``quorum``.
        max_priority: Classic: ``x-max-priority``, 1–255 (keep it ≤ 10). Quorum: 1–31, RabbitMQ
            4.3+ only (strict priorities; no ``x-max-priority`` is sent, enqueue checks it).
        retry_tiers: Delay before each retry, strictly increasing (e.g. ``["5s", "1m"]``).
        delivery_limit: Quorum only: ``x-delivery-limit``; default
            :data:`DEFAULT_DELIVERY_LIMIT`, always sent explicitly.
        max_length: Optional ``x-max-length`` (messages) of the work queue.
        overflow: What ``max_length`` does: ``reject-publish`` (default; the publisher's
            confirm is a nack) or ``drop-head`` (classic only; the oldest job is
            dead-lettered into quarantine with reason ``maxlen``).
        max_depth: Enqueue refuses a job (``QueueFullError``) while its work queue holds this
            many ready messages or more (checked by the publisher, not the broker; README
            "Backpressure" gives the overshoot bound). None: no bound.
        max_age: Enqueue refuses a job while its work queue's oldest ready message is this old
            (seconds or duration; from the management API's ``head_message_timestamp``). None: no bound.
        shards: Number of work queues the job queue is split into (1 = not sharded).
        shard_routing: Who picks a sharded job's shard: ``crc32`` (default: the publisher,
            ``crc32(key) % shards``, the shard's routing key on ``exchange``) or
            ``modulus-hash`` (RabbitMQ 4.3+: the broker; publishers send to the job queue's
            ``x-modulus-hash`` exchange ``<name>.shards`` with the key itself as routing key).
        max_redeliveries: Starts without an outcome (the worker died, its event loop
            stalled past the heartbeat timeout, its channel or connection was lost while
            the job ran) allowed after the first; the next one quarantines the job with
            reason ``crashed`` (default 5). Counted by the workers on classic and quorum
            queues alike (:mod:`amqpjobs.jobs.crash`).

    """

    name: Name
    exchange: Name
    routing_keys: tuple[str, ...] | None = None
    type: QueueType = "classic"
    max_priority: StrictInt | None = Field(default=None, ge=1, le=255)
    retry_tiers: tuple[Seconds, ...] = ()
    delivery_limit: Count | None = None
    max_length: Count | None = None
    overflow: Overflow = "reject-publish"
    max_depth: Count | None = None
    max_age: Seconds | None = Field(default=None, gt=0)
    shards: StrictInt = Field(default=1, ge=1, le=MAX_SHARDS)
    shard_routing: ShardRouting = "crc32"
    max_redeliveries: StrictInt = Field(default=DEFAULT_MAX_REDELIVERIES, ge=1, le=1000)

    @property
    def keys(self) -> tuple[str, ...]:
        """Binding keys from the exchange to the work queue(s)."""
        return self.routing_keys if self.routing_keys is not None else (self.name,)


class TopologyFile(_Frozen):
    """One topology file: lists of ``[[exchange]]``, ``[[job_queue]]`` and ``[[binding]]``."""

    exchange: tuple[ExchangeSpec, ...] = ()
    job_queue: tuple[JobQueueSpec, ...] = ()
    binding: tuple[BindingSpec, ...] = ()


class JobQueueLayout(_Frozen):
    """Where one job queue's messages live, for publishers and workers.

    Attributes:
        name: Job queue name.
        exchange: Exchange jobs are published to.
        routing_key: Routing key a publisher uses for an unsharded job queue.
        work_queues: Work queue names (one, or one per shard in shard order).
        shard_routing_keys: Routing key reaching each shard (same order as
            ``work_queues``); empty when not sharded.
        shards_exchange: The ``x-modulus-hash`` exchange publishers send sharded jobs to
            (``shard_routing = "modulus-hash"``), else None.
        tiers: Retry delays in seconds, increasing.
        tier_queues: For each work queue, its delay queue names in tier order.
        quarantine_exchange: Fanout exchange into the quarantine queue.
        quarantine_queue: Quarantine queue name.
        suspects_queue: Where a job whose start ended without an outcome waits to be run
            alone (:mod:`amqpjobs.jobs.crash`).
        parked_queue: Where an operator parks quarantined jobs (``amqpjobs quarantine park``).
        queue_type: ``classic`` or ``quorum``.
        max_priority: Work queue's ``x-max-priority`` or None.
        max_redeliveries: Starts without an outcome allowed after the first (see
            :class:`JobQueueSpec`).
        bounds: The enqueue bounds of each work queue (``max_depth``, ``max_age`` and the
            broker's ``max_length`` with ``reject-publish``; see :class:`QueueBounds`).

    """

    name: str
    exchange: str
    routing_key: str
    work_queues: tuple[str, ...]
    shard_routing_keys: tuple[str, ...]
    tiers: tuple[float, ...]
    tier_queues: dict[str, tuple[str, ...]]
    quarantine_exchange: str
    quarantine_queue: str
    suspects_queue: str
    parked_queue: str
    queue_type: QueueType
    max_priority: int | None
    max_redeliveries: int = DEFAULT_MAX_REDELIVERIES
    bounds: QueueBounds = QueueBounds()
    shards_exchange: str | None = None

    def work_queue_for(self, routing_key: str) -> str:
        """The work queue a publish with ``routing_key`` (from :meth:`routing_key_for`) lands in."""
        if routing_key in self.shard_routing_keys:
            return self.work_queues[self.shard_routing_keys.index(routing_key)]
        return self.work_queues[0]

    def publish_target(self, key: str) -> tuple[str, str]:
        """(exchange, routing key) a publisher sends a job keyed ``key`` (its tenant, else its job id) to.

        With :attr:`shards_exchange` (RabbitMQ 4.3 ``x-modulus-hash``): that exchange and ``key``
        itself; the broker picks the shard (hash of the routing key mod the number of bound
        shards; RabbitMQ docs "Modulus Hash Exchange"). Else :attr:`exchange` and
        :meth:`routing_key_for`.
        """
        if self.shards_exchange is not None:
            return self.shards_exchange, key
        return self.exchange, self.routing_key_for(key)

    def routing_key_for(self, key: str) -> str:
        """The routing key a publisher uses for a job keyed ``key`` (its tenant, else its job id).

        Unsharded: :attr:`routing_key`. Sharded: the shard ``crc32(key) % shards`` (the one
        shard-routing rule; publishers in other languages follow it, see the wire contract).
        """
        if not self.shard_routing_keys:
            return self.routing_key
        return self.shard_routing_keys[zlib.crc32(key.encode()) % len(self.shard_routing_keys)]


class Topology(_Frozen):
    """A validated topology (all files merged). Build it with :func:`load_topology`.

    Attributes:
        exchanges: Declared exchanges.
        job_queues: Declared job queues.
        bindings: Extra bindings.

    """

    exchanges: tuple[ExchangeSpec, ...] = ()
    job_queues: tuple[JobQueueSpec, ...] = ()
    bindings: tuple[BindingSpec, ...] = ()

    def layout(self, job_queue: str) -> JobQueueLayout:
        """Return the layout of job queue ``job_queue``.

        Raises:
            KeyError: no job queue of that name.

        """
        for spec in self.job_queues:
            if spec.name == job_queue:
                return _layout(spec)
        raise KeyError(job_queue)

    def layouts(self) -> tuple[JobQueueLayout, ...]:
        """Layouts of every job queue, in file order."""
        return tuple(_layout(spec) for spec in self.job_queues)

    def declarations(self) -> Declarations:
        """Expand into the broker objects to declare, in dependency order."""
        exchanges: list[ExchangeDecl] = [ExchangeDecl(name=e.name, type=e.type) for e in self.exchanges]
        queues: list[QueueDecl] = []
        bindings: list[BindingDecl] = []
        for spec in self.job_queues:
            lay = _layout(spec)
            exchanges.append(ExchangeDecl(name=lay.quarantine_exchange, type="fanout"))
            if lay.shards_exchange is not None:
                exchanges.append(ExchangeDecl(name=lay.shards_exchange, type="x-modulus-hash"))
            quarantine, parked = holding_queues(spec.name, spec.type, lay.quarantine_queue, lay.parked_queue)
            queues.append(quarantine)
            bindings.append(BindingDecl(source=lay.quarantine_exchange, destination=lay.quarantine_queue))
            queues.append(parked)
            quorum = spec.type == "quorum"
            queues.append(
                QueueDecl(
                    name=lay.suspects_queue,
                    role="suspects",
                    job_queue=spec.name,
                    queue_type=spec.type,
                    dead_letter_exchange=lay.quarantine_exchange,
                    dead_letter_strategy="at-least-once" if quorum else None,
                    delivery_limit=(spec.delivery_limit or DEFAULT_DELIVERY_LIMIT) if quorum else None,
                    overflow="reject-publish" if quorum else None,
                )
            )
            for index, work in enumerate(lay.work_queues):
                queues.append(
                    QueueDecl(
                        name=work,
                        role="work",
                        job_queue=spec.name,
                        queue_type=spec.type,
                        max_priority=spec.max_priority,
                        dead_letter_exchange=lay.quarantine_exchange,
                        dead_letter_strategy="at-least-once" if quorum else None,
                        delivery_limit=(spec.delivery_limit or DEFAULT_DELIVERY_LIMIT) if quorum else None,
                        max_length=spec.max_length,
                        overflow="reject-publish" if quorum else (spec.overflow if spec.max_length else None),
                    )
                )
                for ttl, tier in zip(lay.tiers, lay.tier_queues[work], strict=True):
                    queues.append(
                        QueueDecl(
                            name=tier,
                            role="tier",
                            job_queue=spec.name,
                            queue_type=spec.type,
                            message_ttl=ttl,
                            dead_letter_exchange="",
                            dead_letter_routing_key=work,
                            dead_letter_strategy="at-least-once" if quorum else None,
                            overflow="reject-publish" if quorum else None,
                        )
                    )
                keys = spec.keys if spec.shards == 1 else (lay.shard_routing_keys[index],)
                bindings.extend(BindingDecl(source=spec.exchange, destination=work, routing_key=k) for k in keys)
                if lay.shards_exchange is not None:  # its binding keys are ignored (one binding per shard)
                    bindings.append(BindingDecl(source=lay.shards_exchange, destination=work, routing_key=""))
        if self.job_queues:
            exchanges.append(ExchangeDecl(name=naming.EVENTS_EXCHANGE, type="topic"))
        bindings.extend(
            BindingDecl(
                source=b.source,
                destination=b.destination,
                destination_type=b.destination_type,
                routing_key=b.routing_key,
            )
            for b in self.bindings
        )
        return Declarations(exchanges=tuple(exchanges), queues=tuple(queues), bindings=tuple(bindings))


def _layout(spec: JobQueueSpec) -> JobQueueLayout:
    if spec.shards == 1:
        works: tuple[str, ...] = (naming.work_queue_name(spec.name),)
        shard_keys: tuple[str, ...] = ()
    else:
        works = tuple(naming.work_queue_name(spec.name, i) for i in range(spec.shards))
        shard_keys = tuple(naming.shard_routing_key(spec.keys[0], i) for i in range(spec.shards))
    return JobQueueLayout(
        name=spec.name,
        exchange=spec.exchange,
        routing_key=spec.keys[0] if spec.keys else spec.name,
        work_queues=works,
        shard_routing_keys=shard_keys,
        tiers=spec.retry_tiers,
        tier_queues={w: tuple(naming.tier_queue_name(w, t) for t in spec.retry_tiers) for w in works},
        quarantine_exchange=naming.quarantine_exchange_name(spec.name),
        quarantine_queue=naming.quarantine_queue_name(spec.name),
        suspects_queue=naming.suspects_queue_name(spec.name),
        parked_queue=naming.parked_queue_name(spec.name),
        queue_type=spec.type,
        max_priority=spec.max_priority,
        max_redeliveries=spec.max_redeliveries,
        bounds=QueueBounds(
            max_depth=spec.max_depth,
            max_age=spec.max_age,
            max_length=spec.max_length if spec.type == "quorum" or spec.overflow == "reject-publish" else None,
        ),
        shards_exchange=naming.shards_exchange_name(spec.name)
        if spec.shards > 1 and spec.shard_routing == "modulus-hash"
        else None,
    )
