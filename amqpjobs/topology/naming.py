"""How a job queue's name expands into broker object names.

The naming scheme (documented in README "Topology"), for a job queue ``N``:

=======================  ==========================================  ======================
object                   name                                        example (``N=urgent``)
=======================  ==========================================  ======================
work queue               ``N`` (or ``N.shard-<i>`` when sharded)     ``urgent``
delay queue, one a tier  ``<work queue>.retry.<tier>``               ``urgent.retry.30s``
quarantine exchange      ``N.quarantine`` (fanout)                   ``urgent.quarantine``
quarantine queue         ``N.quarantine``                            ``urgent.quarantine``
=======================  ==========================================  ======================

Tiers are named by :func:`amqpjobs.durations.format_duration` of their TTL. Shard
``i`` of ``N`` is bound with routing key ``<key>.shard-<i>`` for each routing key.
"""

from __future__ import annotations

from amqpjobs.durations import format_duration

QUARANTINE_SUFFIX = ".quarantine"
SUSPECTS_SUFFIX = ".suspects"
RETRY_INFIX = ".retry."
SHARD_INFIX = ".shard-"


def work_queue_name(job_queue: str, shard: int | None = None) -> str:
    """Name of the work queue (or of shard ``shard``) of job queue ``job_queue``."""
    return job_queue if shard is None else f"{job_queue}{SHARD_INFIX}{shard}"


def tier_queue_name(work_queue: str, ttl_seconds: float) -> str:
    """Name of the delay queue of ``work_queue`` whose TTL is ``ttl_seconds`` seconds."""
    return f"{work_queue}{RETRY_INFIX}{format_duration(ttl_seconds)}"


def quarantine_exchange_name(job_queue: str) -> str:
    """Name of the (fanout) quarantine exchange of job queue ``job_queue``."""
    return f"{job_queue}{QUARANTINE_SUFFIX}"


def quarantine_queue_name(job_queue: str) -> str:
    """Name of the quarantine queue of job queue ``job_queue``."""
    return f"{job_queue}{QUARANTINE_SUFFIX}"


def suspects_queue_name(job_queue: str) -> str:
    """Name of the queue where jobs whose start ended without an outcome wait to run alone."""
    return f"{job_queue}{SUSPECTS_SUFFIX}"


def shard_routing_key(routing_key: str, shard: int) -> str:
    """Routing key that reaches shard ``shard`` for a job queue bound with ``routing_key``."""
    return f"{routing_key}{SHARD_INFIX}{shard}"
