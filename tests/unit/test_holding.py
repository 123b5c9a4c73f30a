"""Holding deliveries whose copies have nowhere to go, against a fake broker (no I/O)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection

import pytest

from amqpjobs.errors import BrokerError, MessageTooLargeError, PublishError, UnroutableError
from amqpjobs.jobs.outcome import HandBack, Quarantine, Register, RetryLater
from amqpjobs.runtime.holding import BrokerObject, Holding, needs_of
from amqpjobs.topology.models import JobQueueSpec, Topology

QUEUE = BrokerObject("queue", "work.quarantine")
EXCHANGE = BrokerObject("exchange", "work.quarantine")
TIER = BrokerObject("queue", "work.retry.1s")
QUARANTINE = frozenset({QUEUE, EXCHANGE})


class FakeBroker:
    """What exists, and a log of the worker's pauses and resumes."""

    def __init__(self, missing: set[BrokerObject] | None = None) -> None:
        self.missing = set(missing or ())
        self.switches: list[str] = []
        self.published = 0

    async def probe(self, objects: Collection[BrokerObject]) -> set[BrokerObject]:
        return set(objects) & self.missing

    async def pause(self, queue: str) -> None:
        self.switches.append(f"pause {queue}")

    async def resume(self, queue: str) -> None:
        self.switches.append(f"resume {queue}")

    def publisher(
        self, needs: frozenset[BrokerObject], fails: list[Exception] | None = None
    ) -> Callable[[], Awaitable[None]]:
        async def publish() -> None:
            if fails:
                raise fails.pop(0)
            if needs & self.missing:
                raise UnroutableError("unroutable")
            self.published += 1

        return publish

    def holding(self) -> Holding:
        return Holding(self.probe, self.pause, self.resume, interval=0.01)


def is_open() -> bool:
    return True


async def test_nothing_missing_publishes_again_at_once_without_pausing():
    broker = FakeBroker()
    holding = broker.holding()
    publish = broker.publisher(QUARANTINE)
    assert await holding.settle("work", QUARANTINE, publish, BrokerError("channel closed"), is_open) == "published"
    assert broker.published == 1
    assert broker.switches == []
    assert holding.summary == ""


async def test_concurrent_holds_pause_once_log_once_and_resume_once_the_object_is_back(
    caplog: pytest.LogCaptureFixture,
):
    broker = FakeBroker({QUEUE})
    holding = broker.holding()
    settling = [
        asyncio.create_task(
            holding.settle("work", QUARANTINE, broker.publisher(QUARANTINE), UnroutableError("x"), is_open)
        )
        for _ in range(4)
    ]
    await asyncio.sleep(0.05)
    assert holding.count == 4
    assert holding.holds("work")
    assert holding.summary.startswith("holding 4 delivery(ies) unacked")
    assert "queue work.quarantine missing; apply the topology (amqpjobs topology apply)" in holding.summary
    assert [r.levelno for r in caplog.records if "does not exist" in r.getMessage()] == [logging.ERROR]
    assert broker.published == 0
    broker.missing.clear()
    assert await asyncio.gather(*settling) == ["published"] * 4
    assert broker.switches == ["pause work", "resume work"]
    assert holding.summary == ""
    assert holding.count == 0


async def test_a_closed_channel_ends_the_hold_without_publishing():
    broker = FakeBroker({EXCHANGE})
    holding = broker.holding()
    channel_open = True
    task = asyncio.create_task(
        holding.settle("work", QUARANTINE, broker.publisher(QUARANTINE), PublishError("404"), lambda: channel_open)
    )
    await asyncio.sleep(0.03)
    channel_open = False
    assert await task == "gone"
    assert broker.published == 0
    assert broker.switches == ["pause work", "resume work"]


