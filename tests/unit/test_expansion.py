from __future__ import annotations

import pytest

from amqpjobs.durations import format_duration, parse_duration
from amqpjobs.topology.holding_queues import legacy_note, note_for_vhost
from amqpjobs.topology.models import ExchangeSpec, JobQueueSpec, Topology
from amqpjobs.topology.plan import Action, ObjectState, make_plan
from amqpjobs.wire.arguments import desired_state, queue_arguments, to_milliseconds


def topo(**kw: object) -> Topology:
    spec = JobQueueSpec.model_validate({"name": "mail", "exchange": "jobs", **kw})
    return Topology(exchanges=(ExchangeSpec(name="jobs"),), job_queues=(spec,))


def test_classic_job_queue_expands_to_work_tiers_quarantine() -> None:
    decls = topo(max_priority=5, retry_tiers=["5s", "1m"]).declarations()
    assert [(e.name, e.type) for e in decls.exchanges] == [
        ("jobs", "direct"), ("mail.quarantine", "fanout"), ("amqpjobs.events", "topic")
    ]  # fmt: skip
    assert [q.name for q in decls.queues] == [
        "mail.quarantine", "mail.parked", "mail.suspects", "mail", "mail.retry.5s", "mail.retry.1m"
    ]  # fmt: skip
    args = {q.name: queue_arguments(q) for q in decls.queues}
    assert args["mail"] == {
        "x-queue-type": "classic",
        "x-max-priority": 5,
        "x-dead-letter-exchange": "mail.quarantine",
    }
    assert args["mail.retry.5s"] == {
        "x-queue-type": "classic",
        "x-message-ttl": 5000,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "mail",
    }
    assert args["mail.retry.1m"]["x-message-ttl"] == 60000
    assert args["mail.quarantine"] == {"x-queue-type": "classic"}
    assert args["mail.parked"] == {"x-queue-type": "classic"}
    assert args["mail.suspects"] == {"x-queue-type": "classic", "x-dead-letter-exchange": "mail.quarantine"}
    assert [(b.source, b.destination, b.routing_key) for b in decls.bindings] == [
        ("mail.quarantine", "mail.quarantine", ""),
        ("jobs", "mail", "mail"),
    ]


def test_quorum_job_queue_has_explicit_delivery_limit_and_at_least_once() -> None:
    decls = topo(type="quorum", retry_tiers=["5s"]).declarations()
    work = next(q for q in decls.queues if q.name == "mail")
    assert queue_arguments(work) == {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": "mail.quarantine",
        "x-dead-letter-strategy": "at-least-once",
        "x-delivery-limit": 10,
        "x-overflow": "reject-publish",
    }
    tier = next(q for q in decls.queues if q.name == "mail.retry.5s")
    assert queue_arguments(tier)["x-dead-letter-strategy"] == "at-least-once"
    assert queue_arguments(tier)["x-overflow"] == "reject-publish"
    for name in ("mail.quarantine", "mail.parked"):  # as safe as the work queue; no limit browsing could reach
        holding = next(q for q in decls.queues if q.name == name)
        assert queue_arguments(holding) == {"x-queue-type": "quorum", "x-delivery-limit": 2**31 - 1}
        assert holding.legacy_note.startswith(f"{name} is classic, as amqpjobs declared it before")


def test_a_quorum_quarantine_found_classic_is_kept_with_a_note_and_anything_else_conflicts() -> None:
    desired = {s.name: s for s in desired_state(topo(type="quorum").declarations())}
    quarantine = desired["mail.quarantine"]
    old = ObjectState("queue", "mail.quarantine", "classic", arguments={"x-queue-type": "classic"}, messages=4)
    (item,) = make_plan([quarantine], [old]).items
    assert (item.action, item.differences, item.remedy) == (Action.UNCHANGED, (), "")
    assert item.note.endswith(
        "To make it quorum without losing a job: move its jobs to mail.parked (`amqpjobs quarantine park "
        "mail.quarantine --yes`), delete it (`rabbitmqctl -p <vhost> delete_queue --if-empty mail.quarantine`) and "
        "apply again"
    )
    parked = desired["mail.parked"]  # emptied through the quarantine, once that is quorum: never purged
    (item,) = make_plan([parked], [ObjectState("queue", "mail.parked", "classic", messages=1)]).items
    assert item.action is Action.UNCHANGED
    assert item.note.endswith(
        "To make it quorum without losing a job or running one, once mail.quarantine is quorum: `amqpjobs "
        "quarantine unpark mail.parked --yes` (its jobs wait in mail.quarantine), delete it (`rabbitmqctl -p "
        "<vhost> delete_queue --if-empty mail.parked`), apply again, then `amqpjobs quarantine park mail.quarantine "
        "--yes` parks them again"
    )
    assert "purge" not in item.note
    assert "replay" not in item.note  # a replay would run each parked job once more
    assert "note: mail.quarantine is classic" in make_plan([quarantine], [old]).report()
    for other in (
        ObjectState("queue", "mail.quarantine", "classic", arguments={"x-max-length": 5}),
        ObjectState("queue", "mail.quarantine", "quorum", arguments={"x-delivery-limit": 20}),
        ObjectState("queue", "mail.quarantine", "classic", durable=False),
    ):
        (conflict,) = make_plan([quarantine], [other]).items
        assert (conflict.action, conflict.note) == (Action.CONFLICT, "")
    work = desired["mail"]  # a work queue has no legacy shape
    (item,) = make_plan([work], [ObjectState("queue", "mail", "classic")]).items
    assert item.action is Action.CONFLICT
    classic = {s.name: s for s in desired_state(topo().declarations())}["mail.quarantine"]
    assert classic.legacy is None


def test_shards_get_own_tiers_returning_to_their_own_shard() -> None:
    t = topo(shards=3, retry_tiers=["5s"])
    lay = t.layout("mail")
    assert lay.work_queues == ("mail.shard-0", "mail.shard-1", "mail.shard-2")
    assert lay.shard_routing_keys == ("mail.shard-0", "mail.shard-1", "mail.shard-2")
    decls = t.declarations()
    tiers = {q.name: q.dead_letter_routing_key for q in decls.queues if q.role == "tier"}
    assert tiers == {f"mail.shard-{i}.retry.5s": f"mail.shard-{i}" for i in range(3)}
    assert sum(1 for q in decls.queues if q.role == "quarantine") == 1


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("5s", 5.0), ("1m", 60.0), ("1h30m", 5400.0), ("12", 12.0), (2.5, 2.5), ("1.5s", 1.5)],
)
def test_parse_duration(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "5 s", "5x", "-1s", "0s", 0, -3, "s5", float("nan"), True])
def test_parse_duration_rejects(bad: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("seconds", "text"), [(5, "5s"), (90, "90s"), (600, "10m"), (0.25, "250ms"), (3600, "1h")])
def test_format_duration_round_trips(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert to_milliseconds(parse_duration(text)) == to_milliseconds(seconds)


def test_a_legacy_note_names_the_vhost_quoted_for_a_shell() -> None:
    note = legacy_note("mail.quarantine", "quarantine", "mail.quarantine", "mail.parked")
    assert "`rabbitmqctl -p / delete_queue --if-empty mail.quarantine`" in note_for_vhost(note, "/")
    assert "`rabbitmqctl -p 'shop eu' delete_queue" in note_for_vhost(note, "shop eu")
    assert "<vhost>" not in note_for_vhost(note, "x")
