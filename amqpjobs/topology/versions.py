"""What differs between RabbitMQ versions, as pure functions of the version read at connect.

The version comes from the connection's server properties (or the management API); it is
never guessed. Each rule cites the release note it follows (README "RabbitMQ 3.10, 4.0 and
4.3"). No I/O here: the loader, the wire and the worker ask these functions.
"""

from __future__ import annotations

from typing import Final, Literal

Version = tuple[int, ...]

#: RabbitMQ 4.3.0 release notes: quorum queues have strict priorities 0..31 (a message
#: without a priority counts as 4) and ignore ``x-max-priority``.
QUORUM_PRIORITIES_SINCE: Final = (4, 3)
QUORUM_MAX_PRIORITY: Final = 31
#: RabbitMQ 4.3.0 release notes: the consumer timeout is no longer evaluated on classic
#: queues (nor streams); on quorum queues the ``x-consumer-timeout`` consume argument sets it
#: per consumer (it wins over the queue argument, a policy and ``consumer_timeout``).
PER_CONSUMER_TIMEOUT_SINCE: Final = (4, 3)
#: Added to a job queue's longest job timeout to give its consumers' ``x-consumer-timeout``
#: (seconds): room to cancel the handler, publish the retry or quarantine copy and ack.
CONSUMER_TIMEOUT_MARGIN: Final = 60.0


def quorum_priorities(version: Version) -> bool:
    """Whether quorum queues take priorities 0..31 on RabbitMQ ``version`` (4.3+)."""
    return version >= QUORUM_PRIORITIES_SINCE


def consumer_timeout(longest_job_timeout: float) -> float:
    """The ``x-consumer-timeout`` for a job queue's consumers, seconds.

    The clock runs from the delivery, not from the start; a consumer's delivery has its own
    slot and starts at once: the longest job timeout plus :data:`CONSUMER_TIMEOUT_MARGIN`.
    Sharded job queues need no rule of their own: their quorum shards are taken by
    ``basic.get`` (no consumer), and 4.3 evaluates no timeout on classic queues.
    """
    return longest_job_timeout + CONSUMER_TIMEOUT_MARGIN


TimeoutRule = Literal["per-consumer", "none", "node"]


def consumer_timeout_rule(version: Version, queue_type: str) -> TimeoutRule:
    """Which delivery acknowledgement timeout applies to a consumer of a ``queue_type`` queue.

    Returns:
        ``"per-consumer"`` (quorum, 4.3+: our ``x-consumer-timeout``), ``"none"`` (classic,
        4.3+: not evaluated, only the job's own timeout bounds a run) or ``"node"`` (before
        4.3: the node's ``consumer_timeout``, default 30 min; it closes the channel).

    """
    if version >= PER_CONSUMER_TIMEOUT_SINCE:
        return "per-consumer" if queue_type == "quorum" else "none"
    return "node"


def quorum_priority_refusal(version: Version) -> tuple[str, str] | None:
    """Why ``max_priority`` on a quorum job queue can't work on ``version``, and the fix; None on 4.3+."""
    if quorum_priorities(version):
        return None
    connected = ".".join(map(str, version))
    if version >= (4, 0):
        fix = (
            "upgrade the broker to RabbitMQ 4.3+ (strict priorities 0-31); or remove max_priority (4.0-4.2 "
            'quorum queues have two levels, 0-4 normal and 5-255 high, without it); or use type = "classic"'
        )
    else:
        fix = 'upgrade the broker to RabbitMQ 4.3+, or remove max_priority, or use type = "classic"'
    return f"quorum-queue priorities 0-31 need RabbitMQ 4.3+ (connected: {connected})", fix
