"""Desired vs live broker objects → a plan of create / unchanged / CONFLICT (pure, no I/O).

Queue and exchange arguments are fixed when an object is created: re-declaring with
other arguments fails with ``406 PRECONDITION_FAILED`` and closes the channel
(RabbitMQ "Queues" → "Optional Arguments", "Policies" → "Why policies exist"). A plan
finds every such difference before anything is declared, so ``apply`` can refuse to
start instead of failing half way.

The caller supplies both sides as :class:`ObjectState` values: the desired side built
from a topology by :func:`amqpjobs.wire.arguments.desired_state`, the live side read from
the management API by :mod:`amqpjobs.wire.management`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

ObjectKind = Literal["exchange", "queue", "binding"]

#: Queue keys that a policy can also set (RabbitMQ "Policies" → "Policy Definition
#: Keys"); for these a policy is an alternative to recreating the queue.
POLICY_KEYS = frozenset(
    {
        "x-message-ttl",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-dead-letter-strategy",
        "x-max-length",
        "x-max-length-bytes",
        "x-overflow",
        "x-expires",
        "x-delivery-limit",
    }
)

#: Compared through the object's ``type`` instead of its arguments.
_TYPE_ARGUMENT = "x-queue-type"


@dataclass(frozen=True)
class ObjectState:
    """One broker object as declared (desired) or as found (live).

    Attributes:
        kind: ``exchange``, ``queue`` or ``binding``.
        name: Object name; for a binding :func:`binding_name`.
        type: Exchange type, queue type (``classic``/``quorum``), or ``""`` for bindings.
        durable: Durable flag.
        auto_delete: Auto-delete flag.
        arguments: AMQP arguments (milliseconds for durations).
        messages: Live queues only: messages in the queue, when known.
        legacy: Desired objects only: an older shape of this object that an earlier
            amqpjobs declared, still accepted as it is (not a conflict), and the note the
            plan prints about it (what it lacks, how to move on); None when there is none.

    """

    kind: ObjectKind
    name: str
    type: str = ""
    durable: bool = True
    auto_delete: bool = False
    arguments: Mapping[str, Any] = field(default_factory=dict)
    messages: int | None = None
    legacy: tuple[ObjectState, str] | None = None

    @property
    def key(self) -> tuple[str, str]:
        """Identity of the object: (kind, name)."""
        return (self.kind, self.name)


def binding_name(source: str, destination: str, routing_key: str) -> str:
    """The name a plan gives a binding, declared or found: ``"<source> -> <destination> [<routing key>]"``."""
    return f"{source} -> {destination} [{routing_key}]"


class Action(enum.Enum):
    """What ``apply`` would do with one object."""

    CREATE = "create"
    UNCHANGED = "unchanged"
    CONFLICT = "CONFLICT"


@dataclass(frozen=True)
class Difference:
    """One setting whose live value differs from the desired one.

    Attributes:
        setting: Argument name (e.g. ``x-max-priority``) or ``type``/``durable``/``auto_delete``.
        live: Live value, or None when the live object lacks it.
        desired: Desired value, or None when the topology does not set it.

    """

    setting: str
    live: Any
    desired: Any

    def __str__(self) -> str:
        return f"{self.setting}: live {_show(self.live)}, desired {_show(self.desired)}"


@dataclass(frozen=True)
class PlanItem:
    """The plan for one object.

    Attributes:
        desired: The desired object.
        action: create, unchanged or CONFLICT.
        differences: For a conflict, every differing setting.
        remedy: For a conflict, what the operator can do.
        note: For an unchanged object found in its legacy shape (:attr:`ObjectState.legacy`),
            what that shape lacks and how to move on; otherwise empty.

    """

    desired: ObjectState
    action: Action
    differences: tuple[Difference, ...] = ()
    remedy: str = ""
    note: str = ""


@dataclass(frozen=True)
class Plan:
    """The plan for a whole topology, in declaration order."""

    items: tuple[PlanItem, ...]

    @property
    def conflicts(self) -> tuple[PlanItem, ...]:
        """Items whose live object is inequivalent to the desired one."""
        return tuple(i for i in self.items if i.action is Action.CONFLICT)

    @property
    def creates(self) -> tuple[PlanItem, ...]:
        """Items that do not exist yet."""
        return tuple(i for i in self.items if i.action is Action.CREATE)

    def counts(self) -> dict[str, int]:
        """Number of items per action value, e.g. ``{"create": 3, "unchanged": 9, "CONFLICT": 0}``."""
        return {a.value: sum(1 for i in self.items if i.action is a) for a in Action}

    def report(self) -> str:
        """A human-readable report: one line per object, conflicts with details and remedy."""
        lines = []
        for item in self.items:
            d = item.desired
            lines.append(f"{item.action.value:<9} {d.kind:<8} {d.name}")
            for diff in item.differences:
                lines.append(f"            {diff}")
            if item.remedy:
                lines.append(f"            remedy: {item.remedy}")
            if item.note:
                lines.append(f"            note: {item.note}")
        c = self.counts()
        lines.append(f"{c['create']} to create, {c['unchanged']} unchanged, {c['CONFLICT']} conflict(s)")
        return "\n".join(lines)


def make_plan(desired: Sequence[ObjectState], live: Sequence[ObjectState]) -> Plan:
    """Compare desired objects with live ones.

    Args:
        desired: Objects the topology wants, in declaration order.
        live: Objects found on the broker (any order; extra live objects are ignored).

    Returns:
        A :class:`Plan` with one item per desired object. A live object in its desired
        object's legacy shape (:attr:`ObjectState.legacy`) is unchanged, with its note.

    """
    found = {obj.key: obj for obj in live}
    items = []
    for want in desired:
        have = found.get(want.key)
        if have is None:
            items.append(PlanItem(want, Action.CREATE))
            continue
        diffs = _differences(want, have)
        if not diffs:
            items.append(PlanItem(want, Action.UNCHANGED))
        elif want.legacy is not None and not _differences(want.legacy[0], have):
            items.append(PlanItem(want, Action.UNCHANGED, note=want.legacy[1]))
        else:
            items.append(PlanItem(want, Action.CONFLICT, diffs, _remedy(want, have, diffs)))
    return Plan(tuple(items))


def _differences(want: ObjectState, have: ObjectState) -> tuple[Difference, ...]:
    if want.kind == "binding":
        return ()
    diffs = []
    if want.type != have.type:
        diffs.append(Difference("type", have.type, want.type))
    if want.durable != have.durable:
        diffs.append(Difference("durable", have.durable, want.durable))
    if want.auto_delete != have.auto_delete:
        diffs.append(Difference("auto_delete", have.auto_delete, want.auto_delete))
    names = sorted((set(want.arguments) | set(have.arguments)) - {_TYPE_ARGUMENT})
    for name in names:
        w, h = want.arguments.get(name), have.arguments.get(name)
        if not _same(w, h):
            diffs.append(Difference(name, h, w))
    return tuple(diffs)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    return bool(a == b)


def _remedy(want: ObjectState, have: ObjectState, diffs: tuple[Difference, ...]) -> str:
    if want.kind == "exchange":
        return (
            "exchange settings can't change in place: delete the exchange and apply again "
            "(bindings to it are removed with it), or use a new name"
        )
    depth = "unknown" if have.messages is None else str(have.messages)
    text = (
        "queue arguments can't change in place: declare it under a new name and move the "
        f"messages (e.g. a shovel), or, when it is empty (now: {depth} message(s)), delete it "
        "and apply again"
    )
    policy = sorted(d.setting for d in diffs if d.setting in POLICY_KEYS)
    if policy:
        text += (
            f"; {', '.join(policy)} can also be set by a policy, so after recreating the queue "
            "without the argument a policy can change it later without recreating"
        )
    return text


#: Why a live queue's arguments can't simply be changed: what ``drift_effects`` ends a priority difference with.
PRIORITY_FIX = (
    "RabbitMQ can't change x-max-priority of an existing queue, nor can a policy set it: declare the queue "
    "under a new name and move its jobs, or delete it when empty and apply the topology again"
)


def drift_effects(differences: Sequence[Difference]) -> str:
    """What the broker does differently with a job queue's queue whose live settings are ``differences``.

    A pure rule for the words ``status`` and a worker's start add to a CONFLICT found after
    deploy: a live ``x-max-priority`` that is missing or lower than the topology's drops or lowers
    the jobs' priorities (RabbitMQ "Priority Queue Support": a classic queue without it ignores
    priorities, one with it delivers a higher priority as its maximum), which no policy can mend
    (:data:`PRIORITY_FIX`); any other setting may keep what the broker dead-letters, expires or
    pushes out from reaching the quarantine.

    Returns:
        One or two clauses joined by ``"; "``, without a final full stop.

    """
    out = []
    for diff in differences:
        if diff.setting != "x-max-priority":
            continue
        live, desired = diff.live, diff.desired
        if live is None:
            out.append(f"the broker ignores the priority of every job in it (taken in publish order); {PRIORITY_FIX}")
        elif desired is None:
            out.append(f"the broker sorts its jobs by priority 0-{live}, which the topology does not expect")
        elif isinstance(live, int) and isinstance(desired, int) and live < desired:
            out.append(f"the broker delivers a priority above {live} as {live}; {PRIORITY_FIX}")
    if any(d.setting != "x-max-priority" for d in differences) or not out:
        out.append("what the broker dead-letters, expires or pushes out of it may not reach its quarantine")
    return "; ".join(out)


def _show(value: Any) -> str:
    return "(none)" if value is None else repr(value)
