"""Handler deadlines (amqpjobs.runtime.deadlines): cancelled at their own time, ended as asyncio.timeout ends."""

from __future__ import annotations

import asyncio
import contextlib

from amqpjobs.runtime.deadlines import Deadlines


async def _run(deadlines: Deadlines, limit: float, sleep: float) -> tuple[str, float, int]:
    """Sleep under a deadline: (how it ended, when (loop time), the task's pending cancellations after)."""
    loop = asyncio.get_running_loop()
    deadline = deadlines.start(limit)
    task = asyncio.current_task()
    assert task is not None
    try:
        await asyncio.sleep(sleep)
    except asyncio.CancelledError as exc:
        how = "timeout" if deadline.end(exc) else "cancelled"
        return how, loop.time(), task.cancelling()
    deadline.end(None)
    return ("returned late" if deadline.expired else "returned"), loop.time(), task.cancelling()


async def test_a_run_past_its_limit_is_cancelled_at_its_own_deadline() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    first = asyncio.ensure_future(_run(deadlines, 0.2, 0.05))  # ends in time, before the timer armed for it
    await asyncio.sleep(0.1)
    second = asyncio.ensure_future(_run(deadlines, 0.2, 5))  # due at t0 + 0.3, not at the first's t0 + 0.2
    (how1, _, left1), (how2, at2, left2) = await asyncio.gather(first, second)
    assert (how1, left1) == ("returned", 0)
    assert (how2, left2) == ("timeout", 0)  # its cancellation taken back, as asyncio.timeout does
    assert 0.29 <= at2 - t0 < 0.45


async def test_runs_of_one_limit_expire_in_turn_and_another_limit_on_its_own() -> None:
    deadlines = Deadlines()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    runs = []
    for _ in range(3):
        runs.append(asyncio.ensure_future(_run(deadlines, 0.1, 5)))
        await asyncio.sleep(0.05)
    short = asyncio.ensure_future(_run(deadlines, 0.02, 5))
    ended = await asyncio.gather(*runs, short)
    assert [how for how, _, _ in ended] == ["timeout"] * 4
    times = [round(at - t0, 2) for _, at, _ in ended]
    assert all(abs(got - want) < 0.04 for got, want in zip(times, [0.1, 0.15, 0.2, 0.17], strict=True)), times


async def test_another_cancellation_is_not_a_timeout() -> None:
    deadlines = Deadlines()

    async def run() -> tuple[bool, int]:
        deadline = deadlines.start(0.05)
        task = asyncio.current_task()
        assert task is not None
        try:
            await asyncio.sleep(0.1)  # its deadline cancels it ...
        except asyncio.CancelledError:
            try:
                await asyncio.sleep(5)  # ... and the stop cancels it again while it cleans up
            except asyncio.CancelledError as exc:
                return deadline.end(exc), task.cancelling()
        raise AssertionError("not cancelled")

    task = asyncio.ensure_future(run())
    await asyncio.sleep(0.08)
    task.cancel()
    assert await task == (False, 1)  # the stop's cancellation is still the task's


async def test_a_run_that_caught_its_cancellation_and_returned_is_expired() -> None:
    deadlines = Deadlines()

    async def run() -> tuple[bool, bool]:
        deadline = deadlines.start(0.02)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(1)
        return deadline.end(None), deadline.expired

    assert await run() == (False, True)


def test_deadlines_work_on_each_new_loop() -> None:
    deadlines = Deadlines()
    # a run in time leaves its lane's timer armed on the first loop: it must not stand in for one on the second
    assert asyncio.run(_run(deadlines, 0.05, 0.01))[0] == "returned"
    assert asyncio.run(_run(deadlines, 0.05, 1))[0] == "timeout"


def test_a_deadline_needs_a_task() -> None:
    loop = asyncio.new_event_loop()
    errors: list[str] = []

    def callback() -> None:  # on the loop, but in no task
        try:
            Deadlines().start(1.0)
        except RuntimeError as exc:
            errors.append(str(exc))
        loop.stop()

    loop.call_soon(callback)
    loop.run_forever()
    loop.close()
    assert errors == ["a deadline is for code running in a task"]