async def test_a_copy_too_large_is_refused_only_once_the_quarantine_exists():
    broker = FakeBroker({QUEUE})
    holding = broker.holding()
    task = asyncio.create_task(
        holding.settle("work", QUARANTINE, broker.publisher(QUARANTINE), MessageTooLargeError("big"), is_open)
    )
    await asyncio.sleep(0.05)
    assert not task.done()
    broker.missing.clear()
    assert await task == "refused"
    assert broker.published == 0


async def test_a_publish_failing_while_everything_exists_is_held_and_tried_every_round():
    broker = FakeBroker()
    holding = broker.holding()
    fails: list[Exception] = [PublishError("no confirm"), PublishError("no confirm"), PublishError("no confirm")]
    task = asyncio.create_task(
        holding.settle("work", QUARANTINE, broker.publisher(QUARANTINE, fails), PublishError("nack"), is_open)
    )
    await asyncio.sleep(0.005)
    assert "their copies can't be published (PublishError: no confirm)" in holding.summary
    assert await task == "published"
    assert fails == []


async def test_cancelled_holds_resume_their_queue_through_the_callback():
    broker = FakeBroker({TIER})
    holding = broker.holding()
    task = asyncio.create_task(
        holding.settle("work", frozenset({TIER}), broker.publisher(frozenset({TIER})), UnroutableError("x"), is_open)
    )
    await asyncio.sleep(0.03)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await holding.close()
    assert broker.switches == ["pause work", "resume work"]
    assert holding.summary == ""


def test_needs_of_each_decision():
    layout = Topology(job_queues=(JobQueueSpec(name="work", exchange="jobs", retry_tiers=("1s", "5s")),)).layout("work")
    assert needs_of(layout, "work", Quarantine("rejected")) == QUARANTINE
    assert needs_of(layout, "work", RetryLater(next_attempt=3, tier=1, delay=5.0)) == QUARANTINE | {
        BrokerObject("queue", "work.retry.5s")
    }
    # unstarted copies too: one that can never go is rejected into the quarantine, never requeued
    assert needs_of(layout, "work", Register(2)) == QUARANTINE | {BrokerObject("queue", "work.suspects")}
    assert needs_of(layout, "work", HandBack()) == QUARANTINE | {BrokerObject("queue", "work")}


async def test_a_copy_too_large_is_refused_only_once_the_quarantine_binding_is_made():
    """H1: the binding of the quarantine queue to its exchange can't be made (refused twice): held, not
    refused (a reject would be dead-lettered nowhere); refused once the bind goes through."""
    broker = FakeBroker()
    binds: list[tuple[str, str]] = []
    refusals = [BrokerError("ACCESS_REFUSED - write access to queue 'work.quarantine' refused")] * 2

    async def bind(queue: str, exchange: str) -> None:
        binds.append((queue, exchange))
        if refusals:
            raise refusals.pop()

    holding = Holding(broker.probe, broker.pause, broker.resume, interval=0.01, bind=bind)
    route = ("work.quarantine", "work.quarantine.x")
    task = asyncio.create_task(
        holding.settle("work", QUARANTINE, broker.publisher(QUARANTINE), MessageTooLargeError("big"), is_open, route)
    )
    await asyncio.sleep(0.005)
    assert holding.summary == (
        "holding 1 delivery(ies) unacked, not consuming their queues (work: 1): their copies can't be published "
        "(AmqpJobsError: work.quarantine can't be bound to work.quarantine.x, so a reject would be dropped: "
        "ACCESS_REFUSED - write access to queue 'work.quarantine' refused)"
    )
    assert await task == "refused"
    assert binds == [route] * 3
    assert broker.published == 0
    assert broker.switches == ["pause work", "resume work"]
    assert holding.summary == ""


async def test_without_a_bind_a_copy_too_large_is_refused_at_once():
    broker = FakeBroker()
    holding = broker.holding()
    route = ("work.quarantine", "work.quarantine")
    assert await holding.settle("work", QUARANTINE, broker.publisher(QUARANTINE), MessageTooLargeError("big"),
                                is_open, route) == "refused"  # fmt: skip
