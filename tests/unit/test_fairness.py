from __future__ import annotations

import asyncio

import pytest

from amqpjobs.jobs.fairness import MAX_BACKOFF, ShardTurns, jain_index, lease_sizes, resize
from amqpjobs.jobs.slots import RunningSlots


def test_turns_go_round_robin_whatever_the_depth_of_each_shard() -> None:
    turns = ShardTurns(3)
    assert [turns.next(0.0) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_a_shard_with_a_take_under_way_passes_its_turn_to_the_next() -> None:
    turns = ShardTurns(3)
    assert turns.next(0.0, skip={0}) == 1
    assert turns.next(0.0, skip={2}) == 0  # the turn went on past 1; 2 is busy: back to 0
    assert turns.next(0.0, skip={0, 1, 2}) is None


def test_an_empty_shard_is_skipped_for_a_backoff_that_doubles_up_to_the_polling_period() -> None:
    turns = ShardTurns(2)
    backoffs = [turns.found_empty(0, 0.0) for _ in range(10)]
    assert backoffs[:4] == [0.001, 0.002, 0.004, 0.008]
    assert backoffs[-1] == MAX_BACKOFF == 0.1
    assert [turns.next(0.05) for _ in range(3)] == [1, 1, 1]  # shard 0 waits until 0.1
    assert turns.wake_at() == 0.0  # shard 1 never waits
    assert turns.wake_at(skip={1}) == pytest.approx(0.1)
    assert turns.next(0.1) == 0
    turns.found(0)  # it had a job: no backoff any more
    assert turns.found_empty(0, 1.0) == 0.001


def test_hold_and_reset() -> None:
    turns = ShardTurns(2)
    turns.hold(1, until=5.0)
    assert [turns.next(1.0) for _ in range(2)] == [0, 0]
    turns.reset()
    assert {turns.next(1.0), turns.next(1.0)} == {0, 1}


@pytest.mark.parametrize(
    ("slots", "shards", "busy", "sizes"),
    [
        (16, 8, range(8), dict.fromkeys(range(8), 2)),  # every shard busy: all slots leased
        (16, 8, {3}, {3: 15}),  # one busy shard: one slot stays for turns (finding new work)
        (16, 8, range(7), dict.fromkeys(range(7), 2)),  # 14 leased, 2 for turns
        (4, 8, {0, 1, 2}, {0: 1, 1: 1, 2: 1}),  # the fourth slot goes round by turns
        (4, 8, range(5), {}),  # fewer slots than busy shards: every job by turns
        (1, 4, {0}, {}),  # one slot: by turns
        (16, 8, set(), {}),
    ],
)
def test_lease_sizes_are_an_equal_share_of_the_slots(slots, shards, busy, sizes) -> None:
    assert lease_sizes(slots, shards, set(busy)) == sizes
    assert sum(lease_sizes(slots, shards, set(busy)).values()) <= slots


@pytest.mark.parametrize(
    ("current", "target", "replace"),
    [(3, 1, True), (3, 0, True), (2, 3, False), (2, 4, True), (7, 7, False), (0, 2, True), (0, 0, False)],
)
def test_a_lease_shrinks_at_once_and_grows_once_it_would_double(current, target, replace) -> None:
    assert resize(current, target) is replace


@pytest.mark.parametrize(("values", "index"), [([1, 1, 1], 1.0), ([3, 0, 0], 1 / 3), ([2, 1], 0.9), ([], 1.0)])
def test_jain_index(values: list[float], index: float) -> None:
    assert jain_index(values) == pytest.approx(index)


async def test_running_slots_grant_in_order_and_evict_waiters() -> None:
    slots = RunningSlots(1)
    assert await slots.start()
    assert not await slots.start(may_wait=False)  # full, and told not to wait
    first = asyncio.create_task(slots.start())
    second = asyncio.create_task(slots.start())
    await asyncio.sleep(0)
    slots.end()  # the slot passes to the first waiter, not back to the free ones
    assert await first is True
    assert slots.running == 1
    assert slots.evict() == 1
    assert await second is False
    slots.end()
    assert slots.running == 0
