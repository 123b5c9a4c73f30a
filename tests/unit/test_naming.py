"""The one parser of our queue names reads back every name the naming scheme writes."""

from __future__ import annotations

import pytest

from amqpjobs.jobs import cron
from amqpjobs.topology import naming
from amqpjobs.topology.naming import QueueName, parse_queue_name

CASES = [
    ("urgent", QueueName("work", "urgent", "urgent")),
    ("a.b.c", QueueName("work", "a.b.c", "a.b.c")),
    ("urgent.shard-3", QueueName("shard", "urgent", "urgent.shard-3", shard=3)),
    ("urgent.shard-x", QueueName("work", "urgent.shard-x", "urgent.shard-x")),
    ("urgent.shard-", QueueName("work", "urgent.shard-", "urgent.shard-")),
    ("urgent.retry.30s", QueueName("tier", "urgent", "urgent", tier="30s")),
    ("urgent.retry.90s", QueueName("tier", "urgent", "urgent", tier="90s")),
    ("urgent.retry.1m30s", QueueName("work", "urgent.retry.1m30s", "urgent.retry.1m30s")),  # we'd name it 90s
    ("urgent.shard-0.retry.5s", QueueName("tier", "urgent", "urgent.shard-0", shard=0, tier="5s")),
    ("urgent.quarantine", QueueName("quarantine", "urgent")),
    ("urgent.suspects", QueueName("suspects", "urgent")),
    ("urgent.parked", QueueName("parked", "urgent")),
    ("a.parked.retry.5s", QueueName("tier", "a.parked", "a.parked", tier="5s")),
    (".parked", QueueName("work", ".parked", ".parked")),
    ("urgent.paused", QueueName("paused", "urgent")),
    (".paused", QueueName("work", ".paused", ".paused")),
    (".quarantine", QueueName("work", ".quarantine", ".quarantine")),
    ("amqpjobs.scheduler.shop.leader", QueueName("leader", app="shop")),
    ("amqpjobs.scheduler.shop.ticks.nightly", QueueName("ticks", app="shop", schedule="nightly")),
    ("amqpjobs.scheduler.shop.running.nightly", QueueName("running", app="shop", schedule="nightly")),
    ("amqpjobs.scheduler.x", QueueName("work", "amqpjobs.scheduler.x", "amqpjobs.scheduler.x")),
    ("urgent.breaker.mail", QueueName("breaker", "urgent", job="mail")),
    ("urgent.breaker.mail.quarantine", QueueName("breaker", "urgent", job="mail.quarantine")),  # a job's name
    ("urgent.breaker-probe.mail", QueueName("breaker-probe", "urgent", job="mail")),
    ("urgent.breaker.", QueueName("work", "urgent.breaker.", "urgent.breaker.")),
]


@pytest.mark.parametrize(("name", "expected"), CASES, ids=[c[0] for c in CASES])
def test_parse_queue_name(name: str, expected: QueueName) -> None:
    assert parse_queue_name(name) == expected


@pytest.mark.parametrize("shard", [None, 0, 7])
def test_round_trip_of_the_writers(shard: int | None) -> None:
    work = naming.work_queue_name("jobs", shard)
    assert parse_queue_name(work).job_queue == "jobs"
    assert parse_queue_name(work).shard == shard
    tier = parse_queue_name(naming.tier_queue_name(work, 90))
    assert (tier.kind, tier.job_queue, tier.work_queue, tier.shard) == ("tier", "jobs", work, shard)
    assert parse_queue_name(naming.quarantine_queue_name("jobs")) == QueueName("quarantine", "jobs")
    assert parse_queue_name(naming.suspects_queue_name("jobs")) == QueueName("suspects", "jobs")
    assert parse_queue_name(naming.parked_queue_name("jobs")) == QueueName("parked", "jobs")
    assert parse_queue_name(naming.paused_flag_name("jobs")) == QueueName("paused", "jobs")
    assert parse_queue_name(cron.leader_queue("app")).kind == "leader"
    assert parse_queue_name(cron.tick_queue("app", "s")) == QueueName("ticks", app="app", schedule="s")
    assert parse_queue_name(cron.running_queue("app", "s")) == QueueName("running", app="app", schedule="s")


def test_the_addressable_name_rule_is_pamqps():
    """Our copy of pamqp's name rule (topology/ does not import the client library) is pamqp's own."""
    from pamqp import commands, constants

    assert {k: r.pattern for k, r in constants.DOMAIN_REGEX.items()} == {
        "exchange-name": "^" + naming.ADDRESSABLE_NAME.pattern + "$",
        "queue-name": "^" + naming.ADDRESSABLE_NAME.pattern + "$",
    }
    with pytest.raises(ValueError, match="Max length exceeded for exchange"):
        commands.Exchange.Declare(exchange="x" * (naming.MAX_CLIENT_NAME["exchange"] + 1))
    commands.Exchange.Declare(exchange="x" * naming.MAX_CLIENT_NAME["exchange"])
    with pytest.raises(ValueError, match="Max length exceeded for queue"):
        commands.Queue.Declare(queue="x" * (naming.MAX_CLIENT_NAME["queue"] + 1))


@pytest.mark.parametrize(("name", "kind", "word"), [
    ('odd<b>&"é%2F..x', "queue", "- _ . : @ # , / +"), ("ok.name-1", "queue", None), ("x" * 128, "exchange", "127"),
    ("x" * 128, "queue", None), ("", "queue", None)])  # fmt: skip
def test_unaddressable_problem(name: str, kind: naming.NameKind, word: str | None):
    problem = naming.unaddressable_problem(name, kind)
    if word is None:
        assert problem is None
    else:
        assert problem is not None
        assert word in problem
        assert repr(name)[:40] in problem
