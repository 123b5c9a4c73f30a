"""The pure parts of enqueue backpressure (issue 25): alarm names, queue bounds in the topology."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from amqpjobs import BrokerBlockedError, PublishError, PublishNackedError, QueueFullError
from amqpjobs.topology.bounds import QueueBounds
from amqpjobs.topology.models import Topology
from amqpjobs.wire.alarms import alarm_of


@pytest.mark.parametrize(
    ("reason", "alarm"),
    [("low on memory", "memory"), ("low on disk", "disk"), ("low on memory & disk", "memory & disk"),
     ("", "a resource alarm"), ("something new", "something new")],
)  # fmt: skip
def test_the_alarm_is_read_from_the_blocked_reason(reason: str, alarm: str):
    assert alarm_of(reason) == alarm


def topology(**job_queue: object) -> Topology:
    return Topology.model_validate(
        {"exchanges": [{"name": "jobs"}], "job_queues": [{"name": "work", "exchange": "jobs", **job_queue}]}
    )


def test_bounds_come_from_the_job_queue_with_durations_in_seconds():
    bounds = topology(max_depth=100, max_age="2m", max_length=500).layout("work").bounds
    assert bounds == QueueBounds(max_depth=100, max_age=120.0, max_length=500)
    assert bounds.checked


def test_max_length_counts_as_a_bound_only_where_the_broker_nacks():
    assert topology(max_length=5, overflow="drop-head").layout("work").bounds.max_length is None
    assert topology(max_length=5, type="quorum").layout("work").bounds.max_length == 5
    assert not topology(max_length=5).layout("work").bounds.checked  # the broker checks it, not enqueue


@pytest.mark.parametrize("bad", [{"max_depth": 0}, {"max_depth": "10"}, {"max_age": 0}, {"max_age": "soon"}])
def test_bad_bounds_are_refused(bad: dict[str, object]):
    with pytest.raises(ValidationError):
        topology(**bad)


def test_a_sharded_job_lands_in_the_shard_its_routing_key_names():
    layout = topology(shards=4, max_depth=10).layout("work")
    for i, key in enumerate(layout.shard_routing_keys):
        assert layout.work_queue_for(key) == layout.work_queues[i]
    assert topology().layout("work").work_queue_for("work") == "work"


def test_the_errors_sit_where_callers_catch_them():
    assert issubclass(QueueFullError, PublishNackedError)
    assert issubclass(BrokerBlockedError, PublishError)
    assert not issubclass(BrokerBlockedError, PublishNackedError)
    full = QueueFullError("full", queue="work", limit="max_depth 3 (3 ready)")
    blocked = BrokerBlockedError("blocked", alarm="disk", waited=1.5)
    assert (full.queue, full.limit, blocked.alarm, blocked.waited) == ("work", "max_depth 3 (3 ready)", "disk", 1.5)
