"""The stop's three lines agree: a delivery held but never started is no running job (no broker)."""

from __future__ import annotations

import asyncio
from typing import Any

from amqpjobs.runtime.draining import Draining


async def _tasks(draining: Draining, running: int, held: int, held_running: int) -> list[asyncio.Task[Any]]:
    """Tasks that stay pending: ``running`` handlers started, ``held`` held never started, ``held_running`` both."""
    release = asyncio.Event()

    async def start(ran: bool, holds: bool) -> None:
        if ran:
            draining.started()
        if holds:
            with draining.holding(*(("retry", "work.tier-1") if ran else ("quarantine", "work.quarantine"))):
                await release.wait()
        await release.wait()

    tasks = [asyncio.create_task(start(True, False)) for _ in range(running)]
    tasks += [asyncio.create_task(start(False, True)) for _ in range(held)]
    tasks += [asyncio.create_task(start(True, True)) for _ in range(held_running)]
    await asyncio.sleep(0)
    return tasks


async def _stop(running: int, held: int, held_running: int, grace: float = 30) -> list[str]:
    """The lines when everything is still there after the grace (exit 1)."""
    draining = Draining()
    tasks = await _tasks(draining, running, held, held_running)
    lines = [draining.begin(0, grace)]
    still = set(tasks)
    lines += draining.grace_lines(still, set(tasks), 0)
    lines.append(draining.stopped_line(still, (0, 0), 0, 1))
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return lines


async def test_one_held_delivery_never_started_is_named_apart_in_each_line() -> None:
    assert await _stop(0, 1, 0, grace=1) == [
        "draining: no job in flight; 1 held delivery (never started: its copy can't be published yet) waits up to "
        "the grace of 1s",
        "1 held delivery (never started) still held after the grace period; it returns to its queue (redelivered)",
        "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered), 1 held delivery returned to its "
        "queue unstarted (redelivered); exit 1",
    ]


async def test_running_jobs_and_held_deliveries_are_counted_each_once() -> None:
    """A held delivery whose handler ran (its retry copy can't go) is no running job, nor one never started."""
    assert await _stop(2, 2, 1) == [
        "draining 2 in-flight job(s), grace 30s; 1 held delivery (ran; its outcome 'retry' waits for work.tier-1) "
        "waits up to the grace of 30s; 2 held deliveries (never started: their copies can't be published yet) wait "
        "up to the grace of 30s",
        "2 job(s) still running after the grace period; they will be redelivered",
        "1 held delivery (ran; its outcome 'retry' waits for work.tier-1) still held after the grace period; it "
        "returns to its queue (redelivered)",
        "2 held deliveries (never started) still held after the grace period; they return to their queues "
        "(redelivered)",
        "worker stopped: 0 in-flight job(s) finished, 2 abandoned (redelivered), 1 held delivery (ran) returned to "
        "its queue (redelivered), 2 held deliveries returned to their queues unstarted (redelivered); exit 1",
    ]


async def test_held_deliveries_that_ran_are_named_with_each_outcome_they_wait_to_carry_out() -> None:
    """Only held deliveries whose handler ran: no job in flight; the plural names each pending outcome."""
    assert await _stop(0, 0, 2, grace=5) == [
        "draining: no job in flight; 2 held deliveries (ran; their outcomes wait: 2 'retry' for work.tier-1) wait "
        "up to the grace of 5s",
        "2 held deliveries (ran; their outcomes wait: 2 'retry' for work.tier-1) still held after the grace "
        "period; they return to their queues (redelivered)",
        "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered), 2 held deliveries (ran) returned "
        "to their queues (redelivered); exit 1",
    ]


async def test_an_idle_stop_says_no_job_in_flight() -> None:
    draining = Draining()
    assert draining.begin(0, 10) == "draining: no job in flight"
    assert draining.grace_lines(set(), set(), 0) == []
    assert draining.stopped_line(set(), (0, 0), 0, 0) == (
        "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered); exit 0"
    )
