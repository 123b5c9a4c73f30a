"""Per-job-queue and routing rules of a topology, as :func:`~amqpjobs.topology.loader.load_topology` runs them."""

from __future__ import annotations

from amqpjobs.errors import Problem
from amqpjobs.topology.models import JobQueueSpec, TopologyFile
from amqpjobs.topology.versions import QUORUM_MAX_PRIORITY, quorum_priority_refusal

#: ``x-max-priority`` above this still works but costs broker CPU and memory
#: (RabbitMQ "Classic Queues Support Priorities" → "How many priorities should I use?").
PRIORITY_WARN_ABOVE = 10


def routing_checks(parsed: list[tuple[str, TopologyFile]]) -> list[Problem]:
    """Routing keys that would make a job run twice, or that an exchange type can't take."""
    problems: list[Problem] = []
    types = {e.name: e.type for _, tf in parsed for e in tf.exchange}
    owner: dict[tuple[str, str], str] = {}
    for file, tf in parsed:
        for i, jq in enumerate(tf.job_queue):
            kind = types.get(jq.exchange)
            if kind == "x-consistent-hash" and not all(k.isdigit() for k in jq.keys):
                problems.append(
                    Problem(file, f"job_queue[{i}].routing_keys",
                            "an x-consistent-hash exchange binds queues with integer weights",
                            'set routing_keys to weights such as ["1"]')
                )  # fmt: skip
            if kind in ("direct", "topic"):
                for key in dict.fromkeys(jq.keys):
                    other = owner.setdefault((jq.exchange, key), jq.name)
                    if other != jq.name:
                        problems.append(
                            Problem(file, f"job_queue[{i}].routing_keys",
                                    f"routing key {key!r} of exchange {jq.exchange!r} also routes to job queue "
                                    f"{other!r}: every such job would run twice",
                                    "give each job queue its own routing keys")
                        )  # fmt: skip
    return problems


def _quorum_priority_rules(
    file: str, base: str, max_priority: int, broker_version: tuple[int, ...] | None, warnings: list[str]
) -> list[Problem]:
    """``max_priority`` on a quorum job queue: 1..31 on RabbitMQ 4.3+, refused before.

    RabbitMQ 4.3 release notes: quorum queues have strict priorities 0-31 (a message without
    one counts as 4) and ignore ``x-max-priority``; 4.0-4.2 have two levels (0-4 normal,
    5-255 high), 3.x none. The bound is ours: enqueue refuses a priority above it, and no
    ``x-max-priority`` is sent (:func:`amqpjobs.wire.arguments.queue_arguments`).
    """
    key = f"{base}.max_priority"
    if max_priority > QUORUM_MAX_PRIORITY:
        return [
            Problem(file, key, f"quorum queues have priorities 0-{QUORUM_MAX_PRIORITY} (RabbitMQ 4.3+)",
                    f'lower max_priority to at most {QUORUM_MAX_PRIORITY}, or use type = "classic"')
        ]  # fmt: skip
    if broker_version is None:
        warnings.append(
            f"{file}: {key}: quorum-queue priorities need RabbitMQ 4.3+; `topology apply` and the worker "
            "refuse it on an older broker"
        )
        return []
    refusal = quorum_priority_refusal(broker_version)
    return [] if refusal is None else [Problem(file, key, *refusal)]


def queue_rules(
    file: str,
    base: str,
    jq: JobQueueSpec,
    broker_version: tuple[int, ...] | None,
    warnings: list[str],
) -> list[Problem]:
    """The problems of job queue ``jq`` (at key path ``base`` of ``file``) on its own; appends to ``warnings``."""
    problems: list[Problem] = []
    if jq.type == "quorum":
        if jq.max_priority is not None:
            problems.extend(_quorum_priority_rules(file, base, jq.max_priority, broker_version, warnings))
        if jq.overflow == "drop-head":
            problems.append(
                Problem(
                    file,
                    f"{base}.overflow",
                    "quorum job queues dead-letter at-least-once, which needs overflow reject-publish",
                    'remove overflow or set it to "reject-publish"',
                )
            )
    elif jq.delivery_limit is not None:
        problems.append(
            Problem(
                file,
                f"{base}.delivery_limit",
                "delivery_limit applies to quorum queues only",
                'remove it, or use type = "quorum"',
            )
        )
    if jq.max_priority is not None and jq.max_priority > PRIORITY_WARN_ABOVE:
        warnings.append(
            f"{file}: {base}.max_priority: {jq.max_priority} priorities cost broker CPU "
            f"and memory; RabbitMQ recommends at most {PRIORITY_WARN_ABOVE}"
        )
    if jq.type == "classic" and jq.max_length is not None and jq.overflow == "reject-publish" and jq.retry_tiers:
        problems.append(
            Problem(
                file,
                f"{base}.max_length",
                "a retried job that its delay tier dead-letters back into a full classic work queue is dropped "
                "by the broker (classic queues dead-letter at-most-once, and reject-publish refuses it)",
                'set overflow = "drop-head" (the oldest job goes to quarantine, reason maxlen), use '
                'type = "quorum" (at-least-once dead-lettering keeps it waiting in its tier), or remove max_length',
            )
        )
    if jq.overflow == "drop-head" and jq.max_length is None:
        problems.append(
            Problem(
                file,
                f"{base}.overflow",
                "overflow has no effect without max_length",
                "add max_length or remove overflow",
            )
        )
    tiers = jq.retry_tiers
    for j in range(1, len(tiers)):
        if round(tiers[j] * 1000) <= round(tiers[j - 1] * 1000):
            problems.append(
                Problem(
                    file,
                    f"{base}.retry_tiers[{j}]",
                    f"retry tiers must strictly increase ({tiers[j - 1]:g}s then {tiers[j]:g}s)",
                    "list tiers from shortest to longest, each once",
                )
            )
    for j, t in enumerate(tiers):
        if t < 0.001 or t * 1000 > 2**32 - 1:
            problems.append(
                Problem(
                    file,
                    f"{base}.retry_tiers[{j}]",
                    f"{t:g}s is outside what x-message-ttl takes (1 ms to ~49 days)",
                    "use a delay between 1ms and 49d",
                )
            )
    if jq.routing_keys is not None and not jq.routing_keys:
        problems.append(
            Problem(
                file,
                f"{base}.routing_keys",
                "an empty list binds nothing",
                "remove routing_keys (defaults to the job queue name) or list keys",
            )
        )
    return problems
