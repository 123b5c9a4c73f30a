"""What a policy does to our queues (amqpjobs.topology.policy_effects): the rule, table-driven."""

from __future__ import annotations

from typing import Any

import pytest

from amqpjobs.topology.policy_effects import (
    QueuePolicy,
    effect,
    exchange_effect,
    from_management,
    matching,
    source_type,
)

QUARANTINE: dict[str, Any] = {"x-queue-type": "classic"}
WORK = {"x-dead-letter-exchange": "mail.quarantine", "x-queue-type": "classic"}
TIER = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "mail", "x-message-ttl": 5000}
QUORUM_WORK = {
    "x-dead-letter-exchange": "pay.quarantine", "x-dead-letter-strategy": "at-least-once",
    "x-delivery-limit": 5, "x-overflow": "reject-publish", "x-queue-type": "quorum",
}  # fmt: skip


@pytest.mark.parametrize(("queue", "qtype", "arguments", "definition", "source", "loses", "words"), [
    # the quarantine and parked queues have no dead-letter exchange: what leaves them is gone
    ("mail.quarantine", "classic", QUARANTINE, {"message-ttl": 3000}, "classic", True,
     "message-ttl 3s: a message older is dropped (the queue has no dead-letter exchange)"),
    ("mail.parked", "classic", QUARANTINE, {"message-ttl": 3000, "dead-letter-exchange": "elsewhere"}, None, True,
     "dead-lettered to exchange 'elsewhere' (the policy's, out of amqpjobs' queues)"),
    ("mail.quarantine", "classic", QUARANTINE, {"max-length": 10}, "classic", True,
     "max-length 10 (overflow drop-head): the oldest message past it is dropped"),
    ("mail.quarantine", "classic", QUARANTINE, {"max-length": 10, "overflow": "reject-publish"}, "classic", True,
     "past it the broker drops each dead-letter into it (from classic queues)"),
    ("pay.quarantine", "classic", QUARANTINE, {"max-length-bytes": 10, "overflow": "reject-publish"}, "quorum", False,
     "max-length-bytes 10 bytes (overflow reject-publish): past it enqueues are refused, and dead-letters into it "
     "wait in their quorum queue (at-least-once) until there is room"),
    # expires deletes any queue with its messages
    ("mail.retry.5s", "classic", TIER, {"expires": 60000}, None, True,
     "expires 1m: the broker deletes the queue, with every message in it"),
    ("pay", "quorum", QUORUM_WORK, {"expires": 3600000}, "quorum", True, "expires 1h"),
    # our own dead-letter exchange wins: a work queue's expired or pushed-out jobs reach its quarantine
    ("mail", "classic", WORK, {"message-ttl": 1000, "dead-letter-exchange": "elsewhere"}, "classic", False,
     "message-ttl 1s: a message older is dead-lettered into mail.quarantine (its quarantine)"),
    ("mail", "classic", WORK, {"max-length": 5}, "classic", False,
     "the oldest message past it is dead-lettered into mail.quarantine"),
    ("mail", "classic", WORK, {"max-length": 5, "overflow": "reject-publish"}, "classic", True,
     "drops each dead-letter into it"),
    ("pay", "quorum", QUORUM_WORK, {"max-length": 5}, "quorum", False,
     "max-length 5 (overflow reject-publish): past it enqueues are refused"),
    # on a quorum queue the policy's overflow wins (3.10.8, 4.3.6), and at-least-once goes with reject-publish
    ("pay", "quorum", QUORUM_WORK, {"max-length": 5, "overflow": "drop-head"}, "quorum", True,
     "max-length 5 (overflow drop-head): the oldest message past it is dead-lettered into pay.quarantine"),
    ("pay", "quorum", QUORUM_WORK, {"overflow": "drop-head"}, "quorum", True,
     "overflow drop-head: the queue's at-least-once dead-lettering falls back to at-most-once"),
    # a shorter tier, a lower delivery limit: jobs come back or are quarantined sooner, none lost
    ("mail.retry.5s", "classic", TIER, {"message-ttl": 2000}, None, False, "retries wait 2s instead of 5s"),
    ("pay", "quorum", QUORUM_WORK, {"delivery-limit": 2}, "quorum", False,
     "delivery-limit 2: a job delivered that often is dead-lettered into pay.quarantine (its quarantine), not the "
     "topology's 5"),
    ("mail.suspects", "classic", WORK, {"max-length": 3, "overflow": "reject-publish"}, None, False,
     "the copies workers publish into it are refused"),
])  # fmt: skip
def test_what_a_policy_does(
    queue: str, qtype: str, arguments: dict[str, Any], definition: dict[str, Any], source: str | None, loses: bool,
    words: str,
) -> None:  # fmt: skip
    found = effect(QueuePolicy(queue, qtype, arguments, definition, "p", None, source))
    assert found is not None
    assert found.loses is loses
    assert words in str(found), str(found)
    assert str(found).startswith(f"policy 'p' on {queue}: ")
    assert ("change the policy's pattern" in str(found)) is loses


