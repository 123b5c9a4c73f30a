"""Per-job-queue and routing rules of a topology, as :func:`~amqpjobs.topology.loader.load_topology` runs them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from amqpjobs.errors import Problem
from amqpjobs.text import ascii_digits
from amqpjobs.topology import naming
from amqpjobs.topology.models import JobQueueSpec, TopologyFile
from amqpjobs.topology.name_roles import app_queue_names
from amqpjobs.topology.tiers import tier_problems
from amqpjobs.topology.versions import QUORUM_MAX_PRIORITY, modulus_hash_refusal, quorum_priority_refusal

#: ``x-max-priority`` above this still works but costs broker CPU and memory
#: (RabbitMQ "Classic Queues Support Priorities" → "How many priorities should I use?").
PRIORITY_WARN_ABOVE = 10


def routing_checks(parsed: list[tuple[str, TopologyFile]]) -> list[Problem]:
    """Routing keys and bindings that would make a job run twice, or that an exchange type can't take."""
    problems: list[Problem] = []
    types = {e.name: e.type for _, tf in parsed for e in tf.exchange}
    owner: dict[tuple[str, str], str] = {}
    for file, tf in parsed:
        for i, jq in enumerate(tf.job_queue):
            kind = types.get(jq.exchange)
            if kind == "x-consistent-hash" and not all(ascii_digits(k) and k.strip("0") for k in jq.keys):
                problems.append(  # RabbitMQ refuses 0 too ("The binding key must be greater than 0")
                    Problem(file, f"job_queue[{i}].routing_keys",
                            "an x-consistent-hash exchange binds queues with integer weights of 1 or more",
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
    return problems + shard_routing_checks(parsed) + owned_queue_bindings(parsed) + app_queue_names(parsed)


#: What each kind of queue amqpjobs declares and fills for a job queue is, for messages.
_OWNED = {"tier": "a retry tier", "quarantine": "the quarantine queue", "suspects": "the suspects queue",
          "parked": "the parked queue", "paused": "the pause flag", "breaker": "a circuit breaker queue",
          "breaker-probe": "a circuit breaker queue", **dict.fromkeys(("waiting", "tokens", "emitter"),
                                                                      "a rate limit queue")}  # fmt: skip


def owned_queue_bindings(parsed: list[tuple[str, TopologyFile]]) -> list[Problem]:
    """``[[binding]]`` entries into a queue amqpjobs alone fills: the one rule for all of them.

    A job queue's retry tiers, quarantine, suspects and parked queues, pause flag, breaker
    and rate-limit queues, and the scheduler's queues hold what amqpjobs puts there (a
    job's failure, a tick record, a token); a binding into one would add other messages,
    e.g. another job queue's jobs into a quarantine as if they had failed there. An app's
    ledger marker holds nothing: what a binding routes there is confirmed and dropped.
    """
    job_queues = {jq.name for _, tf in parsed for jq in tf.job_queue}
    problems: list[Problem] = []
    for file, tf in parsed:
        for i, b in enumerate(tf.binding):
            if b.destination_type != "queue":
                continue
            name = naming.parse_queue_name(b.destination)
            why = "which amqpjobs alone fills: a binding into it would add messages amqpjobs did not put there"
            if name.kind in ("leader", "ticks", "running"):
                what = f"a queue of the scheduler of app {name.app!r}"
            elif name.kind == "ledger":
                what = f"the ledger marker of app {name.app!r}"
                why = "which holds nothing (x-max-length 0): a message routed into it is confirmed, then dropped"
            elif name.kind in _OWNED and name.job_queue in job_queues:
                what = f"{_OWNED[name.kind]} of job queue {name.job_queue!r}"
            else:
                continue
            problems.append(
                Problem(file, f"binding[{i}].destination", f"queue {b.destination!r} is {what}, {why}",
                        "remove the binding: a [[binding]] may lead to a job queue's work queue or to an exchange")
            )  # fmt: skip
    return problems


def topic_matches(pattern: str, key: str) -> bool:
    """Whether topic binding key ``pattern`` matches routing key ``key``.

    RabbitMQ tutorial 5 ("Topics"): words are dot-separated, ``*`` stands for exactly one
    word and ``#`` for zero or more.
    """

    def match(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return any(match(p[1:], k[i:]) for i in range(len(k) + 1))
        return bool(k) and p[0] in ("*", k[0]) and match(p[1:], k[1:])

    return match(pattern.split("."), key.split("."))


def shard_routing_checks(parsed: list[tuple[str, TopologyFile]]) -> list[Problem]:
    """Sharded job queues whose routing could deliver one job to several work queues.

    A publisher routes a job to shard ``i`` by routing key ``<key>.shard-<i>``
    (:meth:`~amqpjobs.topology.models.JobQueueLayout.routing_key_for`), so the exchange must
    route by routing key (``direct`` or ``topic``: a ``fanout`` or ``headers`` exchange
    ignores it and copies the job to every shard), the key must name one route (no topic
    wildcard in it), and no other binding of that exchange to a work queue may match it.
    """
    problems: list[Problem] = []
    types = {e.name: e.type for _, tf in parsed for e in tf.exchange}
    # (exchange, binding key, work queue, where the binding is written) of every binding to a work queue
    bound: list[tuple[str, str, str, str, str]] = []
    for file, tf in parsed:
        for i, jq in enumerate(tf.job_queue):
            if jq.shards == 1:
                bound.extend((jq.exchange, k, jq.name, file, f"job_queue[{i}].routing_keys") for k in jq.keys)
            else:
                bound.extend(
                    (jq.exchange, naming.shard_routing_key(jq.keys[0], s), naming.work_queue_name(jq.name, s),
                     file, f"job_queue[{i}].shards")
                    for s in range(jq.shards)
                )  # fmt: skip
    works = {w for _, _, w, _, _ in bound}
    onward: list[tuple[str, str, str, str, str]] = []  # the same, of every exchange-to-exchange binding
    for file, tf in parsed:
        for i, b in enumerate(tf.binding):
            entry = (b.source, b.routing_key, b.destination, file, f"binding[{i}].routing_key")
            if b.destination_type == "exchange":
                onward.append(entry)
            elif b.destination in works:
                bound.append(entry)
    routes = _Routes(types, bound, onward)
    for file, tf in parsed:
        for i, jq in enumerate(tf.job_queue):
            kind = types.get(jq.exchange)
            if jq.shards == 1 and kind in ("direct", "topic"):
                problems += _other_bindings_matching(jq.exchange, kind, jq.keys[0], jq.name, "job queue", routes)
            if jq.shards == 1 or kind is None:
                continue
            if kind not in ("direct", "topic"):
                problems.append(
                    Problem(file, f"job_queue[{i}].shards",
                            f"job queue {jq.name!r} has {jq.shards} shards but exchange {jq.exchange!r} is a {kind} "
                            "exchange, which does not route by routing key: every job would reach every shard and "
                            f"run {jq.shards} times",
                            "shards need a direct or topic exchange: declare one for this job queue, or remove shards")
                )  # fmt: skip
                continue
            if kind == "topic" and any(w in ("*", "#") for w in jq.keys[0].split(".")):
                problems.append(
                    Problem(file, f"job_queue[{i}].routing_keys",
                            f"job queue {jq.name!r} is sharded, so its first routing key {jq.keys[0]!r} is what "
                            "publishers send (with .shard-<i>); a topic wildcard (* or #) in it is not one route",
                            "give a sharded job queue a routing key without * or # words")
                )  # fmt: skip
                continue
            for s in range(jq.shards):
                key = naming.shard_routing_key(jq.keys[0], s)
                problems += _other_bindings_matching(jq.exchange, kind, key, naming.work_queue_name(jq.name, s),
                                                     "shard", routes)  # fmt: skip
    return list(dict.fromkeys(problems))


def _takes(kind: str | None, pattern: str, key: str) -> bool:
    """Whether a binding with key ``pattern`` of a ``kind`` exchange may take a message with routing key ``key``.

    A fanout or x-consistent-hash exchange may send any key to any of its bindings; a
    headers exchange routes by headers, which are not known here (not counted).
    """
    if kind == "direct":
        return pattern == key
    if kind == "topic":
        return topic_matches(pattern, key)
    return kind in ("fanout", "x-consistent-hash")


@dataclass(frozen=True)
class _Routes:
    """Where publishes go: exchange types, bindings to work queues and exchange-to-exchange bindings.

    Each binding is ``(source exchange, binding key, destination, file, key path)``.
    """

    types: Mapping[str, str]
    bound: list[tuple[str, str, str, str, str]]
    onward: list[tuple[str, str, str, str, str]]

    def behind(self, exchange: str, key: str, seen: frozenset[str] = frozenset()) -> list[str]:
        """The work queues a message with routing key ``key`` reaches from ``exchange``.

        Through exchange-to-exchange bindings too, followed transitively (each exchange once).
        """
        kind = self.types.get(exchange)
        found = [
            dest for source, pattern, dest, _, _ in self.bound if source == exchange and _takes(kind, pattern, key)
        ]
        for source, pattern, dest, _, _ in self.onward:
            if source == exchange and dest not in seen and _takes(kind, pattern, key):
                found += self.behind(dest, key, seen | {exchange})
        return list(dict.fromkeys(found))


def _other_bindings_matching(
    exchange: str, kind: str, key: str, work: str, what: str, routes: _Routes
) -> list[Problem]:
    """Bindings that take ``key``, the publish key of ``work``, from ``exchange`` to another work queue.

    Bindings of ``exchange`` to a work queue other than ``work``, and bindings of
    ``exchange`` to another exchange that passes ``key`` on to one (RabbitMQ
    "Exchange to Exchange Bindings"; followed transitively). ``what``: "shard" or "job
    queue", for the message. A job queue's own routing key shared with another job queue on
    a direct exchange is :func:`routing_checks`' (not repeated here).
    """
    problems = []

    def harm(dest: str) -> str:
        return (f"every job of that {what} would also reach {dest!r} (run twice, or quarantined there as a job it "
                "does not know)")  # fmt: skip

    for source, pattern, dest, where_file, where in routes.bound:
        if source != exchange or dest == work or not _takes(kind, pattern, key):
            continue
        if what == "job queue" and kind == "direct" and where.endswith(".routing_keys"):
            continue  # routing_checks: "also routes to job queue ..."
        problems.append(
            Problem(where_file, where,
                    f"binding key {pattern!r} of exchange {exchange!r} to {dest!r} also matches {key!r}, the routing "
                    f"key publishers use for {what} {work!r}: " + harm(dest),
                    "bind the other work queue with keys that no job queue's publish key (its first routing key, "
                    "or <key>.shard-<i> of a sharded one) matches")
        )  # fmt: skip
    for source, pattern, onto, where_file, where in routes.onward:
        if source != exchange or not _takes(kind, pattern, key):
            continue
        for dest in routes.behind(onto, key, frozenset({exchange})):
            if dest == work:
                continue
            problems.append(
                Problem(where_file, where,
                        f"binding of exchange {exchange!r} to exchange {onto!r} with key {pattern!r} passes {key!r}, "
                        f"the routing key publishers use for {what} {work!r}, on to {dest!r}: "
                        + harm(dest),
                        "bind the exchange with a key that no job queue's publish key (its first routing key, or "
                        "<key>.shard-<i> of a sharded one) matches, or bind the work queue elsewhere")
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
            f"{file}: {key}: quorum-queue priorities need RabbitMQ 4.3+; `topology apply`, the worker "
            "and an enqueue with a priority refuse it on an older broker"
        )
        return []
    refusal = quorum_priority_refusal(broker_version)
    return [] if refusal is None else [Problem(file, key, *refusal)]


def _shard_routing_rules(
    file: str, base: str, jq: JobQueueSpec, broker_version: tuple[int, ...] | None, warnings: list[str]
) -> list[Problem]:
    """``shard_routing = "modulus-hash"``: a sharded job queue, on RabbitMQ 4.3+ (release notes 4.3.0)."""
    key = f"{base}.shard_routing"
    if jq.shards == 1:
        return [Problem(file, key, "shard_routing applies to sharded job queues only (shards is 1)",
                        "set shards to 2 or more, or remove shard_routing")]  # fmt: skip
    if jq.max_depth is not None or jq.max_age is not None:  # the broker picks the shard after the publish
        return [Problem(file, key, "max_depth/max_age can't be checked with modulus-hash: the broker picks "
                        "the shard after the publish",
                        "use shard_routing crc32, or bound the shards with max_length")]  # fmt: skip
    if broker_version is None:
        warnings.append(
            f"{file}: {key}: modulus-hash needs RabbitMQ 4.3+; `topology apply` refuses it on an older broker"
        )
        return []
    refusal = modulus_hash_refusal(broker_version)
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
    if jq.shard_routing == "modulus-hash":
        problems.extend(_shard_routing_rules(file, base, jq, broker_version, warnings))
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
        if jq.max_age is not None:  # the management API has no head_message_timestamp for quorum queues
            problems.append(
                Problem(
                    file,
                    f"{base}.max_age",
                    f"max_age can't be checked on quorum job queue {jq.name!r}: RabbitMQ reports no head message "
                    "timestamp for quorum queues (seen on 3.10 and 4.3), so enqueue would never refuse",
                    'use type = "classic" for max_age, or bound the queue with max_depth instead',
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
    problems.extend(tier_problems(file, base, jq.retry_tiers))
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
