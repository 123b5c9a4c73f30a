"""The Raft-majority rule `topology apply` and the worker's start-up follow on RabbitMQ 4.3 (no broker)."""

from __future__ import annotations

from amqpjobs.topology.versions import raft_majority_refusal

THREE = ["rabbit@a", "rabbit@b", "rabbit@c"]


def test_one_of_three_running_is_refused_naming_the_nodes_and_the_fix() -> None:
    message = raft_majority_refusal((4, 3, 6), {"rabbit@a": True, "rabbit@b": False, "rabbit@c": False})
    assert message is not None
    assert message.startswith(
        "no Raft majority: 1 of the cluster's 3 nodes run (rabbit@a; down or unreachable: rabbit@b, rabbit@c)"
    )
    assert "needs 2 of 3 for any declaration" in message
    assert "Bring the stopped nodes back" in message


def test_a_majority_or_an_older_broker_or_no_list_is_no_refusal() -> None:
    assert raft_majority_refusal((4, 3, 6), dict(zip(THREE, (True, True, False), strict=True))) is None
    assert raft_majority_refusal((4, 3, 6), {"rabbit@a": True}) is None  # a single node is its own majority
    assert raft_majority_refusal((4, 2, 1), dict(zip(THREE, (True, False, False), strict=True))) is None
    assert raft_majority_refusal((3, 10, 8), dict(zip(THREE, (True, False, False), strict=True))) is None
    assert raft_majority_refusal((4, 3, 6), {}) is None


def test_half_of_an_even_cluster_is_no_majority() -> None:
    nodes = {"rabbit@a": True, "rabbit@b": True, "rabbit@c": False, "rabbit@d": False}
    message = raft_majority_refusal((4, 3, 0), nodes)
    assert message is not None
    assert "2 of the cluster's 4 nodes run" in message
    assert "needs 3 of 4" in message