@pytest.mark.parametrize(("queue", "qtype", "arguments", "definition"), [
    ("mail", "classic", WORK, {"queue-mode": "lazy"}),
    ("mail", "classic", WORK, {"ha-mode": "all", "overflow": "reject-publish"}),  # overflow without a limit
    ("mail", "classic", {**WORK, "x-max-length": 10, "x-overflow": "reject-publish"}, {"overflow": "drop-head"}),
    ("pay", "quorum", QUORUM_WORK, {"overflow": "reject-publish"}),
    ("mail.retry.5s", "classic", TIER, {"message-ttl": 9000}),  # the queue's lower TTL wins
    ("mail", "classic", {**WORK, "x-max-length": 10, "x-overflow": "drop-head"}, {"max-length": 100}),
    ("pay", "quorum", QUORUM_WORK, {"delivery-limit": 20}),  # 4.x's default limit: ours is lower
    ("mail", "classic", WORK, {"delivery-limit": 1}),  # classic queues have none
    ("mail", "classic", WORK, {"dead-letter-exchange": "elsewhere"}),  # ours wins
    ("mail.quarantine", "classic", QUARANTINE, {}),
])  # fmt: skip
def test_what_changes_nothing_we_rely_on(
    queue: str, qtype: str, arguments: dict[str, Any], definition: dict[str, Any]
) -> None:
    assert effect(QueuePolicy(queue, qtype, arguments, definition, "p", None, "classic")) is None


def test_an_operator_policy_is_named_with_its_own_fix() -> None:
    both = effect(QueuePolicy("mail.quarantine", "classic", QUARANTINE, {"expires": 1000}, "p", "caps"))
    assert both is not None
    assert str(both).startswith("policy 'p' and operator policy 'caps' on mail.quarantine: expires 1s")
    assert "an operator policy applies beside any policy" in str(both)
    alone = effect(QueuePolicy("mail.quarantine", "classic", QUARANTINE, {"expires": 1000}, None, "caps"))
    assert alone is not None
    assert "change the policy's pattern" not in str(alone)


def test_from_management_reads_what_the_api_lists() -> None:
    q = from_management({
        "name": "mail.quarantine", "type": "classic", "arguments": {"x-queue-type": "classic"},
        "effective_policy_definition": {"message-ttl": 5}, "policy": "p", "operator_policy": None,
    }, "classic")  # fmt: skip
    assert q == QueuePolicy("mail.quarantine", "classic", {"x-queue-type": "classic"}, {"message-ttl": 5}, "p", None,
                            "classic")  # fmt: skip


def policy(name: str, pattern: str, definition: dict[str, Any], priority: int = 0, to: str = "all") -> dict[str, Any]:
    return {"name": name, "pattern": pattern, "definition": definition, "priority": priority, "apply-to": to}


