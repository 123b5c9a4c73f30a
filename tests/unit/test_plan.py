"""Table tests of the pure plan: desired vs live objects into create / unchanged / CONFLICT."""

from __future__ import annotations

from typing import Any

import pytest

from amqpjobs.topology.declarations import BindingDecl, Declarations
from amqpjobs.topology.plan import PRIORITY_FIX, Action, Difference, ObjectState, binding_name, drift_effects, make_plan
from amqpjobs.wire.arguments import desired_state

Q = ObjectState("queue", "work", "classic", arguments={"x-queue-type": "classic", "x-max-priority": 5})
EX = ObjectState("exchange", "jobs", "direct")
BIND = ObjectState("binding", "jobs -> work [work]")


def live(obj: ObjectState, **changes: Any) -> ObjectState:
    fields = {"kind": obj.kind, "name": obj.name, "type": obj.type, "durable": obj.durable,
              "auto_delete": obj.auto_delete, "arguments": obj.arguments, "messages": obj.messages}  # fmt: skip
    return ObjectState(**{**fields, **changes})


CASES = [
    pytest.param(Q, None, Action.CREATE, (), id="missing-queue"),
    pytest.param(Q, Q, Action.UNCHANGED, (), id="same-queue"),
    pytest.param(EX, None, Action.CREATE, (), id="missing-exchange"),
    pytest.param(EX, EX, Action.UNCHANGED, (), id="same-exchange"),
    pytest.param(BIND, None, Action.CREATE, (), id="missing-binding"),
    pytest.param(BIND, live(BIND, durable=False), Action.UNCHANGED, (), id="bindings-have-no-settings"),
    pytest.param(
        Q, live(Q, arguments={"x-max-priority": 5.0}), Action.UNCHANGED, (), id="numbers-by-value"
    ),
    pytest.param(Q, live(Q, type="quorum"), Action.CONFLICT, (Difference("type", "quorum", "classic"),), id="type"),
    pytest.param(Q, live(Q, durable=False), Action.CONFLICT, (Difference("durable", False, True),), id="durable"),
    pytest.param(
        Q, live(Q, auto_delete=True), Action.CONFLICT, (Difference("auto_delete", True, False),), id="auto-delete"
    ),
    pytest.param(
        Q, live(Q, arguments={"x-max-priority": 10}), Action.CONFLICT, (Difference("x-max-priority", 10, 5),),
        id="argument-value",
    ),
    pytest.param(
        Q, live(Q, arguments={"x-max-priority": 5, "x-message-ttl": 1000}), Action.CONFLICT,
        (Difference("x-message-ttl", 1000, None),), id="extra-live-argument",
    ),
    pytest.param(
        live(Q, arguments={"x-single-active-consumer": True}), live(Q, arguments={"x-single-active-consumer": 1}),
        Action.CONFLICT, (Difference("x-single-active-consumer", 1, True),), id="bool-is-not-int",
    ),
    pytest.param(EX, live(EX, type="fanout"), Action.CONFLICT, (Difference("type", "fanout", "direct"),), id="exch"),
]  # fmt: skip


@pytest.mark.parametrize(("desired", "found", "action", "differences"), CASES)
def test_one_object(
    desired: ObjectState, found: ObjectState | None, action: Action, differences: tuple[Difference, ...]
) -> None:
    item = make_plan([desired], [] if found is None else [found]).items[0]
    assert (item.action, item.differences) == (action, differences)
    assert bool(item.remedy) is (action is Action.CONFLICT)


@pytest.mark.parametrize(
    ("desired", "found", "says"),
    [
        (EX, live(EX, type="fanout"), "delete the exchange and apply again"),
        (Q, live(Q, durable=False, messages=7), "(now: 7 message(s))"),
        (Q, live(Q, durable=False), "(now: unknown message(s))"),
        (Q, live(Q, arguments={"x-max-priority": 5, "x-message-ttl": 1}), "x-message-ttl can also be set by a policy"),
    ],
)
def test_remedy(desired: ObjectState, found: ObjectState, says: str) -> None:
    assert says in make_plan([desired], [found]).items[0].remedy


def test_plan_keeps_declaration_order_counts_and_reports() -> None:
    plan = make_plan([EX, Q, BIND], [live(Q, type="quorum"), EX, ObjectState("queue", "other")])
    assert [i.desired.name for i in plan.items] == ["jobs", "work", "jobs -> work [work]"]
    assert plan.counts() == {"create": 1, "unchanged": 1, "CONFLICT": 1}
    assert [i.desired for i in plan.conflicts] == [Q]
    assert [i.desired for i in plan.creates] == [BIND]
    report = plan.report().splitlines()
    assert report[0] == "unchanged exchange jobs"
    assert report[1] == "CONFLICT  queue    work"
    assert report[2] == "            type: live 'quorum', desired 'classic'"
    assert report[-1] == "1 to create, 1 unchanged, 1 conflict(s)"


@pytest.mark.parametrize(
    ("source", "destination", "routing_key", "name"),
    [
        ("jobs", "work", "work", "jobs -> work [work]"),
        ("jobs.q", "q.quarantine", "", "jobs.q -> q.quarantine []"),
        ("ex", "other.ex", "a.*.b", "ex -> other.ex [a.*.b]"),
    ],
)
def test_a_declared_binding_is_named_as_the_management_api_binding_is(
    source: str, destination: str, routing_key: str, name: str
) -> None:
    """Desired (declarations) and live (management API) bindings meet by name: one format for both."""
    assert binding_name(source, destination, routing_key) == name
    binding = BindingDecl(source=source, destination=destination, routing_key=routing_key)
    declared = Declarations(exchanges=(), queues=(), bindings=(binding,))
    assert [o.key for o in desired_state(declared)] == [("binding", name)]


@pytest.mark.parametrize(
    ("differences", "words"),
    [
        ([Difference("x-max-priority", None, 5)], f"the broker ignores the priority of every job in it (taken in "
                                                   f"publish order); {PRIORITY_FIX}"),
        ([Difference("x-max-priority", 2, 5)], f"the broker delivers a priority above 2 as 2; {PRIORITY_FIX}"),
        ([Difference("x-max-priority", 9, None)], "the broker sorts its jobs by priority 0-9, which the topology "
                                                  "does not expect"),
        ([Difference("x-max-priority", 9, 5)], "what the broker dead-letters, expires or pushes out of it may not "
                                               "reach its quarantine"),
        ([Difference("x-max-length", 2, None)], "what the broker dead-letters, expires or pushes out of it may not "
                                                "reach its quarantine"),
        ([Difference("x-max-priority", None, 5), Difference("x-dead-letter-exchange", None, "q")],
         f"the broker ignores the priority of every job in it (taken in publish order); {PRIORITY_FIX}; what the "
         "broker dead-letters, expires or pushes out of it may not reach its quarantine"),
    ],
)  # fmt: skip
def test_drift_effects_name_what_the_broker_does_with_each_difference(
    differences: list[Difference], words: str
) -> None:
    assert drift_effects(differences) == words
