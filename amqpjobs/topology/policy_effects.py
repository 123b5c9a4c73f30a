"""What a policy in effect on one of our queues does to the jobs in it (pure, no I/O).

A policy or an operator policy matching a queue changes it at run time, whatever the
topology declared (RabbitMQ "Policies"). For each key the broker resolves a queue's optional
argument against the policy: ``expires``, ``message-ttl``, ``max-length``,
``max-length-bytes`` and ``delivery-limit`` take the lower of the two, ``dead-letter-exchange``,
``dead-letter-routing-key`` and ``overflow`` the argument when the queue has one, except
that on a quorum queue the policy's ``overflow`` and ``expires`` win (RabbitMQ "Policies" →
"Policies and Optional Arguments"; measured on 3.10.8 and 4.3.6: a policy's ``overflow:
drop-head`` replaced a quorum queue's ``x-overflow: reject-publish``, not a classic one's).
A user policy and an operator policy are merged first, the lower value winning where both
set a key; the management API shows the result as the queue's ``effective_policy_definition``.

Some keys can lose jobs on our queues: ``expires`` deletes a queue with every message in it
once nobody has consumed from it for that long (a retry tier, the quarantine, the parked and
suspects queues are never consumed); a ``message-ttl`` or a ``max-length`` on a queue with
no dead-letter exchange of ours (the quarantine, the parked queue) drops what expires or is
pushed out, or sends it to the policy's own dead-letter exchange, out of amqpjobs' queues; a
``max-length`` whose overflow refuses new messages makes the broker drop a dead-letter into
the queue from a classic queue (classic dead-lettering is at-most-once: a retry coming back
to a classic work queue, a job its work queue dead-letters into quarantine; a quorum queue's
at-least-once dead-letters wait in it instead). Others only change when a job comes back
or is quarantined (a shorter retry tier, a lower quorum ``delivery-limit``, a ``message-ttl``
or ``max-length`` with ``drop-head`` on a work queue, which dead-letter into its
quarantine): notes, not problems. A quorum job queue whose overflow a policy makes
``drop-head`` loses its ``at-least-once`` dead-lettering (the broker logs "Falling back to
dead-letter-strategy at-most-once"): what it dead-letters while the quarantine can't take it
is dropped. A ``consumer-timeout`` on a work queue, before 4.3, runs a job longer than it twice
(a problem below RabbitMQ's default 30 min, else a note: :func:`_consumer_timeout`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from amqpjobs.durations import format_duration
from amqpjobs.printable import printable
from amqpjobs.topology.naming import parse_queue_name, work_queue_name
from amqpjobs.topology.versions import NODE_CONSUMER_TIMEOUT, consumer_timeout_rule

#: Policy keys whose lower value wins against the queue's ``x-`` argument.
_LOWER_WINS = ("expires", "message-ttl", "max-length", "max-length-bytes", "delivery-limit")
#: The queue's ``x-`` argument wins over the policy for these.
_ARGUMENT_WINS = ("dead-letter-exchange", "dead-letter-routing-key", "overflow")
#: On a quorum queue the policy wins for these.
_QUORUM_POLICY_WINS = ("overflow", "expires")
#: Our queues that hold state in being there (their arguments, or one record), and what losing them means.
STATE = {
    "paused": "the pause ends with it: workers start the job queue's jobs again",
    "breaker": "the open circuit breaker closes with it",
    "ticks": (
        "the schedule's tick record goes with it: a replica taking over starts from that moment, and the ticks "
        "missed meanwhile never fire"
    ),
    "ledger": (
        "the app's mark that it had a ledger goes with it (it never has a consumer): a ledger lost after it can't be "
        "told from the app's first, and its idempotent jobs done before may run again"
    ),
}
#: A policy's ``apply-to`` values that reach a queue of each type (3.12+ adds the typed ones).
_APPLIES_TO = {"classic": {"all", "queues", "classic_queues"}, "quorum": {"all", "queues", "quorum_queues"}}


@dataclass(frozen=True)
class QueuePolicy:
    """The policies in effect on one queue, and what the queue declared.

    Attributes:
        queue: Queue name.
        type: ``classic`` or ``quorum``.
        arguments: The queue's ``x-`` arguments (as declared, or as the topology would declare them).
        definition: The effective policy definition (user and operator policies merged).
        policy: The user policy's name, or None.
        operator_policy: The operator policy's name, or None.
        source_type: The type of the queues the broker dead-letters into this one (a work
            queue's tiers, a quarantine's work queues: :func:`source_type`), None when none do.
        broker: The broker's version, None when unknown (rules that depend on it are then
            judged as before 4.3).

    """

    queue: str
    type: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    definition: Mapping[str, Any] = field(default_factory=dict)
    policy: str | None = None
    operator_policy: str | None = None
    source_type: str | None = None
    broker: tuple[int, ...] | None = None

    @property
    def named(self) -> str:
        """The policies in words: ``policy 'p'``, ``operator policy 'o'`` or both."""
        names = [f"policy {printable(self.policy)!r}"] if self.policy else []
        names += [f"operator policy {printable(self.operator_policy)!r}"] if self.operator_policy else []
        return " and ".join(names) or "a policy"


@dataclass(frozen=True)
class PolicyEffect:
    """What the policies on one queue do to the jobs in it.

    Attributes:
        queue: Queue name (an exchange's, for ``kind`` ``exchange``).
        named: The policies in words (:attr:`QueuePolicy.named`).
        loses: True when jobs can be dropped, deleted or sent out of amqpjobs' queues, or run
            twice (a ``consumer-timeout`` shorter than a job: a problem, not a note).
        effects: One phrase per key that takes effect.
        kind: ``queue``, or ``exchange`` (:func:`exchange_effect`).

    """

    queue: str
    named: str
    loses: bool
    effects: tuple[str, ...]
    kind: str = "queue"

    def __str__(self) -> str:
        fix = ""
        if self.loses and self.named.startswith("policy"):
            fix = ("; change the policy's pattern so it leaves this queue out, or match the queue with a policy of "
                   "higher priority that does not set these keys (one policy applies to a queue)")  # fmt: skip
        if self.loses and "operator policy" in self.named:
            fix += "; an operator policy applies beside any policy: change its pattern or drop these keys from it"
        where = f"exchange {self.queue}" if self.kind == "exchange" else self.queue
        return f"{self.named} on {where}: {'; '.join(self.effects)}{fix}"


def source_type(queue: str, types: Mapping[str, str]) -> str | None:
    """The type of the queues that dead-letter into ``queue``, from ``types`` (queue name -> type).

    A work queue (or shard) is fed by its retry tiers, of its own type; a quarantine queue by
    its job queue's work queues (and suspects queue, of the same type). Nothing else of ours
    is fed by the broker: workers and ``quarantine park`` publish with confirms.
    """
    q = parse_queue_name(queue)
    if q.kind in ("work", "shard"):
        return types.get(queue)
    if q.kind == "quarantine":
        return types.get(q.job_queue) or types.get(work_queue_name(q.job_queue, 0))
    return None


def from_management(
    queue: Mapping[str, Any], source: str | None = None, broker: tuple[int, ...] | None = None
) -> QueuePolicy:
    """A :class:`QueuePolicy` from a queue as ``GET /api/queues/<vhost>`` describes it.

    ``source``: its source type (:func:`source_type`); ``broker``: the broker's version.
    """
    return QueuePolicy(
        str(queue.get("name", "")),
        str(queue.get("type") or "classic"),
        queue.get("arguments") or {},
        queue.get("effective_policy_definition") or {},
        queue.get("policy") or None,
        queue.get("operator_policy") or None,
        source,
        broker,
    )


def matching(
    queue: str,
    queue_type: str,
    arguments: Mapping[str, Any],
    policies: Iterable[Mapping[str, Any]],
    operator_policies: Iterable[Mapping[str, Any]],
    source: str | None = None,
    broker: tuple[int, ...] | None = None,
) -> QueuePolicy:
    """The policies that would apply to ``queue`` once declared, from the vhost's policy lists.

    Of each list, the matching policy (``pattern`` searched in the name, ``apply-to`` reaching
    the queue's type) of the highest ``priority`` applies; the operator policy's value wins
    where it is lower. A pattern Python's ``re`` can't read matches nothing.
    """
    user, operator = _highest(queue, queue_type, policies), _highest(queue, queue_type, operator_policies)
    definition: dict[str, Any] = dict(user.get("definition") or {}) if user else {}
    for key, value in ((operator.get("definition") or {}) if operator else {}).items():
        mine = definition.get(key)
        definition[key] = min(mine, value) if _number(mine) and _number(value) else value
    return QueuePolicy(
        queue, queue_type, arguments, definition,
        str(user["name"]) if user else None, str(operator["name"]) if operator else None, source, broker,
    )  # fmt: skip


def _highest(queue: str, queue_type: str, policies: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    found: list[tuple[int, str, Mapping[str, Any]]] = []
    for p in policies:
        if str(p.get("apply-to", "all")) not in _APPLIES_TO.get(queue_type, {"all", "queues"}):
            continue
        try:
            if re.search(str(p.get("pattern", "")), queue) is None:
                continue
        except re.error:
            continue
        found.append((-int(p.get("priority") or 0), str(p.get("name", "")), p))
    return min(found, key=lambda f: f[:2])[2] if found else None


def _number(value: Any) -> TypeGuard[int | float]:
    """Whether ``value`` is a number (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def effect(q: QueuePolicy) -> PolicyEffect | None:
    """What the policies on ``q`` change for the jobs in it, or None when nothing we rely on changes."""
    if not q.definition:
        return None
    value = {key: _resolved(q, key) for key in (*_LOWER_WINS, *_ARGUMENT_WINS)}
    taken = {k for k, v in value.items() if v is not None and v != q.arguments.get(f"x-{k}")}
    effects: list[tuple[bool, str]] = []
    where, gone = _destination(q, value)
    if "expires" in taken:
        effects.append((True, f"expires {_ms(value['expires'])}: the broker deletes the queue, with every message "
                              f"in it, once it has had no consumer, basic.get or declare that long"))  # fmt: skip
    if "message-ttl" in taken:
        before = q.arguments.get("x-message-ttl")
        if before is not None and q.arguments.get("x-dead-letter-exchange") == "":  # a retry tier
            effects.append((False, f"message-ttl {_ms(value['message-ttl'])}: retries wait "
                                   f"{_ms(value['message-ttl'])} instead of {_ms(before)}"))  # fmt: skip
        else:
            effects.append((gone, f"message-ttl {_ms(value['message-ttl'])}: a message older is {where}"))
    for key in ("max-length", "max-length-bytes"):
        if key not in taken:
            continue
        limit = f"{key} {value[key]}{' bytes' if key.endswith('bytes') else ''}"
        if (value["overflow"] or "drop-head") == "drop-head":
            effects.append((gone, f"{limit} (overflow drop-head): the oldest message past it is {where}"))
        else:
            effects.append(_refusing(q, f"{limit} (overflow {value['overflow']})"))
    if "overflow" in taken and q.arguments.get("x-dead-letter-strategy") == "at-least-once":
        effects.append((True, f"overflow {value['overflow']}: the queue's at-least-once dead-lettering falls back to "
                              "at-most-once, so a job it dead-letters while its quarantine can't take it is "
                              "dropped"))  # fmt: skip
    if "delivery-limit" in taken and q.type == "quorum":
        before = q.arguments.get("x-delivery-limit")
        was = "" if before is None else f", not the topology's {before}"
        effects.append((gone, f"delivery-limit {value['delivery-limit']}: a job delivered that often is {where}{was}"))
    if (timeout := _consumer_timeout(q)) is not None:
        effects.append(timeout)
    if not effects:
        return None
    loses = any(loses for loses, _ in effects)
    if loses and (state := STATE.get(parse_queue_name(q.queue).kind)):
        effects.append((True, state))
    return PolicyEffect(q.queue, q.named, loses, tuple(text for _, text in effects))


def exchange_effect(
    exchange: str, arguments: Mapping[str, Any], policy: str | None, definition: Mapping[str, Any]
) -> PolicyEffect | None:
    """What user policy ``policy`` (its ``definition``) on one of our exchanges changes, or None.

    Only ``alternate-exchange`` matters (an exchange's own argument wins over it): a job no
    binding routes goes there instead of back to its publisher (``mandatory``), so an enqueue
    whose job queue is not bound is confirmed and the job reaches no worker. A note: with the
    bindings in place (``status`` checks them) nothing changes.
    """
    other = definition.get("alternate-exchange")
    if not policy or other is None or arguments.get("alternate-exchange") is not None:
        return None
    words = (f"alternate-exchange {printable(str(other))!r}: a job no binding routes goes there instead of back to "
             "its publisher, so an enqueue to a job queue whose binding is missing succeeds and no worker gets "
             "the job")  # fmt: skip
    return PolicyEffect(exchange, f"policy {printable(policy)!r}", False, (words,), "exchange")


def _refusing(q: QueuePolicy, limit: str) -> tuple[bool, str]:
    """What a full queue that refuses new messages does to what comes in: (loses, words)."""
    if q.source_type == "classic":  # classic dead-lettering is at-most-once: refused means dropped
        return True, f"{limit}: past it the broker drops each dead-letter into it (from classic queues)"
    if q.source_type == "quorum":
        return False, (f"{limit}: past it enqueues are refused, and dead-letters into it wait in their quorum "
                       "queue (at-least-once) until there is room")  # fmt: skip
    return False, f"{limit}: past it the copies workers publish into it are refused (they see the refusal)"


def _consumer_timeout(q: QueuePolicy) -> tuple[bool, str] | None:
    """A policy's ``consumer-timeout`` on a work queue where the broker evaluates it: (a problem?, words), else None.

    Before 4.3 the broker applies it to every queue type, over the node's ``consumer_timeout``:
    a delivery unacknowledged that long after it was delivered closes its channel and is
    delivered again while its run goes on, so the job runs twice (measured on 4.0.5). 4.3
    evaluates none on classic queues, and our per-consumer ``x-consumer-timeout`` wins on
    quorum ones (:func:`~amqpjobs.topology.versions.consumer_timeout_rule`). Below RabbitMQ's
    default (30 min) it cuts a job that sets no timeout (its default is just below that): a
    problem; above it, only a job whose timeout is longer: a note.
    """
    value = q.definition.get("consumer-timeout")
    if not _number(value) or parse_queue_name(q.queue).kind not in ("work", "shard"):
        return None
    if q.broker is not None and consumer_timeout_rule(q.broker, q.type) != "node":
        return None
    version = "before 4.3" if q.broker is None else ".".join(map(str, q.broker))
    return value < NODE_CONSUMER_TIMEOUT * 1000, (
        f"consumer-timeout {_ms(value)} (RabbitMQ {version}: applied to every queue type, over the node's "
        f"consumer_timeout): a job still running {_ms(value)} after its delivery has its channel closed and is "
        "delivered again while it runs, so it runs twice; raise the policy's consumer-timeout above the job "
        "queue's longest job timeout (a job without one: 30m)"
    )


def _resolved(q: QueuePolicy, key: str) -> Any:
    """The value the broker uses for ``key`` on ``q`` (None: unset), by the rule of the module docstring."""
    argument, policy = q.arguments.get(f"x-{key}"), q.definition.get(key)
    if q.type == "quorum" and key in _QUORUM_POLICY_WINS and policy is not None:
        return policy
    if key in _LOWER_WINS and _number(argument) and _number(policy):
        return min(argument, policy)
    return argument if argument is not None else policy


def _destination(q: QueuePolicy, value: Mapping[str, Any]) -> tuple[str, bool]:
    """Where the queue dead-letters (in words) and whether that loses the job (True: dropped or out of ours)."""
    ours = q.arguments.get("x-dead-letter-exchange")
    exchange = value["dead-letter-exchange"]
    if ours == "":
        back = q.arguments.get("x-dead-letter-routing-key") or "?"
        return f"sent back to {printable(str(back))} early", False
    if ours is not None:
        return f"dead-lettered into {printable(str(ours))} (its quarantine)", False
    if exchange is not None:
        return f"dead-lettered to exchange {printable(str(exchange))!r} (the policy's, out of amqpjobs' queues)", True
    return "dropped (the queue has no dead-letter exchange)", True


def _ms(value: Any) -> str:
    """A policy's milliseconds as a duration (``3000`` → ``3s``)."""
    return format_duration(value / 1000) if _number(value) and value > 0 else f"{value} ms"
