"""The worker's start-up rules that depend on the broker version read at connect.

Pure decisions live in :mod:`amqpjobs.topology.versions`; this module applies them to a
worker's job queues: it refuses what the broker can't do and logs, per job queue, which
delivery acknowledgement timeout applies (RabbitMQ 4.3.0 release notes; "Delivery
Acknowledgement Timeout" in the consumers guide).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from amqpjobs.errors import ConfigurationError
from amqpjobs.topology.models import JobQueueLayout
from amqpjobs.topology.versions import (
    Version,
    consumer_timeout,
    consumer_timeout_rule,
    modulus_hash_refusal,
    quorum_priority_refusal,
)

log = logging.getLogger("amqpjobs.worker")


def check_layouts(layouts: Iterable[JobQueueLayout], version: Version) -> None:
    """Refuse job queues the connected broker can't serve as the topology says.

    Raises:
        ConfigurationError: a quorum job queue sets ``max_priority``, or a sharded one
            ``shard_routing = "modulus-hash"``, on a broker older than 4.3 (the message names
            the queue, the version and the fix).

    """
    refusal = quorum_priority_refusal(version)
    bad = [lay.name for lay in layouts if lay.queue_type == "quorum" and lay.max_priority is not None]
    if refusal is not None and bad:
        message, fix = refusal
        raise ConfigurationError(f"job queue(s) {', '.join(bad)}: max_priority: {message} (fix: {fix})")
    modulus = modulus_hash_refusal(version)
    hashed = [lay.name for lay in layouts if lay.shards_exchange is not None]
    if modulus is not None and hashed:
        message, fix = modulus
        raise ConfigurationError(f"job queue(s) {', '.join(hashed)}: {message} (fix: {fix})")


def consumer_timeouts(
    layouts: Iterable[JobQueueLayout],
    longest: Mapping[str, float],
    version: Version,
    node_timeout: float,
) -> dict[str, float | None]:
    """Per job queue, the ``x-consumer-timeout`` its consumers send (seconds), None for none; log the rule.

    Args:
        layouts: The worker's job queues.
        longest: Job queue name → its longest job timeout in seconds.
        version: The connected broker's version.
        node_timeout: The broker's ``consumer_timeout`` in seconds (before 4.3 it applies to
            every queue; the worker's ``--consumer-timeout``).

    Returns:
        Job queue name → seconds for quorum queues on 4.3+
        (:func:`~amqpjobs.topology.versions.consumer_timeout`), else None.

    """
    out: dict[str, float | None] = {}
    shown = ".".join(map(str, version))
    for lay in layouts:
        job_timeout = longest.get(lay.name, 0.0)
        rule = consumer_timeout_rule(version, lay.queue_type)
        out[lay.name] = None
        if rule == "per-consumer":
            out[lay.name] = consumer_timeout(job_timeout)
            log.info(
                "job queue %s (quorum, RabbitMQ %s): x-consumer-timeout %gs per consumer (its longest job "
                "timeout %gs plus a margin); a delivery held longer is returned and this consumer cancelled",
                lay.name, shown, out[lay.name], job_timeout,
            )  # fmt: skip
        elif rule == "none":
            log.info(
                "job queue %s (classic, RabbitMQ %s): the broker no longer evaluates a consumer timeout on "
                "classic queues; a run is bounded by its job timeout only (longest %gs)",
                lay.name, shown, job_timeout,
            )  # fmt: skip
        elif job_timeout >= node_timeout:
            log.warning(
                "job queue %s (%s, RabbitMQ %s): its longest job timeout %gs is not below the broker's "
                "consumer_timeout (%gs, node-wide before RabbitMQ 4.3): the broker would close the channel and "
                "redeliver first; raise consumer_timeout in rabbitmq.conf or shorten the job timeout",
                lay.name, lay.queue_type, shown, job_timeout, node_timeout,
            )  # fmt: skip
    return out