def test_matching_takes_the_highest_priority_policy_and_the_lower_operator_value() -> None:
    policies = [
        policy("low", "quarantine", {"message-ttl": 1000, "max-length": 50}),
        policy("high", r"\.quarantine$", {"max-length": 100}, priority=5),
        policy("exchanges", ".*", {"expires": 1}, priority=9, to="exchanges"),
        policy("broken", "(", {"expires": 1}, priority=9),  # Python can't read it: matches nothing
    ]
    operator = [policy("caps", ".*", {"max-length": 80, "expires": 600000})]
    q = matching("mail.quarantine", "classic", QUARANTINE, policies, operator, "classic")
    assert (q.policy, q.operator_policy) == ("high", "caps")
    assert q.definition == {"max-length": 80, "expires": 600000}
    assert q.source_type == "classic"
    assert matching("mail", "classic", WORK, policies, [], None) == QueuePolicy("mail", "classic", WORK)


def test_matching_follows_apply_to_by_queue_type() -> None:
    policies = [policy("q", ".*", {"expires": 1}, to="quorum_queues")]
    assert matching("pay", "quorum", QUORUM_WORK, policies, []).policy == "q"
    assert matching("mail", "classic", WORK, policies, []).policy is None


def test_source_type_is_the_type_of_what_dead_letters_into_a_queue() -> None:
    types = {"mail": "classic", "pay": "quorum", "exports.shard-0": "quorum", "exports.shard-1": "quorum"}
    assert source_type("mail", types) == "classic"  # its tiers
    assert source_type("pay.quarantine", types) == "quorum"  # its work queue
    assert source_type("exports.quarantine", types) == "quorum"  # its shards
    assert source_type("exports.shard-1", types) == "quorum"
    for fed_by_publishers in ("mail.retry.5s", "mail.parked", "mail.suspects"):
        assert source_type(fed_by_publishers, types) is None


def test_an_alternate_exchange_policy_on_our_exchange_is_a_note() -> None:
    found = exchange_effect("jobs", {}, "ae", {"alternate-exchange": "catch-all", "federation-upstream": "x"})
    assert found is not None
    assert not found.loses
    assert str(found).startswith("policy 'ae' on exchange jobs: alternate-exchange 'catch-all': a job no binding")
    assert exchange_effect("jobs", {"alternate-exchange": "mine"}, "ae", {"alternate-exchange": "x"}) is None
    assert exchange_effect("jobs", {}, "p", {"federation-upstream": "x"}) is None
    assert exchange_effect("jobs", {}, None, {}) is None


@pytest.mark.parametrize(("queue", "qtype", "broker", "ms", "expected"), [
    ("mail", "classic", (4, 0, 5), 3000, (True, "RabbitMQ 4.0.5")),  # shorter than a default job timeout
    ("pay", "quorum", (4, 2, 1), 3000, (True, "RabbitMQ 4.2.1")),  # 4.0-4.2: every queue type
    ("mail", "classic", None, 3000, (True, "RabbitMQ before 4.3")),  # version unknown: judged as before 4.3
    ("mail", "classic", (4, 0, 5), 7200000, (False, "consumer-timeout 2h")),  # raised: a job longer than 2h only
    ("mail.shard.1", "classic", (4, 0, 5), 3000, (True, "RabbitMQ 4.0.5")),
    ("mail", "classic", (4, 3, 6), 3000, None),  # 4.3: no timeout on classic queues
    ("pay", "quorum", (4, 3, 6), 3000, None),  # 4.3: our x-consumer-timeout per consumer wins
    ("mail.quarantine", "classic", (4, 0, 5), 3000, None),  # only work queues hold a running job's delivery
])  # fmt: skip
def test_a_consumer_timeout_policy_on_a_work_queue_runs_a_longer_job_twice_before_4_3(
    queue: str, qtype: str, broker: tuple[int, ...] | None, ms: int, expected: tuple[bool, str] | None
) -> None:
    found = effect(QueuePolicy(queue, qtype, {}, {"consumer-timeout": ms}, "short-ack", None, None, broker))
    if expected is None:
        assert found is None
        return
    assert found is not None
    assert found.loses is expected[0]
    (words,) = found.effects
    assert expected[1] in words, words
    assert "runs twice" in words, words
    assert str(found).startswith(f"policy 'short-ack' on {queue}: consumer-timeout "), str(found)
