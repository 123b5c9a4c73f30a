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
    draining.grace_over(still, set(tasks))
    lines += draining.grace_lines(0)
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
        "returns to its queue (redelivered: its outcome could not be kept, so it runs again)",
        "2 held deliveries (never started) still held after the grace period; they return to their queues "
        "(redelivered)",
        "worker stopped: 0 in-flight job(s) finished, 2 abandoned (redelivered), 1 held delivery (ran) returned to "
        "its queue (redelivered: its outcome not kept, run again), 2 held deliveries returned to their queues "
        "unstarted (redelivered); exit 1",
    ]


async def test_held_deliveries_that_ran_are_named_with_each_outcome_they_wait_to_carry_out() -> None:
    """Only held deliveries whose handler ran: no job in flight; the plural names each pending outcome."""
    assert await _stop(0, 0, 2, grace=5) == [
        "draining: no job in flight; 2 held deliveries (ran; their outcomes wait: 2 'retry' for work.tier-1) wait "
        "up to the grace of 5s",
        "2 held deliveries (ran; their outcomes wait: 2 'retry' for work.tier-1) still held after the grace "
        "period; they return to their queues (redelivered: their outcomes could not be kept, so they run again)",
        "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered), 2 held deliveries (ran) returned "
        "to their queues (redelivered: their outcomes not kept, run again); exit 1",
    ]


async def test_held_deliveries_that_ran_are_counted_by_whether_each_kept_its_decision() -> None:
    """Past the grace each keeps its decision in a marked copy (kept_decisions) or could not: counted apart;
    one carrying out a decision an earlier run kept is one that ran (not 'never started')."""
    draining = Draining()
    release = asyncio.Event()

    async def held(outcome: tuple[str, str], decided: bool) -> None:
        if decided:
            draining.carried()
        else:
            draining.started()
        with draining.holding(*outcome):
            await release.wait()

    quarantine, retry = ("quarantine", "work.quarantine"), ("retry", "work.tier-1")
    tasks = [asyncio.create_task(held(o, d)) for o, d in ((quarantine, False), (quarantine, True), (retry, False))]
    await asyncio.sleep(0)
    assert draining.begin(0, 5) == (
        "draining: no job in flight; 3 held deliveries (ran; their outcomes wait: 2 'quarantine' for "
        "work.quarantine, 1 'retry' for work.tier-1) wait up to the grace of 5s"
    )
    still = set(tasks)
    draining.grace_over(still, still)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    draining.kept(tasks[0], True)
    draining.kept(tasks[1], True)
    draining.kept(tasks[2], False)
    assert draining.grace_lines(0) == [
        "2 held deliveries (ran; their outcomes wait: 2 'quarantine' for work.quarantine) still held after the "
        "grace period; they return to their queues with their outcomes kept (not run again)",
        "1 held delivery (ran; its outcome 'retry' waits for work.tier-1) still held after the grace period; it "
        "returns to its queue (redelivered: its outcome could not be kept, so it runs again)",
    ]
    assert draining.stopped_line(still, (0, 0), 0, 1) == (
        "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered), 2 held deliveries (ran) returned "
        "to their queues with their outcomes kept (not run again), 1 held delivery (ran) returned to its queue "
        "(redelivered: its outcome not kept, run again); exit 1"
    )


async def test_an_idle_stop_says_no_job_in_flight() -> None:
    draining = Draining()
    assert draining.begin(0, 10) == "draining: no job in flight"
    draining.grace_over(set(), set())
    assert draining.grace_lines(0) == []
    assert draining.stopped_line(set(), (0, 0), 0, 0) == (
        "worker stopped: 0 in-flight job(s) finished, 0 abandoned (redelivered); exit 0"
    )


async def test_jobs_cancelled_at_the_grace_end_are_counted_by_what_became_of_each() -> None:
    """One ends cancelled (back to its queue), one raises and is retried, one succeeds, one goes on (its worker
    waits). Before: all four were "still running ...; they will be redelivered" and "4 abandoned (redelivered)"."""
    draining = Draining()
    release = asyncio.Event()

    async def run(after_cancel: str) -> None:
        draining.started()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            if after_cancel == "cancelled":
                raise
            if after_cancel == "goes on":
                await release.wait()
                after_cancel = "succeeded"
            draining.settled(True, after_cancel)  # its outcome, carried out

    tasks = [asyncio.create_task(run(how)) for how in ("cancelled", "retried", "succeeded", "goes on")]
    await asyncio.sleep(0)
    assert draining.begin(0, 2) == "draining 4 in-flight job(s), grace 2s"
    still = set(tasks)
    draining.grace_over(still, still)
    for task in tasks:
        task.cancel()
    _, going_on = await asyncio.wait(still, timeout=0.05)
    assert draining.grace_lines(0, going_on) == [
        "4 job(s) still running after the grace period; cancelled: 1 will be redelivered, 2 ended anyway "
        "(1 retried, 1 succeeded), 1 goes on regardless"
    ]
    assert draining.grace_lines(0) == [  # its process ends now: the one going on goes back too
        "4 job(s) still running after the grace period; cancelled: 2 will be redelivered, 2 ended anyway "
        "(1 retried, 1 succeeded)"
    ]
    assert draining.stopped_line(still, (0, 0), 0, 1) == (
        "worker stopped: 0 in-flight job(s) finished, 2 abandoned (redelivered), 2 ended after their cancellation "
        "(1 retried, 1 succeeded); exit 1"
    )
    release.set()
    await asyncio.wait(going_on)
    assert draining.stopped_line(still, (0, 0), 0, 1) == (
        "worker stopped: 0 in-flight job(s) finished, 1 abandoned (redelivered), 3 ended after their cancellation "
        "(1 retried, 2 succeeded); exit 1"
    )
    assert draining.going_on_line(1, 1.0, True) == (
        "1 async handler(s) still running 1s after their cancellation: the process ends at once, before its "
        "connection closes, so that none finishes beside its redelivery"
    )


async def _not_acked_line(jobs: int) -> str:
    """The stopped line after ``jobs`` jobs finished while stopping, none acked (their channel closed)."""
    draining = Draining()

    async def job() -> None:
        draining.started()
        await asyncio.sleep(0.01)
        draining.settled(True, "ack_uncertain")

    tasks = [asyncio.create_task(job()) for _ in range(jobs)]
    await asyncio.sleep(0)
    draining.begin(0, 5)
    await asyncio.gather(*tasks)
    return draining.stopped_line(set(), (0, 0), 0, 1)


async def test_jobs_not_acked_are_worded_in_their_number() -> None:
    # before: "1 of it not acked (their channel closed: the broker redelivers it)"
    assert await _not_acked_line(1) == (
        "worker stopped: 1 in-flight job(s) finished, 1 of them not acked (its channel closed: the broker redelivers "
        "it), 0 abandoned (redelivered); exit 1"
    )
    assert await _not_acked_line(2) == (
        "worker stopped: 2 in-flight job(s) finished, 2 of them not acked (their channel closed: the broker "
        "redelivers them), 0 abandoned (redelivered); exit 1"
    )
