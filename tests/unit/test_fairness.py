from __future__ import annotations

import asyncio

import pytest

from amqpjobs.jobs.fairness import RoundRobinGate, jain_index


async def test_gate_serves_busy_lanes_round_robin_whatever_their_depth() -> None:
    gate = RoundRobinGate(slots=1, shards=3)
    order: list[str] = []

    async def job(lane: int, name: str) -> None:
        async with gate.slot(lane):
            order.append(name)
            await asyncio.sleep(0)

    # lane 0 floods with 6 jobs, lanes 1 and 2 have 2 each, all waiting at once
    tasks = [asyncio.create_task(job(0, f"a{i}")) for i in range(6)]
    tasks += [asyncio.create_task(job(1, f"b{i}")) for i in range(2)]
    tasks += [asyncio.create_task(job(2, f"c{i}")) for i in range(2)]
    await asyncio.gather(*tasks)
    assert order == ["a0", "b0", "c0", "a1", "b1", "c1", "a2", "a3", "a4", "a5"]
    assert gate.free == 1


async def test_gate_limits_concurrency_and_survives_cancellation() -> None:
    gate = RoundRobinGate(slots=2, shards=2)
    running = 0
    peak = 0

    async def job(lane: int) -> None:
        nonlocal running, peak
        async with gate.slot(lane):
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.001)
            running -= 1

    waiter = asyncio.create_task(job(1))
    await asyncio.gather(*(job(i % 2) for i in range(20)), waiter)
    assert peak == 2
    blocked = [asyncio.create_task(gate.acquire(0)) for _ in range(3)]
    await asyncio.sleep(0)
    assert (gate.free, gate.waiting(0)) == (0, 1)
    blocked[2].cancel()
    await asyncio.gather(*blocked, return_exceptions=True)
    assert gate.waiting(0) == 0
    gate.release()
    gate.release()
    assert gate.free == 2


@pytest.mark.parametrize(("values", "index"), [([1, 1, 1], 1.0), ([3, 0, 0], 1 / 3), ([2, 1], 0.9), ([], 1.0)])
def test_jain_index(values: list[float], index: float) -> None:
    assert jain_index(values) == pytest.approx(index)
