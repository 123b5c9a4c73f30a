"""What differs between RabbitMQ versions, as pure functions of the version read at connect.

The version comes from the connection's server properties (or the management API); it is
never guessed. Each rule cites the release note it follows (README "RabbitMQ 3.10, 4.0 and
4.3"). No I/O here: the loader, the wire and the worker ask these functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Final, Literal

from amqpjobs.errors import ConfigurationError, Problem

Version = tuple[int, ...]

#: RabbitMQ 4.0.0 release notes: quorum queues take message priorities, two levels (0-4
#: normal, 5-255 high, delivered about 2:1); before 4.0 they have none (a priority is stored
#: with the message and never acted on).
QUORUM_TWO_LEVELS_SINCE: Final = (4, 0)
#: RabbitMQ 4.3.0 release notes: quorum queues have strict priorities 0..31 (a message
#: without a priority counts as 4) and ignore ``x-max-priority``.
QUORUM_PRIORITIES_SINCE: Final = (4, 3)
QUORUM_MAX_PRIORITY: Final = 31
#: RabbitMQ 4.3.0 release notes: the consumer timeout is no longer evaluated on classic
#: queues (nor streams); on quorum queues the ``x-consumer-timeout`` consume argument sets it
#: per consumer (it wins over the queue argument, a policy and ``consumer_timeout``).
PER_CONSUMER_TIMEOUT_SINCE: Final = (4, 3)
#: RabbitMQ's default delivery acknowledgement timeout (``consumer_timeout``), 30 minutes, in seconds;
#: a job without a timeout of its own gets one just below it.
NODE_CONSUMER_TIMEOUT: Final = 1800.0
#: Added to a job queue's longest job timeout to give its consumers' ``x-consumer-timeout``
#: (seconds): room to cancel the handler, publish the retry or quarantine copy and ack.
CONSUMER_TIMEOUT_MARGIN: Final = 60.0


def quorum_priorities(version: Version) -> bool:
    """Whether quorum queues take priorities 0..31 on RabbitMQ ``version`` (4.3+)."""
    return version >= QUORUM_PRIORITIES_SINCE


def quorum_order(version: tuple[int, ...] | None) -> str:
    """How a quorum queue orders by priority on ``version`` (None: the newest): ``strict``, ``two`` levels or ``fifo``.

    RabbitMQ release notes 4.0.0 (two levels, 5+ high) and 4.3.0 (strict 0-31, none counts as 4).
    """
    if version is None or quorum_priorities(version):
        return "strict"
    return "two" if version >= QUORUM_TWO_LEVELS_SINCE else "fifo"


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


#: RabbitMQ 4.3.0 release notes: the ``x-modulus-hash`` exchange type is in core (routes by a
#: hash of the routing key mod the number of bound queues; RabbitMQ docs "Modulus Hash Exchange").
MODULUS_HASH_SINCE: Final = (4, 3)


def modulus_hash_refusal(version: Version) -> tuple[str, str] | None:
    """Why ``shard_routing = "modulus-hash"`` can't work on ``version``, and the fix; None on 4.3+."""
    if version >= MODULUS_HASH_SINCE:
        return None
    connected = ".".join(map(str, version))
    return (
        f"shard_routing modulus-hash needs the x-modulus-hash exchange of RabbitMQ 4.3+ (connected: {connected})",
        'upgrade the broker to RabbitMQ 4.3+, or remove shard_routing (the default "crc32": publishers pick the shard)',
    )


#: RabbitMQ 4.3.0 release notes: Khepri is the only metadata store. Each declaration is a
#: Raft command, so it needs a majority of the cluster's nodes; on a node in a minority it
#: blocks (and the node gives up after about 30 s, measured on 4.3.6).
KHEPRI_ONLY_SINCE: Final = (4, 3)


def raft_majority_refusal(version: Version, running: Mapping[str, bool]) -> str | None:
    """Why declarations can't succeed on this cluster now (no Raft majority), or None.

    Args:
        version: The connected broker's version.
        running: Each cluster node's name and whether it runs, as the node we talk to sees it
            (a node in a minority sees the nodes it can't reach as not running).

    Returns:
        None before 4.3 (Mnesia lets a minority declare), with no node list, or with a
        majority running; else the message, naming the nodes down and the fix.

    """
    if version < KHEPRI_ONLY_SINCE or not running:
        return None
    up = sorted(name for name, ok in running.items() if ok)
    need = len(running) // 2 + 1
    if len(up) >= need:
        return None
    down = sorted(name for name, ok in running.items() if not ok)
    return (
        f"no Raft majority: {len(up)} of the cluster's {len(running)} nodes run ({', '.join(up) or 'none'}; down or "
        f"unreachable: {', '.join(down)}), and RabbitMQ 4.3+ (Khepri metadata store) needs {need} of "
        f"{len(running)} for any declaration (quorum queues need a majority of their members too). Bring "
        "the stopped nodes back (`rabbitmq-diagnostics cluster_status` lists them), or connect to a node of "
        "the majority's side of a partition, then try again"
    )


def checked_version(version: object, where: str) -> Version:
    """``version`` when it is a RabbitMQ version: a non-empty tuple of whole numbers >= 0, e.g. ``(3, 13, 7)``.

    Raises:
        ConfigurationError: it is not (the message names ``where`` and the form).

    """
    if isinstance(version, tuple) and version and all(type(n) is int and n >= 0 for n in version):
        return version
    raise ConfigurationError(
        f"{where}(broker_version={version!r}): give a RabbitMQ version as a tuple of whole numbers, e.g. "
        "(3, 13, 7), or leave it out for the newest broker's behaviour"
    )


#: The plugin that offers each exchange type a topology may use beyond AMQP's own four.
_TYPE_PLUGINS: Final = {"x-consistent-hash": "rabbitmq_consistent_hash_exchange"}


def exchange_type_refusal(file: str, key_path: str, wanted: str, offered: AbstractSet[str]) -> Problem:
    """The problem of an exchange whose type the connected broker does not offer (its plugin is not enabled).

    RabbitMQ refuses such a declaration with ``COMMAND_INVALID - invalid exchange type`` and
    closes the connection: found at plan time, ``apply`` declares nothing.
    """
    plugin = _TYPE_PLUGINS.get(wanted)
    fix = f"enable its plugin (rabbitmq-plugins enable {plugin})" if plugin else "use a type the broker offers"
    return Problem(
        file, key_path,
        f"the broker offers no exchange type {wanted!r} (it offers {', '.join(sorted(offered))})",
        f"{fix}, or another type",
    )  # fmt: skip
