"""The ledger marker (``amqpjobs.ledger.<app>``) is one of our queues: the naming scheme knows it.

Before, the one parser of queue names read it as a job queue of that whole name: ``status
--queues amqpjobs.ledger.shop`` reported it as a job queue missing its quarantine ("apply the
topology"), and a policy that expires it (it never has a consumer) was judged as on any queue,
without saying that the app's memory of its ledger goes with it.
"""

from __future__ import annotations

import pytest

from amqpjobs.runtime.ledger_origin import marker_queue
from amqpjobs.topology import naming
from amqpjobs.topology.naming import QueueName, parse_queue_name
from amqpjobs.topology.policy_effects import QueuePolicy, effect
from amqpjobs.wire.settings import broker_settings
from tests.integration.helpers import cli

NOWHERE = broker_settings("amqp://guest:guest@127.0.0.1:1/")  # nothing listens: a refusal must come first


@pytest.mark.parametrize("app", ["shop", "a.b.c", "x.quarantine", "amqpjobs", "s.retry.5s"])
def test_the_marker_reads_back_as_the_ledger_marker_of_its_app(app: str) -> None:
    assert marker_queue(app) == naming.ledger_marker_name(app) == f"amqpjobs.ledger.{app}"
    assert parse_queue_name(marker_queue(app)) == QueueName("ledger", app=app)


def test_the_prefix_alone_is_a_work_queue() -> None:
    assert parse_queue_name("amqpjobs.ledger.") == QueueName("work", "amqpjobs.ledger.", "amqpjobs.ledger.")


def test_status_refuses_the_marker_as_a_job_queue() -> None:
    result = cli(NOWHERE, "status", "--queues", "amqpjobs.ledger.shop")
    assert result.exit_code == 2, result.output
    assert "--queues: amqpjobs.ledger.shop is the ledger marker of app shop: give job queue names" in result.stderr


def test_a_policy_that_expires_the_marker_says_what_goes_with_it() -> None:
    marker = marker_queue("shop")
    args = {"x-queue-type": "classic", "x-max-length": 0}
    found = effect(QueuePolicy(marker, "classic", args, {"expires": 86400000}, "tidy", None, None))
    assert found is not None
    assert found.loses
    assert "expires 1d" in str(found)
    assert "a ledger lost after it can't be told from the app's first" in str(found), str(found)


def test_the_marker_is_quorum_and_its_classic_shape_is_its_accepted_legacy() -> None:
    """The plan's one legacy rule (the quarantine pair's) holds for the marker: classic, x-max-length 0."""
    from amqpjobs.topology.ledger_marker import ledger_marker
    from amqpjobs.topology.plan import Action, ObjectState, make_plan
    from amqpjobs.wire.arguments import queue_arguments, queue_state

    marker = ledger_marker("shop")
    assert queue_arguments(marker) == {"x-queue-type": "quorum", "x-max-length": 0}
    shape = marker.legacy_shape()
    assert shape is not None
    assert queue_arguments(shape) == {"x-queue-type": "classic", "x-max-length": 0}
    old = ObjectState("queue", marker.name, "classic", arguments={"x-max-length": 0})
    (item,) = make_plan([queue_state(marker)], [old]).items
    assert item.action == Action.UNCHANGED
    assert item.note.startswith("amqpjobs.ledger.shop is classic")
    other = ObjectState("queue", marker.name, "classic", arguments={"x-max-length": 5})
    assert make_plan([queue_state(marker)], [other]).items[0].action == Action.CONFLICT


def test_a_classic_queue_whose_node_is_down_is_not_missing() -> None:
    """3.10's 404 for a classic queue on a node that is down (measured with scripts/cluster.sh)."""
    import aiormq.exceptions

    from amqpjobs.wire.errors import home_node_down

    down = aiormq.exceptions.ChannelNotFoundEntity(
        "NOT_FOUND - home node 'amqpjobs-c2@localhost' of durable queue 'amqpjobs.ledger.idem' in vhost '/' is "
        "down or inaccessible"
    )
    assert home_node_down(down)
    assert not home_node_down(aiormq.exceptions.ChannelNotFoundEntity("NOT_FOUND - no queue 'q' in vhost '/'"))
